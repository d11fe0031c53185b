"""The reward-source contract and the guard that keeps a failing source from costing the run."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from data_modules.tasks.base import Example


class RewardSource:
    """score(prompts, completions, examples) → one float or None (abstain) per sample."""

    name: str = "reward"
    version: str = "0"

    def score(self, prompts: list[str], completions: list[str], examples: list[Example]) -> list[float | None]:
        raise NotImplementedError


@dataclass
class ScoreReport:
    scores: list[float | None]
    abstained: int = 0
    errors: int = 0
    first_error: str | None = None
    per_source: dict[str, list[float | None]] = field(default_factory=dict)


def safe_score(source: RewardSource, prompts, completions, examples) -> ScoreReport:
    """Call `source`; an exception costs the batch (all None, counted), NaN/inf costs that sample."""
    try:
        raw = list(source.score(prompts, completions, examples))
        if len(raw) != len(completions):
            raise ValueError(f"returned {len(raw)} scores for {len(completions)} samples")
    except Exception as e:  # a broken reward source loses samples, never the run
        return ScoreReport([None] * len(completions), abstained=len(completions), errors=1,
                           first_error=f"{source.name}: {type(e).__name__}: {e}")
    scores = [s if s is not None and math.isfinite(s) else None for s in raw]
    bad = sum(1 for s, r in zip(scores, raw) if s is None and r is not None)
    return ScoreReport(scores, abstained=sum(s is None for s in scores), errors=bad,
                       first_error=f"{source.name}: non-finite score" if bad else None,
                       per_source={source.name: scores})
