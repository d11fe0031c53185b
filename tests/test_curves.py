"""scripts/figures/curves.py on synthetic curves with known answers (issue 33, measurement v2)."""
import math

import pytest

from scripts.figures.curves import (Fit, at_tokens, fit_saturating, paired_bootstrap, priced_ratio, tokens_ratio,
                                    tokens_to)

A0 = 0.86
GRID = [20_000.0 * k for k in range(31)]  # 0 … 600k: 31 points, a run's evaluation grid


def curve(asymptote: float, tau: float) -> list[float]:
    return [A0 + (asymptote - A0) * (1 - math.exp(-t / tau)) for t in GRID]


def test_fit_recovers_a_noise_free_curve():
    fit = fit_saturating(GRID, curve(0.99, 100_000.0), A0)
    assert fit.a0 == A0
    assert fit.asymptote == pytest.approx(0.99, abs=1e-6)
    assert fit.tau == pytest.approx(100_000.0, rel=1e-4)
    assert fit.rmse < 1e-6
    assert fit.at(100_000.0) == pytest.approx(A0 + 0.13 * (1 - math.exp(-1)), abs=1e-6)


def test_fit_of_a_noisy_curve_stays_near_the_truth():
    noisy = [y + (0.01 if i % 2 else -0.01) for i, y in enumerate(curve(0.95, 150_000.0))]
    fit = fit_saturating(GRID, noisy, A0)
    assert fit.asymptote == pytest.approx(0.95, abs=0.01)
    assert fit.tau == pytest.approx(150_000.0, rel=0.2)


def test_fit_refuses_a_curve_without_points_past_zero():
    with pytest.raises(ValueError, match="≥ 2 points past 0 tokens, got 1"):
        fit_saturating([0.0, 10.0], [A0, 0.9], A0)


def test_tokens_to_hand_worked():
    fit = Fit(a0=A0, asymptote=0.96, tau=100_000.0, rmse=0.0)  # gain 0.10
    assert tokens_to(fit, 0.09) == pytest.approx(100_000.0 * math.log(10))   # 90 % of its own gain: τ ln 10
    assert tokens_to(fit, 0.05) == pytest.approx(100_000.0 * math.log(2))    # 50 %: τ ln 2
    assert tokens_to(fit, 0.10) == math.inf                                   # its asymptote: never
    assert tokens_to(fit, 0.12) == math.inf
    assert math.isnan(tokens_to(fit, 0.0))


def test_ratio_of_a_twice_as_fast_run_is_one_half_at_every_fraction():
    base = fit_saturating(GRID, curve(0.99, 100_000.0), A0)
    fast = fit_saturating(GRID, curve(0.99, 50_000.0), A0)
    for p in (0.5, 0.8, 0.9):
        assert tokens_ratio(fast, base, p) == pytest.approx(0.5, rel=1e-3)


def test_ratio_against_a_lower_asymptote_hand_worked():
    base = Fit(A0, 0.96, 100_000.0, 0.0)     # g = 0.10; t_90 = τ ln 10 = 230,259
    low = Fit(A0, 0.98, 100_000.0, 0.0)      # gain 0.12: t = −τ ln(1 − 0.09/0.12) = τ ln 4 = 138,629
    assert tokens_ratio(low, base, 0.9) == pytest.approx(math.log(4) / math.log(10))
    short = Fit(A0, 0.94, 10_000.0, 0.0)     # gain 0.08 < 0.09: never, however fast
    assert tokens_ratio(short, base, 0.9) == math.inf
    flat = Fit(A0, A0, 100_000.0, 0.0)       # a baseline that gained nothing: no ratio
    assert math.isnan(tokens_ratio(base, flat, 0.9))


def test_priced_ratio_hand_worked():
    # half the generated tokens, 1.5 × the trained ones: at share 0.3 → 0.3·0.5 + 0.7·1.5 = 1.2; at 0.85 → 0.65
    assert priced_ratio(0.5, 1.5, 0.3) == pytest.approx(1.2)
    assert priced_ratio(0.5, 1.5, 0.85) == pytest.approx(0.65)


def test_at_tokens_interpolates_and_extends():
    xs, ys = [0.0, 100.0, 200.0], [0.0, 10.0, 30.0]
    assert at_tokens(xs, ys, 50.0) == pytest.approx(5.0)
    assert at_tokens(xs, ys, 250.0) == pytest.approx(40.0)   # the last slope, 0.2 a token
    assert at_tokens(xs, ys, math.inf) == math.inf


def test_bootstrap_of_two_seeds_hand_worked():
    # resamples of [1, 3]: {1,1} → 1 (¼), {1,3} → 2 (½), {3,3} → 3 (¼): 2.5/97.5 % are 1 and 3
    iv = paired_bootstrap([1.0, 3.0], n=4000, seed=0)
    assert (iv.median, iv.lo, iv.hi) == (2.0, 1.0, 3.0)


def test_bootstrap_of_identical_ratios_is_a_point():
    iv = paired_bootstrap([0.5] * 5)
    assert (iv.median, iv.lo, iv.hi) == (0.5, 0.5, 0.5)


def test_bootstrap_keeps_never_as_the_largest_and_drops_nan():
    iv = paired_bootstrap([0.6, 0.7, math.inf, math.nan, 0.8])
    assert iv.median == pytest.approx(0.75)
    assert iv.lo == pytest.approx(0.6) and iv.hi == math.inf
    assert iv.as_dict()["hi"] == "inf" and iv.text().endswith("∞]")
    assert math.isnan(paired_bootstrap([math.nan]).median)


def _seed_curves(taus: list[float], scale: float) -> list[float]:
    """Per seed: the config's ratio, fitted from noise-free curves (baseline τ, config τ × scale)."""
    out = []
    for i, tau in enumerate(taus):
        asym = 0.97 + 0.005 * i
        base = fit_saturating(GRID, curve(asym, tau), A0)
        other = fit_saturating(GRID, curve(asym, tau * scale), A0)
        out.append(tokens_ratio(other, base, 0.9))
    return out


def test_known_ratio_over_five_seeds_end_to_end():
    iv = paired_bootstrap(_seed_curves([60e3, 80e3, 100e3, 120e3, 140e3], 0.6))
    assert iv.median == pytest.approx(0.6, rel=2e-3)
    assert iv.lo == pytest.approx(0.6, rel=2e-3) and iv.hi == pytest.approx(0.6, rel=2e-3)


def test_aa_null_has_ratio_one_and_an_interval_around_it():
    """A/A: the baseline against itself with another RL seed. Noise-free: exactly 1; with seed-to-seed noise
    (τ ± 10 %) the interval straddles 1."""
    assert paired_bootstrap(_seed_curves([60e3, 80e3, 100e3, 120e3, 140e3], 1.0)).median == pytest.approx(1.0, rel=1e-4)
    ratios = []
    for i, wobble in enumerate([0.9, 1.1, 1.0, 0.95, 1.05]):
        asym = 0.97 + 0.005 * i
        base = fit_saturating(GRID, curve(asym, 100e3), A0)
        other = fit_saturating(GRID, curve(asym, 100e3 * wobble), A0)
        ratios.append(tokens_ratio(other, base, 0.9))
    iv = paired_bootstrap(ratios)
    assert iv.median == pytest.approx(1.0, rel=1e-3)
    assert iv.lo < 1.0 < iv.hi
    assert iv.lo == pytest.approx(0.9, rel=1e-3) and iv.hi == pytest.approx(1.1, rel=1e-3)
