"""Per-token estimators of KL(π ‖ π_ref) from samples of π (Schulman, "Approximating KL divergence", 2020).

With log-ratio d = logprobs - ref_logprobs (samples drawn from π):
    k1 = d                       unbiased, high variance, can be negative
    k2 = d² / 2                  biased, low variance
    k3 = exp(-d) - 1 + d         unbiased, low variance, always ≥ 0 (GRPO's choice)
All take and return [B, T]; the caller masks and aggregates.
"""
from __future__ import annotations

import torch


def k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return logprobs - ref_logprobs


def k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprobs - ref_logprobs) ** 2


def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    d = logprobs - ref_logprobs
    return torch.exp(-d) - 1.0 + d
