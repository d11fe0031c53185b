"""Clipped policy-gradient surrogate shared by GRPO and PPO."""
from __future__ import annotations

import torch

from losses.common import masked_mean, weighted_share


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped objective as a per-token loss (Schulman et al. 2017, eq. 7), negated to minimise:

        ratio = exp(logprobs - old_logprobs)
        loss  = -min(ratio · A, clip(ratio, 1 - clip_low, 1 + clip_high) · A)

    logprobs, old_logprobs, mask: [B, T]; advantages [B] (one per sequence, broadcast) or [B, T].
    old_logprobs are the behaviour log-probs recorded at sampling time. Metrics (detached, masked):
    clip_frac (share of tokens where the clipped branch is taken), adv_clip_frac (the same share weighted by
    |A|: Σ clipped·|A|·m / Σ |A|·m, the part of the advantage signal a clip takes away; 0 when Σ |A|·m = 0),
    ratio_mean, ratio_max.
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        took_clip = (clipped < unclipped).float()
        r = ratio.detach()
        metrics = {
            "clip_frac": masked_mean(took_clip, mask),
            "adv_clip_frac": weighted_share(took_clip, mask * advantages.detach().abs().expand_as(took_clip)),
            "ratio_mean": masked_mean(r, mask),
            "ratio_max": (r * mask).max() if mask.any() else r.new_zeros(()),
        }
    return loss, metrics
