"""The reward-source contract and the guard that keeps a failing source from costing the run.

A source maps (prompts, completions, examples) → one float or None (abstain) per sample and has a `name`
and `version` (both go into each record's provenance). `safe_score` calls it with a batch timeout: a
source that raises, hangs or returns NaN/inf costs those samples (counted, first error kept), never
the run, and never stalls it longer than `timeout_s`.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Callable

from tasks.base import Example


class RewardSource:
    """score(prompts, completions, examples) → one float or None (abstain) per sample.

    Optional: `score_report(...) → ScoreReport` (a composite that reports each child separately),
    `to(device)` (move models to the policy's device), `stats()` (counters for the run summary).
    """

    name: str = "reward"
    version: str = "0"
    timeout_s: float = 300.0  # whole-batch limit enforced by safe_score

    def score(self, prompts: list[str], completions: list[str], examples: list[Example]) -> list[float | None]:
        raise NotImplementedError

    def to(self, device) -> "RewardSource":
        return self

    def stats(self) -> dict:
        return {}


@dataclass
class ScoreReport:
    scores: list[float | None]
    abstained: int = 0
    errors: int = 0
    timeouts: int = 0
    first_error: str | None = None
    per_source: dict[str, list[float | None]] = field(default_factory=dict)  # name → scores, gold too

    @staticmethod
    def merge(parts: list["ScoreReport"]) -> "ScoreReport":
        """One report for the samples of several (the ranks' shares of a round, in order)."""
        names = [n for part in parts for n in part.per_source]
        return ScoreReport([s for p in parts for s in p.scores], sum(p.abstained for p in parts),
                           sum(p.errors for p in parts), sum(p.timeouts for p in parts),
                           next((p.first_error for p in parts if p.first_error), None),
                           {n: [s for p in parts for s in p.per_source.get(n, [None] * len(p.scores))]
                            for n in dict.fromkeys(names)})


class ScoreTimeout(TimeoutError):
    pass


_busy: dict[int, threading.Thread] = {}  # id(source) → a call that timed out and is still running


def call_with_timeout(fn: Callable, timeout_s: float, label: str = "reward"):
    """fn() in a daemon thread; raise ScoreTimeout after `timeout_s`. Python cannot kill a thread: a hung
    call keeps running in the background (sources that run untrusted code kill their own processes)."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True, name=f"score:{label}")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise ScoreTimeout(f"timed out after {timeout_s:g}s", thread)
    if "error" in box:
        raise box["error"]
    return box["value"]


def safe_score(source: RewardSource, prompts, completions, examples) -> ScoreReport:
    """Call `source` under its timeout; an exception or a timeout costs the batch (all None, counted),
    a NaN/inf or a non-number costs that sample. Never raises."""
    n, name = len(completions), getattr(source, "name", type(source).__name__)
    timeout = float(getattr(source, "timeout_s", RewardSource.timeout_s))
    hung = _busy.get(id(source))
    if hung is not None and hung.is_alive():
        return _lost(n, name, "still running a batch that timed out; abstaining", timeouts=1)
    call = getattr(source, "score_report", None) or source.score
    try:
        raw = call_with_timeout(lambda: call(prompts, completions, examples), timeout, name)
        report = raw if isinstance(raw, ScoreReport) else ScoreReport(list(raw))
        if len(report.scores) != n:
            raise ValueError(f"returned {len(report.scores)} scores for {n} samples")
    except ScoreTimeout as e:
        _busy[id(source)] = e.args[1]
        return _lost(n, name, e.args[0], timeouts=1)
    except Exception as e:  # a broken reward source loses samples, never the run
        return _lost(n, name, f"{type(e).__name__}: {e}")
    scores = [clean(s) for s in report.scores]
    bad = sum(1 for s, r in zip(scores, report.scores) if s is None and r is not None)
    first = report.first_error or (f"{name}: non-finite or non-numeric score" if bad else None)
    return ScoreReport(scores, abstained=sum(s is None for s in scores), errors=report.errors + bad,
                       timeouts=report.timeouts, first_error=first,
                       per_source={**report.per_source, name: scores})


def clean(score) -> float | None:
    """A finite float, or None for None/NaN/inf/anything that is not a real number. Never raises: an int
    past float's range (10**400: OverflowError) or an object whose __float__ fails is not a number."""
    if score is None or isinstance(score, bool):
        return None if score is None else float(score)
    try:
        value = float(score)
    except Exception:  # noqa: BLE001 - OverflowError, TypeError, ValueError, a broken __float__
        return None
    return value if math.isfinite(value) else None


def _lost(n: int, name: str, message: str, timeouts: int = 0) -> ScoreReport:
    return ScoreReport([None] * n, abstained=n, errors=1, timeouts=timeouts, first_error=f"{name}: {message}",
                       per_source={name: [None] * n})
