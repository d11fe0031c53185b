"""losses/preference.py against values worked out by hand (derivations in the docstrings).

Shared numbers. Pair 1: log π(y_w) = -1, log π(y_l) = -3, π_ref gives both -2, so the log-ratios are
+1 and -1 and the gap h = 1 - (-1) = 2. Pair 2: log π(y_w) = -2, log π(y_l) = -1, ref -2 and -2:
log-ratios 0 and +1, h = -1. Useful values: -log σ(1) = ln(1 + e⁻¹) = 0.31326, -log σ(-1) = 1.31326,
-log σ(-0.5) = ln(1 + e^0.5) = 0.97408, σ(1) = 0.73106, σ(-1) = 0.26894.
"""
from __future__ import annotations

import pytest
import torch

from losses.preference import (bradley_terry_loss, dpo_loss, implicit_rewards, ipo_loss, kto_loss,
                               kto_reference_point, pair_metrics, sequence_logps)

PC, PR = torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.0])
RC, RR = torch.tensor([-2.0, -2.0]), torch.tensor([-2.0, -2.0])


def close(a, b, tol=1e-4):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float), torch.as_tensor(b, dtype=torch.float),
                          atol=tol, rtol=0)


def test_sequence_logps_sum_and_mean_by_hand():
    """Row 0 keeps -2, -3 → sum -5, mean -2.5; row 1 keeps -4 → -4 both ways. An empty row gives 0."""
    tok = torch.tensor([[-1.0, -2, -3], [-4, -5, -6], [-1, -1, -1]])
    mask = torch.tensor([[0.0, 1, 1], [1, 0, 0], [0, 0, 0]])
    assert close(sequence_logps(tok, mask, average=False), [-5.0, -4.0, 0.0])
    assert close(sequence_logps(tok, mask, average=True), [-2.5, -4.0, 0.0])


def test_implicit_rewards_and_pair_metrics_by_hand():
    """β = 0.5: chosen rewards 0.5·(1, 0) = (0.5, 0), rejected 0.5·(-1, 1) = (-0.5, 0.5): means 0.25 and 0,
    per-pair margins (1, -0.5) → 0.25, accuracy 1/2. A tie counts ½: all-equal rewards score 0.5."""
    c, r = implicit_rewards(PC, RC, 0.5), implicit_rewards(PR, RR, 0.5)
    assert close(c, [0.5, 0.0]) and close(r, [-0.5, 0.5])
    m = pair_metrics(c, r)
    assert close(m["reward_chosen"], 0.25) and close(m["reward_rejected"], 0.0)
    assert close(m["reward_margin"], 0.25) and close(m["reward_acc"], 0.5)
    assert pair_metrics(torch.zeros(3), torch.zeros(3))["reward_acc"].item() == 0.5
    assert pair_metrics(torch.tensor([1.0, 0, 0]), torch.tensor([0.0, 0, 1]))["reward_acc"].item() == 0.5


def test_dpo_loss_by_hand():
    """β = 0.5: pair 1 βh = 1 → -log σ(1) = 0.31326; pair 2 βh = -0.5 → -log σ(-0.5) = 0.97408.
    Gradient: ∂L/∂log π(y_w) = -β σ(-βh) → pair 1: -0.5·0.26894 = -0.13447, and ∂L/∂log π(y_l) = +0.13447;
    no gradient reaches the reference."""
    pc, pr = PC.clone().requires_grad_(True), PR.clone().requires_grad_(True)
    rc = RC.clone().requires_grad_(True)
    loss, m = dpo_loss(pc, pr, rc, RR, beta=0.5, label_smoothing=0.0)
    assert close(loss, [0.31326, 0.97408])
    assert close(m["reward_acc"], 0.5) and close(m["reward_margin"], 0.25)
    assert not any(v.requires_grad for v in m.values())
    loss[0].backward()
    assert close(pc.grad, [-0.13447, 0.0]) and close(pr.grad, [0.13447, 0.0])


def test_dpo_label_smoothing_by_hand():
    """ε = 0.1, pair 1 (βh = 1): 0.9·0.31326 + 0.1·1.31326 = 0.41326. At h = 0 every ε gives ln 2."""
    loss, _ = dpo_loss(PC, PR, RC, RR, beta=0.5, label_smoothing=0.1)
    assert close(loss[0], 0.41326)
    flat, _ = dpo_loss(RC, RR, RC, RR, beta=0.5, label_smoothing=0.3)
    assert close(flat, [0.69315, 0.69315])
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(PC, PR, RC, RR, beta=0.5, label_smoothing=0.5)


def test_ipo_loss_by_hand():
    """τ = 0.5 → target gap 1/(2τ) = 1: pair 1 (h = 2) → (2-1)² = 1, pair 2 (h = -1) → (-2)² = 4.
    τ = 0.25 → target 2: pair 1 sits on it, loss 0 (IPO stops pushing); pair 2 → 9."""
    loss, m = ipo_loss(PC, PR, RC, RR, beta=0.5)
    assert close(loss, [1.0, 4.0]) and close(m["reward_acc"], 0.5)
    loss, _ = ipo_loss(PC, PR, RC, RR, beta=0.25)
    assert close(loss, [0.0, 9.0])
    with pytest.raises(ValueError, match="beta"):
        ipo_loss(PC, PR, RC, RR, beta=0.0)


def test_kto_reference_point_by_hand():
    """Mismatched log-ratios 0.5 and 1.5 → mean 1.0; a negative mean (-1) is clamped to 0; detached."""
    pol = torch.tensor([-2.0, -1.0], requires_grad=True)
    z0 = kto_reference_point(pol, torch.tensor([-2.5, -2.5]))
    assert close(z0, 1.0) and not z0.requires_grad
    assert kto_reference_point(torch.tensor([-3.0, -3.0]), torch.tensor([-2.0, -2.0])).item() == 0.0


def test_kto_loss_by_hand():
    """β = 0.5, λ_D = 1, λ_U = 1.5, z₀ = 1, log-ratios r = (1, -1), labels (desirable, undesirable).
    Desirable: λ_D(1 - σ(0.5·(1 - 1))) = 1 - σ(0) = 0.5.
    Undesirable: λ_U(1 - σ(0.5·(1 - (-1)))) = 1.5·(1 - σ(1)) = 1.5·0.26894 = 0.40341.
    Metrics: reward_chosen = β·1 = 0.5, reward_rejected = -0.5, margin 1, kl = z₀ = 1."""
    pol = torch.tensor([-1.0, -3.0], requires_grad=True)
    loss, m = kto_loss(pol, torch.tensor([-2.0, -2.0]), torch.tensor([True, False]), torch.tensor(1.0),
                       beta=0.5, desirable_weight=1.0, undesirable_weight=1.5)
    assert close(loss, [0.5, 0.40341])
    assert close(m["reward_chosen"], 0.5) and close(m["reward_rejected"], -0.5)
    assert close(m["reward_margin"], 1.0) and close(m["kl"], 1.0)
    # ∂/∂r of -λσ(β(r - z₀)) at r = z₀: -1·0.5·σ'(0) = -0.125; undesirable: +1.5·0.5·σ(1)σ(-1) = 0.14745
    loss.sum().backward()
    assert close(pol.grad, [-0.125, 0.14745])


def test_kto_loss_one_sided_batch_reports_only_present_side():
    """All desirable: no reward_rejected or reward_margin (they would be means of nothing)."""
    _, m = kto_loss(torch.tensor([-1.0]), torch.tensor([-1.0]), torch.tensor([True]), torch.tensor(0.0),
                    beta=0.1, desirable_weight=1.0, undesirable_weight=1.0)
    assert set(m) == {"kl", "reward_chosen"}


def test_bradley_terry_loss_by_hand():
    """Scores chosen (2, 0), rejected (1, 1): -log σ(1) = 0.31326, -log σ(-1) = 1.31326; accuracy 1/2,
    margin mean (1 + -1)/2 = 0. Centring c = 0.01 adds c·(r_w + r_l)² = 0.09 and 0.01."""
    c, r = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    loss, m = bradley_terry_loss(c, r, center_coef=0.0)
    assert close(loss, [0.31326, 1.31326])
    assert close(m["reward_acc"], 0.5) and close(m["reward_margin"], 0.0) and close(m["reward_chosen"], 1.0)
    loss, _ = bradley_terry_loss(c, r, center_coef=0.01)
    assert close(loss, [0.40326, 1.32326])
