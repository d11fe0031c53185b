"""Exact verifiers: the arithmetic task's exact match, and any user function with the reward contract."""
from __future__ import annotations

import time
from typing import Callable

from rewards.base import RewardSource, ScoreReport, clean
from rewards.worker_call import CallError, CallTimeout, WorkerCall
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

    per_sample_timeout_s: if set, `fn` is called on one sample at a time in a worker process
    (rewards/worker_call.py), each call under that limit; a sample that exceeds it abstains and the worker
    is killed (a fresh one serves the next sample), so no hung call is left running. `fn` must then be
    picklable (a module-level function, or a partial of one). Samples not started by `timeout_s -
    per_sample_timeout_s - 1` abstain, so the batch ends within its own limit. Unset: `fn` runs in this
    process under only the batch timeout (`timeout_s`, enforced by safe_score).
    """

    def __init__(self, name: str, version: str, fn: Callable, per_sample_timeout_s: float | None,
                 timeout_s: float):
        if not callable(fn):
            raise TypeError(f"reward.fn must be a callable (a `_target_` with `_partial_: true`), got {fn!r}")
        self.name, self.version, self.fn = name, str(version), fn
        self.per_sample_timeout_s, self.timeout_s = per_sample_timeout_s, timeout_s
        self.worker = None
        if per_sample_timeout_s:
            if per_sample_timeout_s + 1 >= timeout_s:
                raise ValueError(f"reward.per_sample_timeout_s={per_sample_timeout_s} must be below "
                                 f"reward.timeout_s - 1 = {timeout_s - 1}: a batch must fit one sample")
            try:
                self.worker = WorkerCall(fn, name, preload=(Example.__module__,))
            except Exception as e:  # noqa: BLE001 - pickling can raise many types
                raise ValueError(f"reward.fn {fn!r} cannot be sent to a worker process, which "
                                 f"reward.per_sample_timeout_s needs ({type(e).__name__}: {e}): use a "
                                 f"module-level function") from None

    def score(self, prompts, completions, examples):
        return self.score_report(prompts, completions, examples).scores

    def score_report(self, prompts, completions, examples) -> ScoreReport:
        if not self.worker:
            return ScoreReport(list(self.fn(prompts, completions, examples)))
        deadline = time.monotonic() + self.timeout_s - self.per_sample_timeout_s - 1.0
        scores, report = [], ScoreReport([])
        for i, (p, c, ex) in enumerate(zip(prompts, completions, examples)):
            if time.monotonic() > deadline:
                report.first_error = report.first_error or f"{self.name}: batch deadline passed at sample {i}"
                scores += [None] * (len(completions) - len(scores))
                break
            try:
                [value] = self.worker(([p], [c], [ex]), self.per_sample_timeout_s)
                scores.append(clean(value))
            except CallTimeout as e:
                report.timeouts += 1
                report.first_error = report.first_error or f"{self.name}: sample {i} {e}"
                scores.append(None)
            except Exception as e:  # noqa: BLE001 - one sample lost
                report.errors += 1
                why = str(e) if isinstance(e, CallError) else f"{type(e).__name__}: {e}"
                report.first_error = report.first_error or f"{self.name}: sample {i}: {why}"
                scores.append(None)
        report.scores = scores
        return report
