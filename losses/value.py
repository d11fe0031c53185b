"""PPO's critic maths (Schulman et al. 2016, 2017; Ouyang et al. 2022): per-token rewards, generalised
advantage estimation, masked whitening and the clipped value loss.

Shapes: every per-token tensor is [B, T], aligned with the completion mask of
data_modules.experience.collate (position t holds completion token t + 1 of input_ids; the mask is 1 on
one contiguous span per row that starts and ends at different positions in different rows). V(s_t) is
the critic's value of the prefix before completion token t + 1 is chosen; the state after a row's last
completion token is terminal (value 0).
"""
from __future__ import annotations

import torch

from losses.common import masked_mean


def token_rewards(score: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None,
                  kl_coef: float = 0.0) -> torch.Tensor:
    """r_t = score · 1[t = last completion token] - kl_coef · kl_t · m_t  (InstructGPT's "KL in reward").

    score [B] (one scalar per completion), mask [B, T], kl [B, T] a per-token KL estimate (e.g. the k1
    log-ratio log μ - log π_ref of the sampled tokens) or None. A row with an empty mask gets no reward.
    Example: score [2], mask [[0, 1, 1]], kl [[9, 0.5, 1]], kl_coef 0.1 → [[0, -0.05, 2 - 0.1]] = [[0, -0.05, 1.9]].
    """
    T = mask.shape[-1]
    last = T - 1 - mask.flip(-1).argmax(-1)  # index of the last 1 of each row
    rewards = torch.zeros_like(mask, dtype=torch.float)
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards[rows, last] = score.float() * mask[rows, last].float()
    if kl is not None and kl_coef:
        rewards = rewards - kl_coef * kl.float() * mask
    return rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over the masked positions of each row.

        δ_t = r_t + γ V_{t'} - V_t          t' = the next masked-in position of the row (V = 0 past the last)
        A_t = δ_t + γ λ A_{t'}              (A = 0 past the last)
        R_t = A_t + V_t                     the value target (λ-return)

    Masked-out positions (prompt, padding, or a gap) are skipped: they neither add reward nor pass on a
    value, and get A = R = 0. rewards, values, mask [B, T] → (advantages [B, T], returns [B, T]).

    By hand, one row of 3 completion tokens, γ = 0.9, λ = 0.5 (γλ = 0.45), r = [0, 0, 1], V = [.5, .6, .7]:
        t=2: δ = 1 + 0.9·0 - 0.7 = 0.3                     A = 0.3
        t=1: δ = 0 + 0.9·0.7 - 0.6 = 0.03                  A = 0.03 + 0.45·0.3 = 0.165
        t=0: δ = 0 + 0.9·0.6 - 0.5 = 0.04                  A = 0.04 + 0.45·0.165 = 0.11425
        R = A + V = [0.61425, 0.765, 1.0]
    The same row shifted right by a prompt (mask [0, 1, 1, 1]) gives [0, 0.11425, 0.165, 0.3].
    """
    rewards, values, mask = rewards.float(), values.float(), mask.float()
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[-1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = adv * m
        next_adv = torch.where(m > 0, adv, next_adv)  # carried across masked positions unchanged
        next_value = torch.where(m > 0, values[:, t], next_value)
    returns = (advantages + values) * mask
    return advantages, returns


def whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
           ) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the masked positions (population variance); with
    shift_mean=False the mean is added back (only the scale changes). Masked-out positions are 0.
    Example: x = [[1, 3, 99]], mask [[1, 1, 0]]: mean 2, var 1 → [[-1, 1, 0]]; shift_mean=False → [[1, 3, 0]].
    """
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    out = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def explained_variance(predictions: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """1 - Var[R - V] / Var[R] over the mask: 1 = the critic predicts every return, 0 = no better than
    their mean, < 0 = worse. 0 when the returns have no variance. Detached."""
    predictions, targets = predictions.detach().float(), targets.detach().float()
    var_r = masked_mean((targets - masked_mean(targets, mask)) ** 2, mask)
    err = targets - predictions
    var_err = masked_mean((err - masked_mean(err, mask)) ** 2, mask)
    return torch.where(var_r > 0, 1 - var_err / var_r.clamp_min(1e-12), torch.zeros_like(var_r))


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor, clip_range: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped value loss, per token (the caller aggregates):

        V_clip = V_old + clip(V - V_old, -ε, +ε)
        L_t    = 0.5 · max((V - R)², (V_clip - R)²)

    values (current critic, with grad), old_values (the critic at annotation), returns: [B, T].
    By hand, ε = 0.2, V_old = 0, R = 1: V = 0.5 → V_clip = 0.2, L = 0.5·max(0.25, 0.64) = 0.32 (clipped);
    V = 0.1 → V_clip = 0.1, L = 0.5·0.81 = 0.405 (not clipped).
    Metrics (detached, masked): vf_clip_frac (share of tokens whose clipped branch is the larger),
    value_mean, explained_variance (of the returns by V).
    """
    values = values.float()
    clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    unclipped_sq, clipped_sq = (values - returns) ** 2, (clipped - returns) ** 2
    loss = 0.5 * torch.maximum(unclipped_sq, clipped_sq)
    with torch.no_grad():
        metrics = {"vf_clip_frac": masked_mean((clipped_sq > unclipped_sq).float(), mask),
                   "value_mean": masked_mean(values.detach(), mask),
                   "explained_variance": explained_variance(values, returns, mask)}
    return loss, metrics
