"""Synthetic preference pairs, so every preference algorithm runs out of the box on the embedded task.

    arithmetic_pairs   chosen = the correct sum, rejected = a plausible wrong one: the slips of column
                       addition (one unit or one ten off)
    checkpoint_pairs   pairs from an older checkpoint's own samples, ranked by the exact verifier:
                       rejected = one of its wrong answers, chosen = one of its right answers (or the
                       reference answer when it had none); works for any task with reference answers

Both return (train pairs from task.train prompts, held-out pairs from task.heldout prompts). Held-out
pairs use a fixed seed, so preference accuracies compare across run seeds.
"""
from __future__ import annotations

import random
import re
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from data_modules.experience import Provenance
from data_modules.preferences import PreferenceRecord
from generators.base import completion_texts, stop_ids
from tasks.base import Example, Task, encode_completion, encode_example

SUM = re.compile(r"^\s*(\d+)\s*\+\s*(\d+)\s*=\s*$")
HELDOUT_SEED = 0


def plausible_wrong(a: int, b: int, rng: random.Random) -> int:
    """A wrong sum a learner could write: one unit or one ten off (s ± 1, s ± 10). These are the slips
    a half-trained model makes: 107 of the 146 greedy mistakes of the quickstart's SFT policy on the
    held-out sums were of these kinds (the model rates them ~6 and ~11 nats below the right answer,
    while a dropped carry or reversed digits sit at ~20 and ~40 and teach little)."""
    s = a + b
    return rng.choice([c for c in (s - 10, s - 1, s + 1, s + 10) if c >= 0])


def _operands(task: Task, ex: Example) -> tuple[int, int]:
    m = SUM.match(ex.prompt)
    if not m:
        raise ValueError(f"synthetic arithmetic pairs need the arithmetic task ('a+b=' prompts); task "
                         f"{task.name!r} has prompt {ex.prompt!r}: give data.path (a preference file) "
                         f"or use data=checkpoint_preferences")
    return int(m.group(1)), int(m.group(2))


def _pair(tokenizer, task, ex, chosen: str, rejected: str, prov: Provenance, gid: int,
          chosen_ids: list[int] | None = None, rejected_ids: list[int] | None = None) -> PreferenceRecord:
    return PreferenceRecord(
        prompt_ids=encode_example(tokenizer, ex, task.chat),
        chosen_ids=chosen_ids or encode_completion(tokenizer, chosen),
        rejected_ids=rejected_ids or encode_completion(tokenizer, rejected),
        provenance=prov, group_id=gid, prompt_text=ex.prompt, chosen_text=chosen, rejected_text=rejected,
        answer=ex.answer)


def _train_indices(task: Task, num_pairs: int | None, seed: int) -> list[int]:
    """Seeded training prompts: `num_pairs` of them (cycling if more than the task has), or each once."""
    order = list(range(len(task.train)))
    random.Random(seed).shuffle(order)
    return [order[k % len(order)] for k in range(len(order) if num_pairs is None else num_pairs)]


def arithmetic_pairs(task: Task, tokenizer: PreTrainedTokenizerBase, num_pairs: int | None, seed: int
                     ) -> tuple[list[PreferenceRecord], list[PreferenceRecord]]:
    """`num_pairs` training pairs on seeded task.train prompts (None: one per prompt); one held-out pair
    per task.heldout prompt."""
    def make(split, examples, indices, rng):
        out = []
        for gid, i in enumerate(indices):
            ex = examples[i]
            a, b = _operands(task, ex)
            prov = Provenance(source="synthetic", created_step=0, generator="plausible_wrong",
                              origin=f"{task.name}:{split}:{i}")
            out.append(_pair(tokenizer, task, ex, ex.answer, str(plausible_wrong(a, b, rng)), prov, gid))
        return out

    train = make("train", task.train, _train_indices(task, num_pairs, seed), random.Random(seed))
    heldout = make("heldout", task.heldout, range(len(task.heldout)), random.Random(HELDOUT_SEED))
    return train, heldout


def checkpoint_pairs(task: Task, tokenizer: PreTrainedTokenizerBase, num_pairs: int | None, seed: int,
                     checkpoint: str, samples_per_prompt: int, temperature: float, max_new_tokens: int,
                     batch_size: int, verifier) -> tuple[list[PreferenceRecord], list[PreferenceRecord]]:
    """Sample `samples_per_prompt` completions per prompt from the model saved at `checkpoint` (an older
    policy, e.g. `<run dir>/policy`), score them with `verifier` (a reward source, `data.synthetic.verifier`:
    the exact verifier by default), and pair a right answer (score 1) with a wrong one (score 0). Prompts
    whose samples are all right give no pair (the count is printed)."""
    import torch
    from transformers import AutoModelForCausalLM

    from generators.hf import HFGenerator

    if not Path(checkpoint).is_dir():
        raise FileNotFoundError(f"data.synthetic.checkpoint={checkpoint!r}: no such local directory")
    model = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True)
    generator = HFGenerator(max_new_tokens, temperature, top_p=1.0, batch_size=batch_size)

    def make(split, examples, indices, gen_seed):
        torch.manual_seed(gen_seed)
        picked = [examples[i] for i in indices]
        prompts = [encode_example(tokenizer, ex, task.chat) for ex in picked for _ in range(samples_per_prompt)]
        out = generator.sample(model, tokenizer, prompts)
        texts = completion_texts(tokenizer, out.completions, stop_ids(model, tokenizer))
        scores = verifier.score([], texts, [ex for ex in picked for _ in range(samples_per_prompt)])
        pairs = []
        for gid, (i, ex) in enumerate(zip(indices, picked)):
            span = range(gid * samples_per_prompt, (gid + 1) * samples_per_prompt)
            right = [k for k in span if scores[k] == 1.0]
            wrong = [k for k in span if scores[k] == 0.0 and texts[k].strip()]
            if not wrong:
                continue
            prov = Provenance(source="external_model", created_step=0, generator=generator.name,
                              sampling=generator.sampling, reward_source=verifier.name,
                              reward_version=verifier.version, origin=f"{checkpoint}:{task.name}:{split}:{i}")
            chosen_ids = out.completions[right[0]] if right else None
            chosen = texts[right[0]] if right else ex.answer
            pairs.append(_pair(tokenizer, task, ex, chosen, texts[wrong[0]], prov, gid,
                               chosen_ids=chosen_ids, rejected_ids=out.completions[wrong[0]]))
        print(f"[data] {checkpoint}: {len(pairs)} {split} pairs from {len(picked)} prompts "
              f"({len(picked) - len(pairs)} had no wrong sample)", flush=True)
        return pairs

    with torch.random.fork_rng(devices=[]):
        train = make("train", task.train, _train_indices(task, num_pairs, seed), seed)
        heldout = make("heldout", task.heldout, list(range(len(task.heldout))), HELDOUT_SEED)
    return train, heldout
