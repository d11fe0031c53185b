"""Group-relative advantages (GRPO, Dr.GRPO)."""
from __future__ import annotations

import torch


def group_relative_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-6
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO advantage: A_i = (r_i - mean(r_g)) / (std(r_g) + eps), g = group of i (Shao et al. 2024, §4.1.2).

    rewards [N], group_ids [N] (any integers; groups need not be contiguous or equal-sized, so a group
    that lost an abstained sample still works). scale_by_std=False gives Dr.GRPO's A_i = r_i - mean(r_g)
    (Liu et al. 2025). std is the population std. Returns advantages [N] and {"frac_zero_std": share of
    groups whose rewards are all equal: they carry no learning signal}.
    """
    if rewards.numel() == 0:
        return rewards.float(), {"frac_zero_std": torch.tensor(float("nan"))}
    _, inv = torch.unique(group_ids, return_inverse=True)
    n_groups = int(inv.max()) + 1
    r = rewards.float()
    count = torch.zeros(n_groups).scatter_add_(0, inv, torch.ones_like(r))
    mean = torch.zeros(n_groups).scatter_add_(0, inv, r) / count
    centred = r - mean[inv]
    var = torch.zeros(n_groups).scatter_add_(0, inv, centred**2) / count
    std = var.sqrt()
    adv = centred / (std[inv] + eps) if scale_by_std else centred
    return adv, {"frac_zero_std": (std < eps).float().mean()}
