"""A learned reward model: any local sequence-classification checkpoint with one output (a Bradley-Terry
RM from algorithm=reward_model, or AutoModelForSequenceClassification.save_pretrained + its tokenizer).

Texts are re-tokenized with the RM's OWN tokenizer (the policy's ids are never fed to it); scoring is
batched, without gradients, on the policy's device (the regenerate callback calls `to(device)`) unless
`device` pins one. The score is the raw scalar head output.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rewards.base import RewardSource


def rm_version(path: Path) -> str:
    """Directory name + a digest of its files' names, sizes and mtimes (cheap for multi-GB weights)."""
    files = sorted(p for p in path.iterdir() if p.is_file())
    stamp = ";".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    return f"{path.name}@{hashlib.sha1(stamp.encode()).hexdigest()[:10]}"


def load_reward_model(path: Path):
    """(model, tokenizer) from `path`; the model must have a single output (num_labels == 1)."""
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"reward.path={str(path)!r}: no model there (no config.json). Point it at a directory saved with "
            "save_pretrained (a sequence-classification model with num_labels=1 and its tokenizer), e.g. the "
            "output of algorithm=reward_model, or set reward.build to train one (see experiment=rm_vs_gold).")
    model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if model.config.num_labels != 1:
        raise ValueError(f"reward.path={str(path)!r}: num_labels={model.config.num_labels}; a reward model "
                         "has one scalar output (num_labels=1)")
    if tokenizer.pad_token is None:  # pooling needs a pad id; eos is a safe stand-in with right padding
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "right"
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tokenizer


class RewardModelSource(RewardSource):
    """score = RM(template.format(prompt=..., completion=...)); `build(path)` is called first if set and
    `path` holds no model yet (how experiment=rm_vs_gold makes its RM)."""

    def __init__(self, name: str, path: str | None, template: str, batch_size: int, max_length: int,
                 device: str | None, timeout_s: float, build: Callable[[str], object] | None = None):
        if not path:
            raise ValueError("reward.path is null: point it at a reward-model directory (see docs/rewards.md)")
        self.name, self.path, self.template = name, Path(path), template
        self.batch_size, self.max_length, self.timeout_s = batch_size, max_length, timeout_s
        template.format(prompt="", completion="")  # a bad placeholder fails here, not mid-run
        if build is not None and not (self.path / "config.json").is_file():
            print(f"[reward_model] no model at {self.path}: building one ({getattr(build, 'func', build)})")
            build(str(self.path))
        self.model, self.tokenizer = load_reward_model(self.path)
        self.version = rm_version(self.path)
        self.pinned = device is not None
        self.model.to(device or "cpu")

    def to(self, device):
        if not self.pinned:
            self.model.to(device)
        return self

    @torch.no_grad()
    def score(self, prompts, completions, examples) -> list[float]:
        texts = [self.template.format(prompt=p, completion=c) for p, c in zip(prompts, completions)]
        device = next(self.model.parameters()).device
        out: list[float] = []
        for lo in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(texts[lo : lo + self.batch_size], return_tensors="pt", padding=True,
                                 truncation=True, max_length=self.max_length).to(device)
            out += self.model(**enc).logits[:, 0].float().cpu().tolist()
        return out

    def stats(self) -> dict:
        metrics = self.path / "rm_metrics.json"
        if not metrics.is_file():
            return {}
        import json
        return {f"reward_model/{k}": v for k, v in json.loads(metrics.read_text()).items()}
