"""Preference losses: DPO, IPO, KTO and the Bradley-Terry reward-model loss.

Pure functions of per-sequence quantities [B]: a sequence's log-prob log π(y|x) is the sum of its
completion tokens' log-probs (`sequence_logps`), π_ref is the frozen reference policy, β (IPO's τ) the
strength of the pull towards it. Each loss returns an unreduced loss [B] (the caller takes the mean)
and a dict of detached scalar metrics with the names every trainer logs under `train/`:

    reward_chosen    mean implicit reward β·(log π(y_w|x) - log π_ref(y_w|x)) of the preferred answers
    reward_rejected  the same for the dispreferred answers
    reward_margin    mean of reward_chosen - reward_rejected (per pair)
    reward_acc       share of pairs ranked right: chosen reward higher, ties counting ½ (so a policy
                     equal to its reference, all implicit rewards 0, scores 0.5: chance)

For the Bradley-Terry loss the "reward" is the reward model's scalar score.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def sequence_logps(token_logps: torch.Tensor, mask: torch.Tensor, average: bool) -> torch.Tensor:
    """Σ_t mask·logp over each row [B, T] → [B]; `average` divides by the row's token count instead
    (a length-normalised log-prob, as SimPO and some IPO implementations use)."""
    total = (token_logps * mask).sum(-1)
    return total / mask.sum(-1).clamp_min(1.0) if average else total


def implicit_rewards(policy_logps: torch.Tensor, ref_logps: torch.Tensor, beta: float) -> torch.Tensor:
    """DPO's implicit reward r(x, y) = β · log(π(y|x) / π_ref(y|x)) (Rafailov et al. 2023, eq. 5), [B]."""
    return beta * (policy_logps - ref_logps)


def pair_metrics(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> dict[str, torch.Tensor]:
    """reward_chosen/_rejected/_margin/_acc of paired rewards [B] (detached means)."""
    c, r = chosen_rewards.detach(), rejected_rewards.detach()
    return {"reward_chosen": c.mean(), "reward_rejected": r.mean(), "reward_margin": (c - r).mean(),
            "reward_acc": ranked_right(c, r).mean()}


def ranked_right(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """1 where chosen > rejected, ½ on ties, 0 otherwise, [B]."""
    return (chosen > rejected).float() + 0.5 * (chosen == rejected).float()


def _log_ratio_gap(pc, pr, rc, rr) -> torch.Tensor:
    return (pc - rc) - (pr - rr)


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float, label_smoothing: float
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO's sigmoid loss (Rafailov et al. 2023, eq. 7) with conservative label smoothing ε
    (Mitchell 2023, "cDPO": the label is assumed flipped with probability ε):

        h = [log π(y_w|x) - log π_ref(y_w|x)] - [log π(y_l|x) - log π_ref(y_l|x)]
        L = -(1 - ε) · log σ(β h) - ε · log σ(-β h)

    All inputs [B] sequence log-probs; ε = 0 is plain DPO. Returns loss [B] and the pair metrics.
    """
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 0.5)")
    h = _log_ratio_gap(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    loss = -(1 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    return loss, pair_metrics(implicit_rewards(policy_chosen, ref_chosen, beta),
                              implicit_rewards(policy_rejected, ref_rejected, beta))


def ipo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """IPO (Azar et al. 2023, "A General Theoretical Paradigm...", eq. 17), with τ = beta:

        h = [log π(y_w|x) - log π_ref(y_w|x)] - [log π(y_l|x) - log π_ref(y_l|x)]
        L = (h - 1 / (2τ))²

    A squared loss that regresses the log-ratio gap to 1/(2τ) instead of pushing it to infinity, so it
    does not overfit deterministic preferences. Inputs [B]; returns loss [B] and the pair metrics
    (implicit rewards scaled by τ as in DPO).
    """
    if beta <= 0:
        raise ValueError(f"IPO needs beta (τ) > 0, got {beta}")
    h = _log_ratio_gap(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    loss = (h - 1.0 / (2.0 * beta)) ** 2
    return loss, pair_metrics(implicit_rewards(policy_chosen, ref_chosen, beta),
                              implicit_rewards(policy_rejected, ref_rejected, beta))


def kto_reference_point(policy_kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor) -> torch.Tensor:
    """KTO's reference point z₀ = max(0, KL̂(π ‖ π_ref)) (Ethayarajh et al. 2024, §4.1), estimated on
    mismatched pairs (x_i, y_j), j ≠ i, as the mean log-ratio; detached (no gradient flows through z₀)."""
    return (policy_kl_logps - ref_kl_logps).mean().clamp_min(0.0).detach()


def kto_loss(policy_logps: torch.Tensor, ref_logps: torch.Tensor, desirable: torch.Tensor,
             reference_point: torch.Tensor, beta: float, desirable_weight: float, undesirable_weight: float
             ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KTO (Ethayarajh et al. 2024, eq. 8) on unpaired examples, with r = log π(y|x) - log π_ref(y|x):

        v(x, y) = λ_D · σ(β (r - z₀))   if y is desirable
                  λ_U · σ(β (z₀ - r))   if y is undesirable
        L(x, y) = λ_y - v(x, y)

    policy_logps, ref_logps [B]; desirable [B] bool; reference_point z₀ (scalar, `kto_reference_point`).
    Returns loss [B] and metrics: reward_chosen / reward_rejected (mean β·r of the desirable /
    undesirable examples, present only when the batch has some), reward_margin (their difference when
    both exist) and kl (z₀).
    """
    d = desirable.bool()
    r = policy_logps - ref_logps
    z0 = reference_point.detach()
    gain = torch.where(d, desirable_weight * torch.sigmoid(beta * (r - z0)),
                       undesirable_weight * torch.sigmoid(beta * (z0 - r)))
    weight = torch.where(d, torch.full_like(r, desirable_weight), torch.full_like(r, undesirable_weight))
    loss = weight - gain
    rewards = (beta * r).detach()
    metrics = {"kl": z0}
    if d.any():
        metrics["reward_chosen"] = rewards[d].mean()
    if (~d).any():
        metrics["reward_rejected"] = rewards[~d].mean()
    if d.any() and (~d).any():
        metrics["reward_margin"] = metrics["reward_chosen"] - metrics["reward_rejected"]
    return loss, metrics


def bradley_terry_loss(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor, center_coef: float
                       ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Reward-model loss under the Bradley-Terry model P(y_w ≻ y_l) = σ(r(y_w) - r(y_l)) (Bradley & Terry
    1952; Ouyang et al. 2022, eq. 1), plus an optional centring term (Eisenstein et al. 2023) that pins
    the free offset of r near zero:

        L = -log σ(r_w - r_l) + c · (r_w + r_l)²

    chosen_scores, rejected_scores [B] (the reward model's scalar outputs). Returns loss [B] and the pair
    metrics of the raw scores.
    """
    loss = -F.logsigmoid(chosen_scores - rejected_scores)
    if center_coef:
        loss = loss + center_coef * (chosen_scores + rejected_scores) ** 2
    return loss, pair_metrics(chosen_scores, rejected_scores)
