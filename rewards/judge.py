"""An LLM judge: a local model, through the same generator seam as the policy (greedy), reads a prompt
built from a template and answers with a score; a parser turns the answer into a float, or None (abstain)
when it does not parse. Identical (prompt, completion, answer) triples are scored once (LRU cache)."""
from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from typing import Callable

from generators.base import completion_texts, stop_ids
from rewards.base import RewardSource
from rewards.parsing import head
from tasks.base import encode_prompt


def parse_score(text: str, pattern: str, low: float, high: float) -> float | None:
    """The first match of `pattern` (its first group, else the whole match) as a number in [low, high],
    rescaled to [0, 1]; None (abstain) if nothing matches or the number is out of range. Only the first
    MAX_PARSED_CHARS characters are searched; `pattern` (the config's) should not backtrack (the default,
    a number, does not)."""
    m = re.search(pattern, head(text))
    if m is None:
        return None
    try:
        value = float(m.group(1) if m.groups() else m.group(0))
    except ValueError:
        return None
    if not low <= value <= high:
        return None
    return (value - low) / (high - low)


class JudgeReward(RewardSource):
    """model: a (model, tokenizer) pair from a model node (models.tiny.build_tiny, models.hf.load_hf);
    generator: an engine with `sample(model, tokenizer, prompt_ids, greedy=True)`; template: text with
    {prompt}, {completion} and optionally {answer}; parser: text → float | None."""

    def __init__(self, name: str, model, generator, template: str, parser: Callable[[str], float | None],
                 chat: bool, cache_size: int, device: str | None, timeout_s: float):
        self.name, self.generator, self.template, self.parser = name, generator, template, parser
        self.chat, self.cache_size, self.timeout_s = chat, cache_size, timeout_s
        self.model, self.tokenizer = model
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        try:
            template.format(prompt="", completion="", answer="")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"reward.template: use only {{prompt}}, {{completion}}, {{answer}} ({e!r})") from None
        self.version = "1:" + hashlib.sha1(template.encode()).hexdigest()[:8]
        self.pinned = device is not None
        self.model.to(device or "cpu")
        self.cache: OrderedDict[tuple, float | None] = OrderedDict()
        self.counts = {"calls": 0, "cache_hits": 0, "unparsed": 0}
        self.last_replies: list[str] = []

    def to(self, device):
        if not self.pinned:
            self.model.to(device)
        return self

    def score(self, prompts, completions, examples) -> list[float | None]:
        keys = [(p, c, ex.answer) for p, c, ex in zip(prompts, completions, examples)]
        todo = list(dict.fromkeys(k for k in keys if k not in self.cache))  # unique, in order
        self.counts["cache_hits"] += len(keys) - len(todo)
        if todo:
            texts = [self.template.format(prompt=p, completion=c, answer=a) for p, c, a in todo]
            ids = [encode_prompt(self.tokenizer, t, self.chat) for t in texts]
            out = self.generator.sample(self.model, self.tokenizer, ids, greedy=True)
            self.last_replies = completion_texts(self.tokenizer, out.completions,
                                                 stop_ids(self.model, self.tokenizer))
            self.counts["calls"] += len(todo)
            for key, reply in zip(todo, self.last_replies):
                value = self.parser(reply)
                self.counts["unparsed"] += value is None
                self.cache[key] = value
        scores = []
        for k in keys:
            self.cache.move_to_end(k)
            scores.append(self.cache[k])
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return scores

    def stats(self) -> dict:
        return {f"judge/{k}": v for k, v in self.counts.items()}
