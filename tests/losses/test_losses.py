"""Every function in losses/ against numbers worked out by hand (derivations in the docstrings)."""
from __future__ import annotations

import math

import pytest
import torch

from losses.advantages import group_relative_advantages
from losses.common import aggregate, masked_mean, token_logprobs
from losses.kl import k1, k2, k3
from losses.policy_gradient import clipped_surrogate
from losses.sft import nll_loss

LN = math.log


def close(a, b, tol=1e-4):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float), torch.as_tensor(b, dtype=torch.float),
                          atol=tol, rtol=0)


# ---------------------------------------------------------------- common
def test_token_logprobs_by_hand():
    """logits [0, ln 3] → softmax [1/4, 3/4]: target 1 → ln 0.75 = -0.28768, target 0 → ln 0.25 = -1.38629.
    At T=2 the logits become [0, ln √3] → p(0) = 1/(1+√3) → ln = -1.00505."""
    logits = torch.tensor([[[0.0, LN(3)], [0.0, LN(3)]]])  # [B=1, T=2, V=2]
    targets = torch.tensor([[1, 0]])
    assert close(token_logprobs(logits, targets), [[-0.28768, -1.38629]])
    assert close(token_logprobs(logits, targets, temperature=2.0)[0, 1], -1.00505)
    # bf16 logits are upcast: the result is float32
    assert token_logprobs(logits.bfloat16(), targets).dtype == torch.float32


def test_masked_mean_by_hand():
    """values [[1,2,3],[4,5,6]], mask [[1,1,0],[0,0,1]] → (1+2+6)/3 = 3; an empty mask gives 0, not NaN."""
    v = torch.tensor([[1.0, 2, 3], [4, 5, 6]])
    assert close(masked_mean(v, torch.tensor([[1.0, 1, 0], [0, 0, 1]])), 3.0)
    assert masked_mean(v, torch.zeros(2, 3)).item() == 0.0


# values with garbage (100) under the mask: it must never leak into any reduction
AGG_V = torch.tensor([[1.0, 2, 3, 4], [10, 100, 100, 100]])
AGG_M = torch.tensor([[1.0, 1, 1, 1], [1, 0, 0, 0]])


@pytest.mark.parametrize("mode,max_len,expected", [
    ("token_mean", None, 4.0),
    ("seq_mean_token_mean", None, 6.25),
    ("seq_mean_token_sum_norm", None, 2.5),
    ("seq_mean_token_sum_norm", 8, 1.25),
])
def test_aggregate_modes_by_hand(mode, max_len, expected):
    """Row 0 keeps 1,2,3,4 (sum 10, 4 tokens); row 1 keeps 10 (1 token).
    token_mean: (10+10)/5 = 4.   seq_mean_token_mean: mean(10/4, 10/1) = mean(2.5, 10) = 6.25.
    seq_mean_token_sum_norm: mean(10/T, 10/T) with T=4 → 2.5; with max_len=8 → 1.25."""
    assert close(aggregate(AGG_V, AGG_M, mode, max_len=max_len), expected)


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError, match="token_sum"):
        aggregate(AGG_V, AGG_M, "token_sum")


def test_aggregate_gradient_only_reaches_masked_tokens():
    """d token_mean / d v = m / sum(m) = 1/5 on the 5 kept tokens, 0 on the masked ones."""
    v = AGG_V.clone().requires_grad_(True)
    aggregate(v, AGG_M, "token_mean").backward()
    assert close(v.grad, AGG_M / 5)


# ---------------------------------------------------------------- sft
def test_nll_loss_by_hand():
    """logprobs ln(.5), ln(.25), ln(.1) → loss 0.69315, 1.38629, 2.30259 (unreduced, every position);
    target_prob over the mask [1,1,0] = (0.5 + 0.25) / 2 = 0.375; token_mean aggregate = (0.69315+1.38629)/2
    = 1.03972."""
    lp = torch.tensor([[LN(0.5), LN(0.25), LN(0.1)]])
    mask = torch.tensor([[1.0, 1, 0]])
    loss, metrics = nll_loss(lp, mask)
    assert close(loss, [[0.69315, 1.38629, 2.30259]])
    assert close(metrics["target_prob"], 0.375)
    assert not metrics["target_prob"].requires_grad
    assert close(aggregate(loss, mask, "token_mean"), 1.03972)


# ---------------------------------------------------------------- advantages
def test_group_relative_advantages_one_group_by_hand():
    """r = [1,0,0,0]: mean 0.25, centred [.75,-.25,-.25,-.25], population var = (.5625+3·.0625)/4
    = .1875, std = .43301 → A = [1.73205, -0.57735, -0.57735, -0.57735]."""
    adv, stats = group_relative_advantages(torch.tensor([1.0, 0, 0, 0]), torch.tensor([5, 5, 5, 5]))
    assert close(adv, [1.73205, -0.57735, -0.57735, -0.57735])
    assert stats["frac_zero_std"].item() == 0.0


REWARDS = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0])
GROUPS = torch.tensor([7, 3, 7, 3, 7, 9])  # non-contiguous and unequal: 7 → {0,2,4}, 3 → {1,3}, 9 → {5}


def test_group_relative_advantages_noncontiguous_unequal_groups_by_hand():
    """Group 7 = rewards (1, .5, 1): mean 2.5/3 = .83333, centred (.16667, -.33333, .16667),
    var = (.02778+.11111+.02778)/3 = .05556, std = .23570 → A = (.70711, -1.41421, .70711).
    Group 3 = (0, 0): std 0 → A = 0/eps = 0. Group 9 = (1) alone: std 0 → A = 0.
    frac_zero_std = 2 of 3 groups = .66667."""
    adv, stats = group_relative_advantages(REWARDS, GROUPS)
    assert close(adv, [0.70711, 0.0, -1.41421, 0.0, 0.70711, 0.0])
    assert close(stats["frac_zero_std"], 2 / 3)


def test_group_relative_advantages_without_std_scaling_by_hand():
    """Dr.GRPO: A = r - mean(r_g): group 7 → (.16667, -.33333, .16667); groups 3 and 9 → 0."""
    adv, stats = group_relative_advantages(REWARDS, GROUPS, scale_by_std=False)
    assert close(adv, [1 / 6, 0.0, -1 / 3, 0.0, 1 / 6, 0.0])
    assert close(stats["frac_zero_std"], 2 / 3)


def test_group_relative_advantages_order_invariant():
    """Permuting the samples permutes the advantages: groups are found by id, not position."""
    perm = torch.tensor([5, 3, 0, 4, 1, 2])
    adv, _ = group_relative_advantages(REWARDS, GROUPS)
    adv_p, _ = group_relative_advantages(REWARDS[perm], GROUPS[perm])
    assert close(adv_p, adv[perm])


def test_group_relative_advantages_empty_round():
    """A round where every sample was dropped (reward abstained) has no records: zero advantages out."""
    adv, _ = group_relative_advantages(torch.tensor([]), torch.tensor([], dtype=torch.long))
    assert adv.shape == (0,)


# ---------------------------------------------------------------- clipped surrogate
# Row 0: A = +2; row 1: A = -1. log-ratio d per token; the last column is masked out with d = 2.
D = torch.tensor([[0.5, 0.0, 2.0], [-0.5, 0.5, 2.0]])
ADV = torch.tensor([2.0, -1.0])
MASK = torch.tensor([[1.0, 1, 0], [1, 1, 0]])


def test_clipped_surrogate_by_hand():
    """clip_low = clip_high = 0.2, so the clip range is [0.8, 1.2].
    (0,0) ratio e^{.5}=1.64872 → 1.2, A=+2 → -min(3.29744, 2.4) = -2.4            (clipped)
    (0,1) ratio 1, A=+2 → -2                                                        (not clipped)
    (1,0) ratio e^{-.5}=.60653 → .8, A=-1 → -min(-.60653, -.8) = .8                 (clipped)
    (1,1) ratio 1.64872 → 1.2, A=-1 → -min(-1.64872, -1.2) = 1.64872               (not clipped: pessimistic)
    clip_frac = 2/4 = .5; ratio_mean = (1.64872+1+.60653+1.64872)/4 = 1.22599; ratio_max = 1.64872 (the
    masked e^2 = 7.389 does not count)."""
    old = torch.zeros(2, 3)
    logp = (old + D).requires_grad_(True)
    loss, m = clipped_surrogate(logp, old, ADV, MASK, 0.2, 0.2)
    assert close(loss[:, :2], [[-2.4, -2.0], [0.8, 1.64872]])
    assert close(m["clip_frac"], 0.5)
    assert close(m["ratio_mean"], 1.22599)
    assert close(m["ratio_max"], 1.64872)
    assert not any(v.requires_grad for v in m.values())
    # gradients: clipped tokens get none; unclipped d(-ratio·A)/dd = -ratio·A: (0,1) → -2, (1,1) → +1.64872
    (loss * MASK).sum().backward()
    assert close(logp.grad, [[0.0, -2.0, 0.0], [0.0, 1.64872, 0.0]])


def test_clipped_surrogate_asymmetric_clip_and_token_advantages():
    """clip_low=.1, clip_high=.3 → range [.9, 1.3]. Token-level A [B, T] = [[1, -1]], d = [.5, -.5]:
    (0,0) ratio 1.64872 → 1.3, A=+1 → -min(1.64872, 1.3) = -1.3 (clipped);
    (0,1) ratio .60653 → .9,  A=-1 → -min(-.60653, -.9) = .9 (clipped). clip_frac = 1, ratio_max = 1.64872."""
    old = torch.zeros(1, 2)
    loss, m = clipped_surrogate(old + torch.tensor([[0.5, -0.5]]), old, torch.tensor([[1.0, -1.0]]),
                                torch.ones(1, 2), 0.1, 0.3)
    assert close(loss, [[-1.3, 0.9]])
    assert close(m["clip_frac"], 1.0)
    assert close(m["ratio_max"], 1.64872)


def test_clipped_surrogate_on_policy_is_minus_advantage():
    """d = 0 everywhere: ratio 1, nothing clipped, loss = -A per token, gradient = -A."""
    logp = torch.zeros(2, 2, requires_grad=True)
    loss, m = clipped_surrogate(logp, torch.zeros(2, 2), torch.tensor([3.0, -1.0]), torch.ones(2, 2), .2, .2)
    assert close(loss, [[-3.0, -3.0], [1.0, 1.0]])
    assert m["clip_frac"].item() == 0.0 and close(m["ratio_max"], 1.0)
    loss.sum().backward()
    assert close(logp.grad, [[-3.0, -3.0], [1.0, 1.0]])


# ---------------------------------------------------------------- KL estimators
def test_kl_estimators_by_hand():
    """d = ln .5 - ln .25 = ln 2 = .69315: k1 = .69315, k2 = d²/2 = .24023, k3 = e^{-d} - 1 + d = .5-1+.69315
    = .19315. d = -ln 2: k1 = -.69315, k2 = .24023, k3 = 2 - 1 - .69315 = .30685. d = 0: all 0."""
    lp = torch.tensor([[LN(0.5), LN(0.25), LN(0.3)]])
    ref = torch.tensor([[LN(0.25), LN(0.5), LN(0.3)]])
    assert close(k1(lp, ref), [[0.69315, -0.69315, 0.0]])
    assert close(k2(lp, ref), [[0.24023, 0.24023, 0.0]])
    assert close(k3(lp, ref), [[0.19315, 0.30685, 0.0]])


def test_kl_estimators_expectation_equals_exact_kl():
    """π = (.5, .25, .25), π_ref = (.25, .25, .5): KL(π‖π_ref) = .5 ln2 + 0 + .25 ln .5 = .17329.
    Under samples from π, E[k1] = KL and E[k3] = Σ π(π_ref/π - 1) + KL = 0 + KL (both unbiased);
    k2 is biased: E[k2] = (.5·ln²2 + .25·ln²2)/2 = .18018."""
    p, q = torch.tensor([0.5, 0.25, 0.25]), torch.tensor([0.25, 0.25, 0.5])
    lp, lq = p.log()[None], q.log()[None]
    assert close((p * k1(lp, lq)[0]).sum(), 0.17329)
    assert close((p * k3(lp, lq)[0]).sum(), 0.17329)
    assert close((p * k2(lp, lq)[0]).sum(), 0.18018)
    assert (k3(torch.randn(4, 5), torch.randn(4, 5)) >= 0).all()


# ---------------------------------------------------------------- chunked log-probs (bounded memory)
def _reference_logprobs(logits, targets, temperature):
    return torch.log_softmax(logits.float() / temperature, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("chunk_elements", [1, 7 * 11, 10**9])
def test_chunked_token_logprobs_match_full_log_softmax_values_and_gradients(chunk_elements):
    """logit[t] − logsumexp in chunks (1 row, 7 rows, everything) = log_softmax's values and gradients."""
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, requires_grad=True)
    targets = torch.randint(0, 11, (3, 5))
    weights = torch.randn(3, 5)
    full = _reference_logprobs(logits, targets, 0.7)
    (g_full,) = torch.autograd.grad((full * weights).sum(), logits)
    chunked = token_logprobs(logits, targets, 0.7, chunk_elements=chunk_elements)
    (g_chunked,) = torch.autograd.grad((chunked * weights).sum(), logits)
    assert torch.allclose(chunked, full, atol=1e-5) and torch.allclose(g_chunked, g_full, atol=1e-5)


def test_head_token_logprobs_never_builds_the_whole_logits_and_matches():
    """A head the fused path does not take (it has a bias) goes through checkpointed chunks of 2 rows:
    every head call sees ≤ 2 rows (also when backward recomputes them), and values and gradients
    (hidden and head weight) match the full computation."""
    from losses.common import head_token_logprobs
    torch.manual_seed(1)
    head = torch.nn.Linear(4, 13, bias=True)
    hidden = torch.randn(2, 3, 4, requires_grad=True)
    targets = torch.randint(0, 13, (2, 3))
    rows_seen = []
    handle = head.register_forward_hook(lambda m, i, o: rows_seen.append(o.shape[0]))
    got = head_token_logprobs(hidden, head, targets, 1.0, chunk_elements=2 * 13)
    got.sum().backward()
    handle.remove()
    assert max(rows_seen) == 2 and len(rows_seen) == 6  # 3 chunks forward + 3 recomputed in backward
    g_hidden, g_head = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    full = _reference_logprobs(head(hidden), targets, 1.0)
    full.sum().backward()
    assert torch.allclose(got, full, atol=1e-5)
    assert torch.allclose(g_hidden, hidden.grad, atol=1e-5) and torch.allclose(g_head, head.weight.grad, atol=1e-5)


class LargestOp(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the largest tensor any op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_fused_linear_logprobs_values_gradients_and_bounded_buffers(dtype, tol):
    """The fused path (bias-free nn.Linear): values and gradients of hidden and weight equal
    log_softmax's (at T = 0.7, 11 rows in chunks of 3), and no op ever makes a tensor larger than one
    chunk of logits or the weight itself: the [rows, vocab] logits never exist at once."""
    from losses.common import head_token_logprobs
    torch.manual_seed(2)
    vocab, width, rows = 50, 8, 11
    head = torch.nn.Linear(width, vocab, bias=False).to(dtype)
    hidden = torch.randn(rows, width, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, vocab, (rows,))
    weights = torch.randn(rows)
    with LargestOp() as probe:
        got = head_token_logprobs(hidden, head, targets, 0.7, chunk_elements=3 * vocab, keep_elements=0)
        (got * weights).sum().backward()
    assert probe.largest <= max(3 * vocab, vocab * width) < rows * vocab
    g_hidden, g_weight = hidden.grad.float(), head.weight.grad.float()
    h32 = hidden.detach().float().requires_grad_()
    w32 = head.weight.detach().float().requires_grad_()
    want = _reference_logprobs(h32 @ w32.t(), targets, 0.7)
    (want * weights).sum().backward()
    assert got.dtype == torch.float32 and torch.allclose(got, want, atol=tol)
    assert torch.allclose(g_hidden, h32.grad, atol=tol) and torch.allclose(g_weight, w32.grad, atol=tol)
    # within the keep budget: one piece, its softmax kept for backward (no recompute), the same results
    hidden.grad, head.weight.grad = None, None
    with LargestOp() as probe:
        kept = head_token_logprobs(hidden, head, targets, 0.7, chunk_elements=3 * vocab, keep_elements=rows * vocab)
        (kept * weights).sum().backward()
    assert probe.largest >= rows * vocab  # the whole [rows, vocab] was held
    assert torch.allclose(kept, want, atol=tol)
    assert torch.allclose(hidden.grad.float(), h32.grad, atol=tol)
    assert torch.allclose(head.weight.grad.float(), w32.grad, atol=tol)
