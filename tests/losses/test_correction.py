"""losses/correction.py against numbers worked out by hand (derivations in the docstrings).

The shared example (2 sequences × 3 tokens, ln2 = 0.693147):

    token ratios ρ = π/μ      row 0: [2,   2,   0.5]      row 1: [0.25, 0.5, (8)]
    log π                     row 0: [-ln2, -ln2, -2ln2]  row 1: [-3ln2, -2ln2, (-ln2)]
    mask                      row 0: [1, 1, 1]            row 1: [1, 1, 0]

The masked position (1,2) holds a would-be ratio of 8: it must not reach any masked result.
Sequence weights (masked sums of d = log π - log μ):
    row 0: Π ρ = 2·2·.5 = 2      (Σd = ln2),       GSPO exp(mean d) = 2^{1/3} = 1.259921
    row 1: Π ρ = .25·.5 = 1/8    (Σd = -3ln2),     GSPO exp(mean d) = 2^{-3/2} = 0.353553
    (with the masked 8 wrongly included, row 1 would get Π = 1.)
Advantages: per sequence A = [2, -1]; per token A = [[1, -2, 3], [-1, 2, (5)]].
The IS corrections' loss is -w·A·log π = w·A·(-log π), with -log π = ln2·[[1, 1, 2], [3, 2, 1]].
"""
from __future__ import annotations

import math

import pytest
import torch

from losses.correction import (effective_sample_size_frac, importance_diagnostics, masked_is, no_correction,
                               ppo_clip, truncated_is)

LN = math.log
L2 = LN(2)


def close(a, b, tol=1e-4):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float), torch.as_tensor(b, dtype=torch.float),
                          atol=tol, rtol=0)


def on_mask(x, mask):
    """The entries of x at mask == 1, row-major (the 5 kept tokens of the shared example)."""
    return x[mask.bool()]


LOGP = torch.tensor([[LN(0.5), LN(0.5), LN(0.25)], [LN(0.125), LN(0.25), LN(0.5)]])
BEHAVIOUR = torch.tensor([[LN(0.25), LN(0.25), LN(0.5)], [LN(0.5), LN(0.5), LN(1 / 16)]])
MASK = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
ADV_SEQ = torch.tensor([2.0, -1.0])
ADV_TOK = torch.tensor([[1.0, -2, 3], [-1, 2, 5]])


def run(fn, adv, *args, logp=LOGP, behaviour=BEHAVIOUR, mask=MASK, **kwargs):
    """Call a correction with a grad-requiring copy of logp; return (loss, metrics, d Σ(m·loss) / d logp)."""
    lp = logp.clone().requires_grad_(True)
    loss, metrics = fn(lp, behaviour, adv, mask, *args, **kwargs)
    (grad,) = torch.autograd.grad((loss * mask).sum(), lp)
    return loss.detach(), metrics, grad


def test_shared_example_ratios():
    """Sanity check of the fixture: exp(log π - log μ) = [[2, 2, .5], [.25, .5, 8]]."""
    assert close(torch.exp(LOGP - BEHAVIOUR), [[2, 2, 0.5], [0.25, 0.5, 8]])


# ---------------------------------------------------------------- no correction
def test_no_correction_by_hand():
    """L = -A·log π, A = [2, -1]: row 0: 2·ln2 = 1.386294, 2·ln2, 2·2ln2 = 2.772589;
    row 1: -1·3ln2 = -2.079442, -1·2ln2 = -1.386294. Gradient = -A·m: [[-2,-2,-2],[1,1,0]].
    Metrics: ratio_mean over the 5 tokens = (2+2+.5+.25+.5)/5 = 5.25/5 = 1.05, ratio_max = 2 (not the
    masked 8), clip_frac = 0."""
    loss, m, grad = run(no_correction, ADV_SEQ)
    assert close(on_mask(loss, MASK), [2 * L2, 2 * L2, 4 * L2, -3 * L2, -2 * L2])
    assert close(grad, [[-2.0, -2, -2], [1, 1, 0]])
    assert close(m["ratio_mean"], 1.05)
    assert close(m["ratio_max"], 2.0)
    assert m["clip_frac"].item() == 0.0
    assert not any(v.requires_grad for v in m.values())


def test_no_correction_sequence_level_metrics():
    """Sequence level the loss is the same -A·log π; the ratio is the row's Π ρ: 2 on row 0's 3 tokens,
    1/8 on row 1's 2 → ratio_mean = (3·2 + 2·.125)/5 = 6.25/5 = 1.25, ratio_max = 2."""
    loss, m, _ = run(no_correction, ADV_SEQ, level="sequence")
    assert close(on_mask(loss, MASK), [2 * L2, 2 * L2, 4 * L2, -3 * L2, -2 * L2])
    assert close(m["ratio_mean"], 1.25)
    assert close(m["ratio_max"], 2.0)


# ---------------------------------------------------------------- ppo_clip
def test_ppo_clip_token_by_hand():
    """clip 0.2/0.2 → [0.8, 1.2]; A = [2, -1]; L = -min(ρA, clip(ρ)A):
    (0,0) ρ=2,  A=2:  -min(4, 2.4)       = -2.4  clipped
    (0,1) ρ=2,  A=2:  -2.4                        clipped
    (0,2) ρ=.5, A=2:  -min(1, 1.6)        = -1    unclipped (pessimistic)
    (1,0) ρ=.25, A=-1: -min(-.25, -.8)    = .8    clipped
    (1,1) ρ=.5,  A=-1: -min(-.5, -.8)     = .8    clipped
    clip_frac = 4/5 = .8; ratio_mean = 1.05, ratio_max = 2. Gradient: 0 where clipped, d(-ρA)/dlogπ = -ρA
    = -.5·2 = -1 at (0,2)."""
    loss, m, grad = run(ppo_clip, ADV_SEQ, 0.2, 0.2)
    assert close(on_mask(loss, MASK), [-2.4, -2.4, -1.0, 0.8, 0.8])
    assert close(m["clip_frac"], 0.8)
    assert close(m["ratio_mean"], 1.05)
    assert close(m["ratio_max"], 2.0)
    assert close(grad, [[0.0, 0, -1], [0, 0, 0]])


def test_ppo_clip_token_advantages_by_hand():
    """A = [[1, -2, 3], [-1, 2]], range [.8, 1.2]:
    (0,0) ρ=2,  A=1:   -min(2, 1.2)     = -1.2  clipped   → grad 0
    (0,1) ρ=2,  A=-2:  -min(-4, -2.4)   = 4     unclipped → grad -ρA = 4
    (0,2) ρ=.5, A=3:   -min(1.5, 2.4)   = -1.5  unclipped → grad -1.5
    (1,0) ρ=.25, A=-1: -min(-.25, -.8)  = .8    clipped   → grad 0
    (1,1) ρ=.5, A=2:   -min(1, 1.6)     = -1    unclipped → grad -1
    clip_frac = 2/5 = .4."""
    loss, m, grad = run(ppo_clip, ADV_TOK, 0.2, 0.2)
    assert close(on_mask(loss, MASK), [-1.2, 4.0, -1.5, 0.8, -1.0])
    assert close(m["clip_frac"], 0.4)
    assert close(grad, [[0.0, 4, -1.5], [0, -1, 0]])


def test_ppo_clip_sequence_is_gspo_by_hand():
    """GSPO: s = exp(mean_t m_t d_t) per row. clip_low=.7, clip_high=.2 → range [.3, 1.2].
    row 0: s = 2^{1/3} = 1.259921 > 1.2, A=2: -min(2.519842, 2.4) = -2.4 on all 3 tokens (clipped, grad 0).
    row 1: s = 2^{-3/2} = .353553 in range, A=-1: -min(-.353553, -.353553) = .353553 on both tokens.
    (Σ instead of mean would give s = 1/8 → clipped at .3 → .3; including the masked 8 would give s = 1.)
    Gradient of row 1's masked sum 2·(-sA) w.r.t. each d_t: -2sA·(1/2) = -sA = .353553; masked token 0.
    clip_frac = 3/5 = .6; ratio_mean = (3·1.259921 + 2·.353553)/5 = 4.486870/5 = .897374;
    ratio_max = 1.259921."""
    loss, m, grad = run(ppo_clip, ADV_SEQ, 0.7, 0.2, level="sequence")
    assert close(on_mask(loss, MASK), [-2.4, -2.4, -2.4, 0.353553, 0.353553])
    assert close(m["clip_frac"], 0.6)
    assert close(m["ratio_mean"], 0.897374)
    assert close(m["ratio_max"], 1.259921)
    assert close(grad, [[0.0, 0, 0], [0.353553, 0.353553, 0]])


# ---------------------------------------------------------------- truncated IS
def test_truncated_is_token_by_hand():
    """cap C = 1.5: w = min(ρ, C) = [[1.5, 1.5, .5], [.25, .5]]; L = w·A·(-log π), A = [2, -1]:
    row 0: 1.5·2·ln2 = 3ln2 = 2.079442 (×2), .5·2·2ln2 = 2ln2 = 1.386294;
    row 1: .25·-1·3ln2 = -.75ln2 = -.519860, .5·-1·2ln2 = -ln2 = -.693147.
    Gradient (weight is stop-gradient) = -w·A: [[-3, -3, -1], [.25, .5, 0]].
    clip_frac = share truncated = 2/5 = .4; ratio_mean/max report ρ, not w: 1.05 and 2."""
    loss, m, grad = run(truncated_is, ADV_SEQ, 1.5)
    assert close(on_mask(loss, MASK), [3 * L2, 3 * L2, 2 * L2, -0.75 * L2, -L2])
    assert close(grad, [[-3.0, -3, -1], [0.25, 0.5, 0]])
    assert close(m["clip_frac"], 0.4)
    assert close(m["ratio_mean"], 1.05)
    assert close(m["ratio_max"], 2.0)
    assert not any(v.requires_grad for v in m.values())


def test_truncated_is_token_advantages_by_hand():
    """C = 1.5, w = [[1.5, 1.5, .5], [.25, .5]], A = [[1, -2, 3], [-1, 2]]:
    row 0: 1.5·1·ln2 = 1.039721, 1.5·-2·ln2 = -2.079442, .5·3·2ln2 = 2.079442;
    row 1: .25·-1·3ln2 = -.519860, .5·2·2ln2 = 1.386294.
    Gradient -w·A: [[-1.5, 3, -1.5], [.25, -1, 0]]."""
    loss, _, grad = run(truncated_is, ADV_TOK, 1.5)
    assert close(on_mask(loss, MASK), [1.5 * L2, -3 * L2, 3 * L2, -0.75 * L2, 2 * L2])
    assert close(grad, [[-1.5, 3, -1.5], [0.25, -1, 0]])


def test_truncated_is_sequence_by_hand():
    """Sequence weight min(Π ρ, C) on every token of the row, C = 1.5:
    row 0: min(2, 1.5) = 1.5 → 1.5·2·ln2 = 3ln2 (×2), 1.5·2·2ln2 = 6ln2 = 4.158883;
    row 1: min(1/8, 1.5) = .125 → .125·-1·3ln2 = -.375ln2 = -.259930, .125·-1·2ln2 = -.25ln2 = -.173287.
    (The masked 8 included would give row 1 weight 1.) Gradient -w·A: [[-3,-3,-3],[.125,.125,0]].
    clip_frac = 3/5 = .6 (row 0's tokens); ratio_mean = (3·2 + 2·.125)/5 = 1.25; ratio_max = 2."""
    loss, m, grad = run(truncated_is, ADV_SEQ, 1.5, level="sequence")
    assert close(on_mask(loss, MASK), [3 * L2, 3 * L2, 6 * L2, -0.375 * L2, -0.25 * L2])
    assert close(grad, [[-3.0, -3, -3], [0.125, 0.125, 0]])
    assert close(m["clip_frac"], 0.6)
    assert close(m["ratio_mean"], 1.25)
    assert close(m["ratio_max"], 2.0)


def test_truncated_is_sequence_uncapped_weight_is_full_product():
    """C = 3 > every Π ρ: the weights are the full sequence products 2 and 1/8; nothing truncated.
    Gradient -w·A = [[-4, -4, -4], [.125, .125, 0]]."""
    _, m, grad = run(truncated_is, ADV_SEQ, 3.0, level="sequence")
    assert close(grad, [[-4.0, -4, -4], [0.125, 0.125, 0]])
    assert m["clip_frac"].item() == 0.0


def test_truncated_is_huge_sequence_ratio_stays_finite():
    """Σd = 2·60 = 120 > ln(float32 max) ≈ 88.7: Π ρ overflows to inf, yet min(inf, C=2) = 2, so
    L = 2·1·(-log π) with log π = -1 → 2, gradient -w·A = -2."""
    lp = torch.tensor([[-1.0, -1.0]])
    loss, _, grad = run(truncated_is, torch.tensor([1.0]), 2.0, logp=lp, behaviour=lp - 60,
                        mask=torch.ones(1, 2), level="sequence")
    assert close(loss, [[2.0, 2.0]])
    assert close(grad, [[-2.0, -2.0]])


# ---------------------------------------------------------------- masked IS
def test_masked_is_token_by_hand():
    """low=.4, high=1.5: keep ρ ∈ [.4, 1.5]: row 0 [2 ✗, 2 ✗, .5 ✓], row 1 [.25 ✗, .5 ✓].
    w = ρ·1[kept] = [[0, 0, .5], [0, .5]]; L = w·A·(-log π), A = [2, -1]:
    row 0: 0, 0, .5·2·2ln2 = 2ln2 = 1.386294; row 1: 0, .5·-1·2ln2 = -ln2 = -.693147.
    Gradient -w·A = [[0, 0, -1], [0, .5, 0]] (dropped tokens get none).
    clip_frac = dropped share = 3/5 = .6; ratio_mean = 1.05; ratio_max = 2."""
    loss, m, grad = run(masked_is, ADV_SEQ, 0.4, 1.5)
    assert close(on_mask(loss, MASK), [0.0, 0.0, 2 * L2, 0.0, -L2])
    assert close(grad, [[0.0, 0, -1], [0, 0.5, 0]])
    assert close(m["clip_frac"], 0.6)
    assert close(m["ratio_mean"], 1.05)
    assert close(m["ratio_max"], 2.0)
    assert not any(v.requires_grad for v in m.values())


def test_masked_is_token_advantages_by_hand():
    """low=.3, high=3: row 0 all kept (2, 2, .5), row 1 [.25 ✗, .5 ✓]: w = [[2, 2, .5], [0, .5]].
    A = [[1, -2, 3], [-1, 2]]: row 0: 2·1·ln2 = 1.386294, 2·-2·ln2 = -2.772589, .5·3·2ln2 = 2.079442;
    row 1: 0, .5·2·2ln2 = 1.386294. Gradient -w·A = [[-2, 4, -1.5], [0, -1, 0]]. clip_frac = 1/5 = .2."""
    loss, m, grad = run(masked_is, ADV_TOK, 0.3, 3.0)
    assert close(on_mask(loss, MASK), [2 * L2, -4 * L2, 3 * L2, 0.0, 2 * L2])
    assert close(grad, [[-2.0, 4, -1.5], [0, -1, 0]])
    assert close(m["clip_frac"], 0.2)


def test_masked_is_sequence_by_hand():
    """low=.3, high=3 on the sequence weight Π ρ: row 0 = 2 kept, row 1 = 1/8 < .3 dropped (with the masked
    8 included it would be 1 and kept). w = [[2, 2, 2], [0, 0]], A = [2, -1]:
    row 0: 2·2·ln2 = 4ln2 = 2.772589 (×2), 2·2·2ln2 = 8ln2 = 5.545177; row 1: 0, 0.
    Gradient -w·A = [[-4, -4, -4], [0, 0, 0]]. clip_frac = 2/5 = .4."""
    loss, m, grad = run(masked_is, ADV_SEQ, 0.3, 3.0, level="sequence")
    assert close(on_mask(loss, MASK), [4 * L2, 4 * L2, 8 * L2, 0.0, 0.0])
    assert close(grad, [[-4.0, -4, -4], [0, 0, 0]])
    assert close(m["clip_frac"], 0.4)


def test_masked_is_drops_overflowing_sequence_weight():
    """Σd = 2·60 = 120: Π ρ = e^120 (inf in float32) > high = 2 → dropped: loss 0, gradient 0."""
    lp = torch.tensor([[-1.0, -1.0]])
    loss, _, grad = run(masked_is, torch.tensor([1.0]), 0.5, 2.0, logp=lp, behaviour=lp - 60,
                        mask=torch.ones(1, 2), level="sequence")
    assert torch.isfinite(loss).all() and close(loss, [[0.0, 0.0]])
    assert torch.isfinite(grad).all() and close(grad, [[0.0, 0.0]])


# ---------------------------------------------------------------- on-policy: every correction is -A·log π
CORRECTIONS = {
    "none": (no_correction, ()),
    "ppo_clip": (ppo_clip, (0.2, 0.2)),
    "truncated_is": (truncated_is, (1.5,)),
    "masked_is": (masked_is, (0.5, 2.0)),
}

@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("adv_kind", ["seq", "tok"])
@pytest.mark.parametrize("name", list(CORRECTIONS))
def test_on_policy_gradient_is_minus_advantage(name, adv_kind, level):
    """π = μ (logprobs == behaviour): ρ = 1 at both levels, nothing truncated/masked/clipped, and
    d Σ_t m_t·L_t / d log π_t = -A_t·m_t for every correction: A = [2, -1] → [[-2,-2,-2],[1,1,0]];
    A = [[1,-2,3],[-1,2,5]] → [[-1,2,-3],[1,-2,0]]. ratio_mean = ratio_max = 1, clip_frac = 0."""
    fn, args = CORRECTIONS[name]
    adv = ADV_SEQ if adv_kind == "seq" else ADV_TOK
    _, m, grad = run(fn, adv, *args, behaviour=LOGP, level=level)
    expected = -(adv.unsqueeze(-1) if adv.dim() == 1 else adv) * MASK
    assert close(grad, expected)
    assert close(m["ratio_mean"], 1.0) and close(m["ratio_max"], 1.0)
    assert m["clip_frac"].item() == 0.0


# ---------------------------------------------------------------- bad settings
@pytest.mark.parametrize("call", [
    lambda: no_correction(LOGP, BEHAVIOUR, ADV_SEQ, MASK, level="tokens"),
    lambda: ppo_clip(LOGP, BEHAVIOUR, ADV_SEQ, MASK, 0.2, 0.2, level="seq"),
    lambda: truncated_is(LOGP, BEHAVIOUR, ADV_SEQ, MASK, 2.0, level="batch"),
    lambda: masked_is(LOGP, BEHAVIOUR, ADV_SEQ, MASK, 0.5, 2.0, level="Token"),
], ids=["none", "ppo_clip", "truncated_is", "masked_is"])
def test_unknown_level_raises(call):
    with pytest.raises(ValueError, match="level"):
        call()


@pytest.mark.parametrize("cap", [0.0, -1.0])
def test_truncated_is_rejects_nonpositive_cap(cap):
    with pytest.raises(ValueError, match="cap"):
        truncated_is(LOGP, BEHAVIOUR, ADV_SEQ, MASK, cap)


@pytest.mark.parametrize("low,high", [(1.0, 2.0), (1.5, 2.0), (0.5, 1.0), (0.5, 0.9), (-0.1, 2.0)])
def test_masked_is_rejects_bad_bounds(low, high):
    """Needs 0 ≤ low < 1 < high: low ≥ 1, high ≤ 1 and negative low are refused."""
    with pytest.raises(ValueError, match="low"):
        masked_is(LOGP, BEHAVIOUR, ADV_SEQ, MASK, low, high)


def test_masked_is_accepts_zero_low():
    """low = 0 is allowed (only the upper tail is dropped): high = 1.5 drops row 0's two ρ=2 tokens
    → clip_frac = 2/5 = .4."""
    _, m = masked_is(LOGP, BEHAVIOUR, ADV_SEQ, MASK, 0.0, 1.5)
    assert close(m["clip_frac"], 0.4)


# ---------------------------------------------------------------- effective sample size
def test_ess_equal_weights_is_one():
    """Equal weights (any common log-weight): (N w)² / (N · N w²) = 1."""
    assert close(effective_sample_size_frac(torch.full((5,), -3.7)), 1.0)


def test_ess_one_weight_dominates_is_one_over_n():
    """w = (1, 0, 0, 0) (log-weights 0, -1e4, -1e4, -1e4): 1² / (4 · 1) = 1/4."""
    assert close(effective_sample_size_frac(torch.tensor([0.0, -1e4, -1e4, -1e4])), 0.25)


def test_ess_by_hand():
    """w = (1, 2, 3): (1+2+3)² / (3 · (1+4+9)) = 36/42 = .857143."""
    assert close(effective_sample_size_frac(torch.tensor([0.0, L2, LN(3)])), 36 / 42)


def test_ess_invariant_to_constant_shift_and_stable():
    """Adding c to every log-weight scales every w by e^c, which cancels in (Σw)²/(NΣw²): the same
    36/42 for shifts of 7, -50 and 1000 (e^1000 would overflow without the max-shift)."""
    lw = torch.tensor([0.0, L2, LN(3)])
    for c in (7.0, -50.0, 1000.0):
        assert close(effective_sample_size_frac(lw + c), 36 / 42)
    big = effective_sample_size_frac(torch.tensor([1000.0, 1001.0]))
    # w ∝ (1, e): (1+e)² / (2(1+e²)) = 13.82553 / 16.77811 = .824027
    assert torch.isfinite(big) and close(big, (1 + math.e) ** 2 / (2 * (1 + math.e**2)))


def test_ess_empty_is_nan():
    assert math.isnan(effective_sample_size_frac(torch.tensor([])).item())


# ---------------------------------------------------------------- importance diagnostics
def test_importance_diagnostics_constant_ratio_two():
    """ρ = 2 on every token: k3 of KL(μ‖π) = ρ - 1 - ln ρ = 1 - ln2 = .306853; ratio_mean = ratio_max = 2;
    every sequence has the same weight 2² = 4 → ess_frac = 1."""
    lp = torch.full((2, 2), LN(0.5))
    d = importance_diagnostics(lp, torch.full((2, 2), LN(0.25)), torch.ones(2, 2))
    assert close(d["kl_behaviour"], 1 - L2)
    assert close(d["ratio_mean"], 2.0) and close(d["ratio_max"], 2.0)
    assert close(d["ess_frac"], 1.0)


def test_importance_diagnostics_shared_example_by_hand():
    """Kept ρ: 2, 2, .5, .25, .5. ρ - 1 - ln ρ: ρ=2 → 1 - ln2; ρ=.5 → ln2 - .5; ρ=.25 → 2ln2 - .75.
    Sum = 2(1-ln2) + 2(ln2-.5) + 2ln2 - .75 = .25 + 2ln2 = 1.636294 → kl_behaviour = /5 = .327259.
    ratio_mean = 1.05, ratio_max = 2 (not the masked 8).
    ess_frac from the masked sequence sums Σd = (ln2, -3ln2): w = (2, 1/8) →
    2.125² / (2·(4 + 1/64)) = 4.515625 / 8.03125 = .562257 (the masked 8 included would give w = (2, 1)
    → 9/10)."""
    d = importance_diagnostics(LOGP, BEHAVIOUR, MASK)
    assert close(d["kl_behaviour"], (0.25 + 2 * L2) / 5)
    assert close(d["ratio_mean"], 1.05)
    assert close(d["ratio_max"], 2.0)
    assert close(d["ess_frac"], 4.515625 / 8.03125)
    assert not any(v.requires_grad for v in d.values())


def test_importance_diagnostics_on_policy():
    """π = μ: ρ = 1, kl_behaviour = 1 - 1 - 0 = 0, ess_frac = 1."""
    d = importance_diagnostics(LOGP, LOGP, MASK)
    assert close(d["kl_behaviour"], 0.0)
    assert close(d["ratio_mean"], 1.0) and close(d["ratio_max"], 1.0)
    assert close(d["ess_frac"], 1.0)
