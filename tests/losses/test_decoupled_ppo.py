"""correction=decoupled_ppo (losses/correction.py) against values worked out by hand, and its identity with
ppo_clip on fresh data (π_prox = μ), in value and gradient.

One token, A = 1, ε_low = ε_high = 0.2, cap = 2, μ = 0.2, π_prox = 0.5 (behaviour weight π_prox/μ = 2.5,
truncated to 2):
    π = 0.55: r = π/π_prox = 1.1, inside the clip range: L = -2·1.1·1 = -2.2; ∂L/∂log π = -2·r·A = -2.2
    π = 0.70: r = 1.4 > 1.2: the clipped branch min(1.4, 1.2) = 1.2: L = -2·1.2 = -2.4; ∂L/∂log π = 0
A = -1, π = 0.3: r = 0.6 < 0.8: min(-0.6, -0.8) = -0.8: L = -2·(-0.8) = 1.6; ∂L/∂log π = 0
μ = 0.4, π_prox = 0.5 (weight 1.25, not truncated), π = 0.55, A = 1: L = -1.25·1.1 = -1.375, gradient -1.375.
"""
from __future__ import annotations

import math

import pytest
import torch

from losses.correction import decoupled_ppo, ppo_clip

KW = {"clip_low": 0.2, "clip_high": 0.2}


def one_token(pi: float, prox: float, mu: float, advantage: float):
    logp = torch.tensor([[math.log(pi)]], requires_grad=True)
    loss, metrics = decoupled_ppo(logp, torch.tensor([[math.log(mu)]]), torch.tensor([advantage]),
                                  torch.ones(1, 1), prox_logprobs=torch.tensor([[math.log(prox)]]), cap=2.0, **KW)
    loss.sum().backward()
    return loss.item(), logp.grad.item(), metrics


@pytest.mark.parametrize("pi,prox,mu,advantage,value,grad,truncated", [
    (0.55, 0.5, 0.2, 1.0, -2.2, -2.2, 1.0),
    (0.70, 0.5, 0.2, 1.0, -2.4, 0.0, 1.0),
    (0.30, 0.5, 0.2, -1.0, 1.6, 0.0, 1.0),
    (0.55, 0.5, 0.4, 1.0, -1.375, -1.375, 0.0),
])
def test_hand_worked_values_and_gradients(pi, prox, mu, advantage, value, grad, truncated):
    loss, g, metrics = one_token(pi, prox, mu, advantage)
    assert loss == pytest.approx(value, abs=1e-5) and g == pytest.approx(grad, abs=1e-5)
    assert metrics["behaviour_trunc_frac"].item() == truncated
    assert metrics["behaviour_ratio_mean"].item() == pytest.approx(min(prox / mu, 1e9), rel=1e-5)
    assert metrics["ratio_mean"].item() == pytest.approx(pi / prox, rel=1e-5)  # the surrogate's r = π/π_prox


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("per_token_advantages", [False, True])
def test_on_fresh_data_it_is_ppo_clip_exactly(level, per_token_advantages):
    """π_prox = μ (a record sampled by the weights that start the round): weight 1, the surrogate against
    μ: the same per-token loss and the same gradient as ppo_clip, bit for bit."""
    g = torch.Generator().manual_seed(0)
    mu = -torch.rand(4, 6, generator=g) * 3
    drift = torch.randn(4, 6, generator=g) * 0.3  # π moved away from μ (several updates into the round)
    mask = (torch.rand(4, 6, generator=g) > 0.2).float()
    adv = torch.randn(4, 6, generator=g) if per_token_advantages else torch.randn(4, generator=g)
    a = (mu + drift).clone().requires_grad_(True)
    b = (mu + drift).clone().requires_grad_(True)
    la, ma = decoupled_ppo(a, mu, adv, mask, prox_logprobs=mu, cap=2.0, level=level, **KW)
    lb, mb = ppo_clip(b, mu, adv, mask, level=level, **KW)
    (la * mask).sum().backward()
    (lb * mask).sum().backward()
    assert torch.equal(la, lb) and torch.equal(a.grad, b.grad)
    assert torch.equal(ma["clip_frac"], mb["clip_frac"]) and ma["behaviour_ratio_max"].item() == 1.0


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="cap=0.5"):
        decoupled_ppo(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1),
                      prox_logprobs=torch.zeros(1, 1), cap=0.5, **KW)
