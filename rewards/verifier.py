"""Exact verifiers: the arithmetic task's exact match, and any user function with the reward contract."""
from __future__ import annotations

from typing import Callable

from rewards.base import RewardSource, ScoreReport, ScoreTimeout, call_with_timeout, clean
from tasks.base import Example


class ExactMatchVerifier(RewardSource):
    """1.0 if the completion (whitespace-stripped, up to the first newline) equals the reference
    answer, else 0.0. Exact for the arithmetic task, whose answers are canonical integers."""

    version = "1"

    def __init__(self, name: str, timeout_s: float = RewardSource.timeout_s):
        self.name, self.timeout_s = name, timeout_s

    def score(self, prompts: list[str], completions: list[str], examples: list[Example]) -> list[float | None]:
        out = []
        for completion, ex in zip(completions, examples):
            text = completion.strip().split("\n", 1)[0].strip()
            out.append(1.0 if text == ex.answer.strip() else 0.0)
        return out


class FunctionReward(RewardSource):
    """Any function `fn(prompts, completions, examples) -> list[float | None]` named by `_target_`
    (with `_partial_: true`) as a reward source.

    per_sample_timeout_s: if set, `fn` is called on one sample at a time, each under that limit; a
    sample that exceeds it abstains, and so do the rest of the batch (the hung call cannot be killed,
    so no second one is started). Unset: only the batch timeout (`timeout_s`, enforced by safe_score).
    """

    def __init__(self, name: str, version: str, fn: Callable, per_sample_timeout_s: float | None,
                 timeout_s: float):
        if not callable(fn):
            raise TypeError(f"reward.fn must be a callable (a `_target_` with `_partial_: true`), got {fn!r}")
        self.name, self.version, self.fn = name, str(version), fn
        self.per_sample_timeout_s, self.timeout_s = per_sample_timeout_s, timeout_s

    def score(self, prompts, completions, examples):
        return self.score_report(prompts, completions, examples).scores

    def score_report(self, prompts, completions, examples) -> ScoreReport:
        if not self.per_sample_timeout_s:
            return ScoreReport(list(self.fn(prompts, completions, examples)))
        scores, report = [], ScoreReport([])
        for i, (p, c, ex) in enumerate(zip(prompts, completions, examples)):
            try:
                [value] = call_with_timeout(lambda: self.fn([p], [c], [ex]), self.per_sample_timeout_s, self.name)
                scores.append(clean(value))
            except ScoreTimeout as e:
                report.timeouts += 1
                report.first_error = f"{self.name}: sample {i} {e.args[0]}; the rest of the batch abstains"
                scores += [None] * (len(completions) - len(scores))
                break
            except Exception as e:  # noqa: BLE001 - one sample lost
                report.errors += 1
                report.first_error = report.first_error or f"{self.name}: sample {i}: {type(e).__name__}: {e}"
                scores.append(None)
        report.scores = scores
        return report
