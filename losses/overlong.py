"""DAPO's overlong reward shaping (Yu et al. 2025, "DAPO", §3.4, eq. 13): a length penalty added to
the reward before advantages, so that a completion cut at the length limit is not scored like a
finished one, while a long but finished one is only nudged.

With L_max the length limit (generator.max_new_tokens) and L_cache the soft band below it:

    R_length(y) = 0                              |y| ≤ L_max − L_cache
                = ((L_max − L_cache) − |y|) / L_cache   L_max − L_cache < |y| ≤ L_max
                = −1                             L_max < |y|

Hand-worked (L_max = 20, L_cache = 4, so the band is 17..20): |y| = 10 → 0, 16 → 0, 17 → −0.25,
18 → −0.5, 20 → −1, 25 → −1. A sampler stops at L_max, so a truncated completion has |y| = L_max and
gets −1 from the middle line already.
"""
from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """R_length per sample: lengths [N] (completion tokens) → penalties [N] in [−1, 0], float."""
    if not 0 < cache_len <= max_len:
        raise ValueError(f"overlong cache length {cache_len} must be in 1..{max_len} (the length limit)")
    expected = max_len - cache_len
    soft = (expected - lengths.float()) / cache_len
    return torch.where(lengths <= expected, torch.zeros_like(soft), soft.clamp_min(-1.0))


def truncated(lengths: torch.Tensor, finished: torch.Tensor, max_len: int) -> torch.Tensor:
    """Which samples the length limit cut (DAPO's overlong filtering masks them out of the loss):
    lengths [N], finished [N] bool (ended at a stop id) → [N] bool, |y| ≥ L_max and not finished."""
    return (lengths >= max_len) & ~finished
