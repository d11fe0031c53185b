"""Supervised fine-tuning: negative log-likelihood of demonstration tokens."""
from __future__ import annotations

import torch


def nll_loss(logprobs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token NLL: loss[b, t] = -logprobs[b, t].

    logprobs [B, T] of the demonstration tokens, mask [B, T]. Returns the unreduced loss [B, T] and
    metrics {"target_prob": mean probability of the target token} (detached).
    """
    loss = -logprobs
    prob = (logprobs.detach().exp() * mask).sum() / mask.sum().clamp_min(1.0)
    return loss, {"target_prob": prob}
