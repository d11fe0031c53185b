"""losses/value.py against numbers worked out by hand (derivations in the docstrings)."""
from __future__ import annotations

import torch

from losses.value import clipped_value_loss, explained_variance, gae, token_rewards, whiten


def close(a, b, tol=1e-5):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float), torch.as_tensor(b, dtype=torch.float),
                          atol=tol, rtol=0)


# ---------------------------------------------------------------- GAE
def test_gae_three_tokens_by_hand():
    """γ=0.9, λ=0.5, r=[0,0,1], V=[.5,.6,.7]: δ = [0.04, 0.03, 0.3]; A_2 = 0.3, A_1 = 0.03 + 0.45·0.3 = 0.165,
    A_0 = 0.04 + 0.45·0.165 = 0.11425; R = A + V."""
    r, v, m = torch.tensor([[0.0, 0, 1]]), torch.tensor([[0.5, 0.6, 0.7]]), torch.ones(1, 3)
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.5)
    assert close(adv, [[0.11425, 0.165, 0.3]])
    assert close(ret, [[0.61425, 0.765, 1.0]])


def test_gae_masks_with_different_starts_and_ends():
    """Row 0: the hand example after a 1-token prompt, with one padding position after it (whose reward
    and value must be ignored). Row 1: two completion tokens starting at position 2, γ=0.9, λ=0.5,
    r=[0, 2], V=[1, 0.5]: A_3 = 2 - 0.5 = 1.5, A_2 = (0.9·0.5 - 1) + 0.45·1.5 = 0.125. Row 2: empty mask."""
    r = torch.tensor([[5.0, 0, 0, 1, 7], [3.0, 3, 0, 2, 0], [1.0, 1, 1, 1, 1]])
    v = torch.tensor([[9.0, 0.5, 0.6, 0.7, 9], [9.0, 9, 1, 0.5, 9], [1.0, 1, 1, 1, 1]])
    m = torch.tensor([[0.0, 1, 1, 1, 0], [0.0, 0, 1, 1, 0], [0.0, 0, 0, 0, 0]])
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.5)
    assert close(adv, [[0, 0.11425, 0.165, 0.3, 0], [0, 0, 0.125, 1.5, 0], [0] * 5])
    assert close(ret, [[0, 0.61425, 0.765, 1.0, 0], [0, 0, 1.125, 2.0, 0], [0] * 5])
    # rows are independent: each row alone gives the same numbers
    for i in range(3):
        a_i, r_i = gae(r[i : i + 1], v[i : i + 1], m[i : i + 1], 0.9, 0.5)
        assert close(a_i, adv[i : i + 1]) and close(r_i, ret[i : i + 1])


def test_gae_skips_a_gap_in_the_mask():
    """A masked position inside the span passes nothing on: [1, 0, 1] ≡ the 2-token row [t0, t2]."""
    r, v = torch.tensor([[0.0, 5, 1]]), torch.tensor([[0.5, 9, 0.7]])
    adv, _ = gae(r, v, torch.tensor([[1.0, 0, 1]]), 0.9, 0.5)
    a2 = 1 - 0.7
    assert close(adv, [[(0.9 * 0.7 - 0.5) + 0.45 * a2, 0, a2]])


def test_gae_gamma_lambda_one_is_return_minus_value():
    """γ = λ = 1: A_t = (sum of future rewards) - V_t, so R_t = reward-to-go."""
    r, v, m = torch.tensor([[0.1, 0.2, 1.0]]), torch.tensor([[0.3, -0.2, 0.4]]), torch.ones(1, 3)
    adv, ret = gae(r, v, m, 1.0, 1.0)
    assert close(ret, [[1.3, 1.2, 1.0]]) and close(adv, [[1.0, 1.4, 0.6]])


# ---------------------------------------------------------------- rewards, whitening
def test_token_rewards_by_hand():
    """Score at the last completion token of each row, minus kl_coef·kl on every completion token."""
    mask = torch.tensor([[0.0, 1, 1], [1.0, 1, 0], [0.0, 0, 0]])
    score = torch.tensor([2.0, -1.0, 5.0])
    assert close(token_rewards(score, mask), [[0, 0, 2], [0, -1, 0], [0, 0, 0]])
    kl = torch.tensor([[9.0, 0.5, 1], [0.2, -0.4, 9], [1.0, 1, 1]])
    assert close(token_rewards(score, mask, kl, kl_coef=0.1), [[0, -0.05, 1.9], [-0.02, -0.96, 0], [0, 0, 0]])


def test_whiten_by_hand():
    """x over the mask = [1, 3, 5, 7]: mean 4, population var 5 → (x-4)/√5; the 99s are ignored."""
    x = torch.tensor([[1.0, 3, 99], [99.0, 5, 7]])
    m = torch.tensor([[1.0, 1, 0], [0.0, 1, 1]])
    s = 5 ** 0.5
    assert close(whiten(x, m), [[-3 / s, -1 / s, 0], [0, 1 / s, 3 / s]])
    assert close(whiten(x, m, shift_mean=False), [[-3 / s + 4, -1 / s + 4, 0], [0, 1 / s + 4, 3 / s + 4]])
    w = whiten(x, m)
    assert close((w * m).sum() / m.sum(), 0.0)


# ---------------------------------------------------------------- value loss
def test_clipped_value_loss_by_hand():
    """ε=0.2, V_old=0, R=1: V=0.5 → V_clip=0.2, L = 0.5·max(0.25, 0.64) = 0.32 (clipped branch);
    V=0.1 → V_clip=0.1, L = 0.5·0.81 = 0.405; V=-0.5 → V_clip=-0.2: 0.5·max(2.25, 1.44) = 1.125 (unclipped
    larger). The masked 4th token is left out of the metrics."""
    v = torch.tensor([[0.5, 0.1, -0.5, 3.0]], requires_grad=True)
    old, ret, m = torch.zeros(1, 4), torch.ones(1, 4), torch.tensor([[1.0, 1, 1, 0]])
    loss, metrics = clipped_value_loss(v, old, ret, m, clip_range=0.2)
    assert close(loss[:, :3], [[0.32, 0.405, 1.125]])
    assert close(metrics["vf_clip_frac"], 1 / 3)
    assert close(metrics["value_mean"], (0.5 + 0.1 - 0.5) / 3)
    (loss * m).sum().backward()
    # clipped branch taken at token 0: no gradient through V there; elsewhere d/dV 0.5(V-R)² = V - R
    assert close(v.grad, [[0.0, -0.9, -1.5, 0.0]])


def test_explained_variance():
    ret, m = torch.tensor([[1.0, 2, 3, 50]]), torch.tensor([[1.0, 1, 1, 0]])
    assert close(explained_variance(ret, ret, m), 1.0)
    assert close(explained_variance(torch.full((1, 4), 2.0), ret, m), 0.0)  # the mean predicts nothing
    # V = R + [1, -1, 0]: Var[R-V] = 2/3, Var[R] = 2/3 → 0
    assert close(explained_variance(ret + torch.tensor([[-1.0, 1, 0, 0]]), ret, m), 0.0)
    assert close(explained_variance(ret, torch.ones(1, 4), m), 0.0)  # constant returns: 0, not NaN
