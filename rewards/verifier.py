"""Exact verifiers: the completion's answer must equal the reference answer."""
from __future__ import annotations

from data_modules.tasks.base import Example
from rewards.base import RewardSource


class ExactMatchVerifier(RewardSource):
    """1.0 if the completion (whitespace-stripped, up to the first newline) equals the reference
    answer, else 0.0. Exact for the arithmetic task, whose answers are canonical integers."""

    version = "1"

    def __init__(self, name: str):
        self.name = name

    def score(self, prompts: list[str], completions: list[str], examples: list[Example]) -> list[float | None]:
        out = []
        for completion, ex in zip(completions, examples):
            text = completion.strip().split("\n", 1)[0].strip()
            out.append(1.0 if text == ex.answer.strip() else 0.0)
        return out
