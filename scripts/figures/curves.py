"""Accuracy-vs-tokens curves as numbers (issue 33's measurement v2): a saturating fit per run, tokens to a
share of the baseline's fitted gain, ratios to the baseline, and a paired bootstrap over seeds. Pure
functions of lists of numbers: no runs, no files (scripts/figures/economics_v2.py reads the runs).

    acc(t) = a0 + (A − a0)(1 − exp(−t/τ))      a0: the shared SFT policy's accuracy (fixed, not fitted)

fitted by least squares: for a given τ the best A is closed-form, (A − a0) = Σ f·(y − a0) / Σ f² with
f = 1 − exp(−t/τ); τ is searched on a log grid and refined by golden section on log τ. Tokens to p of the
baseline's fitted gain g = A_b − a0:  t_p = −τ ln(1 − p·g / (A − a0)), ∞ when the run's own asymptote
never reaches a0 + p·g. A ratio t_p(config) / t_p(baseline) below 1: the config needs fewer tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SHARES = (0.3, 0.7, 0.85)  # generation's share of a step's price: here ≈ 0.28, at real scale 0.7-0.85
FRACTIONS = (0.5, 0.8, 0.9)  # of the baseline's fitted gain


@dataclass(frozen=True)
class Fit:
    a0: float          # the start (fixed)
    asymptote: float   # A
    tau: float         # tokens of the e-folding: 63 % of the gain is reached at t = τ
    rmse: float        # of the fit over the curve's points

    @property
    def gain(self) -> float:
        return self.asymptote - self.a0

    def at(self, t: float) -> float:
        return self.a0 + self.gain * (1.0 - math.exp(-t / self.tau))


@dataclass(frozen=True)
class Interval:
    median: float
    lo: float
    hi: float

    def as_dict(self) -> dict:
        return {"median": _num(self.median), "lo": _num(self.lo), "hi": _num(self.hi)}

    def text(self) -> str:
        return f"{_fmt(self.median)} [{_fmt(self.lo)}, {_fmt(self.hi)}]"


def _num(x: float):
    """JSON has no ∞ or NaN: ∞ is written as the string "inf", NaN as null."""
    return None if x != x else ("inf" if x == math.inf else x)


def _fmt(x: float) -> str:
    return "–" if x != x else ("∞" if x == math.inf else f"{x:.2f}")


def _best_gain(t: np.ndarray, y: np.ndarray, a0: float, tau: float) -> tuple[float, float]:
    """(A − a0, sum of squared errors) of the best asymptote for this τ."""
    f = 1.0 - np.exp(-t / tau)
    denom = float(f @ f)
    gain = float(f @ (y - a0)) / denom if denom > 0 else 0.0
    return gain, float(((y - a0 - gain * f) ** 2).sum())


def fit_saturating(tokens: list[float], accuracy: list[float], a0: float, grid: int = 200) -> Fit:
    """The least-squares saturating curve through (tokens, accuracy) from a0; ValueError without two points
    past t = 0."""
    t, y = np.asarray(tokens, dtype=float), np.asarray(accuracy, dtype=float)
    positive = t[t > 0]
    if len(positive) < 2:
        raise ValueError(f"a saturating fit needs ≥ 2 points past 0 tokens, got {len(positive)}")
    lo, hi = math.log(positive.min() / 20), math.log(positive.max() * 50)
    logs = np.linspace(lo, hi, grid)
    sse = [_best_gain(t, y, a0, math.exp(x))[1] for x in logs]
    i = int(np.argmin(sse))
    a, b = logs[max(i - 1, 0)], logs[min(i + 1, grid - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(80):  # golden section on log τ between the grid point's neighbours
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        if _best_gain(t, y, a0, math.exp(c))[1] <= _best_gain(t, y, a0, math.exp(d))[1]:
            b = d
        else:
            a = c
    tau = math.exp((a + b) / 2)
    gain, err = _best_gain(t, y, a0, tau)
    return Fit(a0=a0, asymptote=a0 + gain, tau=tau, rmse=math.sqrt(err / len(t)))


def tokens_to(fit: Fit, target_gain: float) -> float:
    """Tokens for `fit` to gain `target_gain` over a0 (∞: its asymptote stays below; NaN: no gain asked)."""
    if target_gain <= 0:
        return math.nan
    if fit.gain <= target_gain:
        return math.inf
    return -fit.tau * math.log(1.0 - target_gain / fit.gain)


def tokens_ratio(config: Fit, baseline: Fit, p: float) -> float:
    """t_p(config) / t_p(baseline) at p of the baseline's fitted gain (one seed); NaN when the baseline
    gained nothing."""
    target = p * baseline.gain
    base = tokens_to(baseline, target)
    if base != base or base == math.inf:
        return math.nan
    return tokens_to(config, target) / base


def priced_ratio(generated_ratio: float, trained_ratio: float, share: float) -> float:
    """A run's price against the baseline's when generation is `share` of the baseline's price a step (the
    ledger's two prices, usd_per_mtok_generated and usd_per_mtok_trained, set so): share × the generated
    tokens' ratio + (1 − share) × the trained tokens'."""
    return share * generated_ratio + (1.0 - share) * trained_ratio


def at_tokens(xs: list[float], ys: list[float], t: float) -> float:
    """y at x = t on the piecewise-linear curve (xs increasing), extended linearly from its last two points
    past its end (a run that reaches a target after its last evaluation); ∞ at t = ∞, NaN for NaN."""
    if t != t or t == math.inf:
        return t
    if len(xs) == 1:
        return ys[0]
    if t <= xs[-1]:
        return float(np.interp(t, xs, ys))
    (x0, y0), (x1, y1) = (xs[-2], ys[-2]), (xs[-1], ys[-1])
    return y1 + (y1 - y0) * (t - x1) / (x1 - x0) if x1 > x0 else y1


def paired_bootstrap(ratios: list[float], n: int = 10_000, seed: int = 0) -> Interval:
    """Per-seed ratios (each seed's config against the same seed's baseline) → their median and the 2.5/97.5
    percentiles of the median over `n` resamples of the seeds with replacement. ∞ (never reached) is kept
    as the largest value; NaN seeds (the baseline gained nothing) are left out; none left: NaN."""
    x = np.asarray([r for r in ratios if r == r], dtype=float)
    if not len(x):
        return Interval(math.nan, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    medians = np.median(x[rng.integers(0, len(x), size=(n, len(x)))], axis=1)
    return Interval(float(np.median(x)), float(np.percentile(medians, 2.5, method="lower")),
                    float(np.percentile(medians, 97.5, method="higher")))


def fitted_runs(out, labels, slug, read_run, seed_of) -> tuple[dict[int, float], dict[str, dict]]:
    """A figure's job dirs read and fitted: each seed's SFT accuracy a0 (out/sft; else the run's own step-0
    evaluation) and, per label, each run by seed (out/<slug(label)>) with `.fit` its saturating curve from a0
    (None where no a0 or the fit fails). `read_run(job)` builds a run with .tokens, .accuracy and .fit."""
    from scripts.figures.registry import jobs  # lazy: registry is the figures' shared reader, not a curve tool
    sft = {j.seed: list(j.stages.values())[-1].get("val/accuracy_after") for j in jobs(out / "sft")}
    found: dict[str, dict] = {}
    for label in labels:
        for job in jobs(out / slug(label)):
            run, seed = read_run(job), seed_of(job)
            a0 = sft.get(seed)
            if a0 is None and run.accuracy:
                a0 = sft[seed] = run.accuracy[0]  # no SFT summary: the run's own step-0 evaluation
            try:
                run.fit = fit_saturating(run.tokens, run.accuracy, a0) if a0 is not None else None
            except ValueError:
                run.fit = None
            found.setdefault(label, {})[seed] = run
    return sft, found
