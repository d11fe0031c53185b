"""Log-probs of targets and the one masked reduction every loss goes through."""
from __future__ import annotations

import torch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-prob of each target token under softmax(logits / temperature).

    logits [B, T, V], targets [B, T] (already shifted: targets[:, t] is predicted by logits[:, t]).
    Returns [B, T]. Uses log_softmax in float32 for stability.
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over positions where mask == 1 (0 if the mask is empty)."""
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def _token_mean(values, mask, max_len):
    return masked_mean(values, mask)


def _sequence_mean(values, mask, max_len):
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
    return per_seq.mean()


def _sequence_sum_norm(values, mask, max_len):
    # Dr.GRPO: sum over tokens divided by a constant (max generation length), mean over sequences,
    # so that long and short answers are not weighted by their own length.
    return ((values * mask).sum(-1) / max_len).mean()


AGGREGATIONS = {
    "token_mean": _token_mean,
    "seq_mean_token_mean": _sequence_mean,
    "seq_mean_token_sum_norm": _sequence_sum_norm,
}


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean",
              max_len: int | None = None) -> torch.Tensor:
    """Reduce a per-token quantity [B, T] under `mask` [B, T] to a scalar.

    token_mean:               sum(v·m) / sum(m)                 (every token weighs the same)
    seq_mean_token_mean:      mean_b[ sum_t(v·m) / sum_t(m) ]   (every sequence weighs the same)
    seq_mean_token_sum_norm:  mean_b[ sum_t(v·m) / max_len ]    (Dr.GRPO; max_len defaults to T)
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation mode {mode!r}; choose one of {sorted(AGGREGATIONS)}")
    return AGGREGATIONS[mode](values, mask, max_len or values.shape[-1])
