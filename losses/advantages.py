"""Outcome-reward advantages from groups of samples per prompt: GRPO, Dr.GRPO, RLOO, REINFORCE++-baseline.

Each takes rewards [N] and group ids [N] (any integers; groups need not be contiguous or equal-sized, so
a group that lost an abstained sample still works) and returns one advantage per sample [N] (every
completion token of a sample shares it) and detached metrics, logged per round as rollout/<name>.
"""
from __future__ import annotations

import torch

EPS = 1e-6              # a group std under this is zero: the group's rewards are all equal
WHITEN_VAR_MIN = 1e-8   # batch whitening divides by sqrt(max(var, this)), as OpenRLHF does


def _group_sum(values: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """Σ of values [N] over each group, inv [N] = each sample's group index in 0..G-1 → [G]."""
    return values.new_zeros(int(inv.max()) + 1).scatter_add_(0, inv, values)


def _group_stats(rewards: torch.Tensor, group_ids: torch.Tensor):
    """The group arithmetic every estimator here shares: rewards as float r [N], each sample's group
    index inv [N] (0..G-1, groups found by id, not position), and per group its size count [G], mean
    reward mean [G] and population std [G]. Needs N > 0."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    r = rewards.float()
    count = _group_sum(torch.ones_like(r), inv)
    mean = _group_sum(r, inv) / count
    std = (_group_sum((r - mean[inv]) ** 2, inv) / count).sqrt()
    return r, inv, count, mean, std


def _no_samples(rewards: torch.Tensor, *metrics: str):
    """A round where every sample was dropped (reward abstained): no advantages, NaN metrics."""
    return rewards.float(), {name: torch.tensor(float("nan")) for name in metrics}


def _group_metrics(count: torch.Tensor, std: torch.Tensor) -> dict[str, torch.Tensor]:
    """Share of groups whose rewards are all equal (no learning signal; lone samples included) and of
    groups of one sample (no one to compare with), from per-group size and std [G]."""
    return {"frac_zero_std": (std < EPS).float().mean(), "frac_singleton": (count == 1).float().mean()}


def _whiten(adv: torch.Tensor) -> torch.Tensor:
    """(adv - batch mean) / batch std over all N samples (population std, floored at √WHITEN_VAR_MIN)."""
    centred = adv - adv.mean()
    return centred * (centred**2).mean().clamp_min(WHITEN_VAR_MIN).rsqrt()


def group_relative_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale_by_std: bool = True, eps: float = EPS
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO advantage: A_i = (r_i - mean(r_g)) / (std(r_g) + eps), g = group of i (Shao et al. 2024, §4.1.2).

    rewards [N], group_ids [N] (any integers; groups need not be contiguous or equal-sized, so a group
    that lost an abstained sample still works). scale_by_std=False gives Dr.GRPO's A_i = r_i - mean(r_g)
    (Liu et al. 2025). std is the population std. Returns advantages [N] and {"frac_zero_std": share of
    groups whose rewards are all equal: they carry no learning signal}.
    """
    if rewards.numel() == 0:
        return _no_samples(rewards, "frac_zero_std")
    r, inv, _, mean, std = _group_stats(rewards, group_ids)
    centred = r - mean[inv]
    adv = centred / (std[inv] + eps) if scale_by_std else centred
    return adv, {"frac_zero_std": (std < eps).float().mean()}


def rloo_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale_by_std: bool = False
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """RLOO advantage (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740): each sample's baseline
    is the mean reward of the OTHER samples of its group, A_i = r_i - mean_{j≠i in g} r_j = k/(k-1)·(r_i - mean(r_g))
    for a group of size k (unbiased: the baseline does not depend on the sample's own reward).

    rewards [N], group_ids [N] as in `group_relative_advantages`. A group of size 1 (the others were
    dropped) has no leave-one-out baseline: its advantage is 0 (so in TRL's RLOOTrainer too).
    scale_by_std=True whitens over the whole batch like `reinforce_pp_advantages` (the batch mean is 0 up
    to rounding: each group's advantages sum to 0), as TRL's normalize_advantages does (with the sample
    std + 1e-4; trl/trainer/rloo_trainer.py); the paper does not.
    Returns advantages [N] and {"frac_zero_std": share of groups whose rewards are all equal (size-1
    groups included), "frac_singleton": share of groups of one sample}.
    """
    if rewards.numel() == 0:
        return _no_samples(rewards, "frac_zero_std", "frac_singleton")
    r, inv, count, mean, std = _group_stats(rewards, group_ids)
    k = count[inv]
    adv = torch.where(k > 1, (r - mean[inv]) * k / (k - 1).clamp_min(1.0), torch.zeros_like(r))
    if scale_by_std:
        adv = _whiten(adv)
    return adv, _group_metrics(count, std)


def reinforce_pp_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale_by_std: bool = True
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262) as OpenRLHF ships it (`--algo.advantage.estimator
    reinforce_baseline`; openrlhf/trainer/ppo_utils/experience_maker.py, `compute_advantages_and_returns`,
    read at commit 3c3be62): subtract the group's mean reward, then whiten over the WHOLE batch, not per
    group as GRPO does: A_i = (c_i - mean(c)) / std(c), c_i = r_i - mean(r_g), mean and population std
    over all N samples, the std floored at √1e-8 (OpenRLHF's var.clamp(min=1e-8)).

    rewards [N], group_ids [N] as in `group_relative_advantages`. mean(c) is 0 up to rounding (each
    group's c sums to 0); a group of size 1 gets c = 0. scale_by_std=False skips the division
    (OpenRLHF's --algo.advantage.no_std_norm), which leaves Dr.GRPO's r_i - mean(r_g). With equal-sized
    groups this is RLOO whitened (k/(k-1) is then one factor for the whole batch, which whitening removes).

    Differences from OpenRLHF: the batch is the N samples passed in (GRPOModule: one round's records of
    one rank; OpenRLHF: the whole rollout batch); OpenRLHF whitens per completion token (a sample weighs
    as many times as it has tokens), here each sample weighs once; and OpenRLHF by default folds KL into
    the reward (r_t -= kl_coef · KL_t per token, then the return-to-go with γ = 1), while here KL stays a
    loss term, algorithm.beta · KL(π ‖ π_ref), as for GRPO (OpenRLHF's own reinforce_baseline example
    script does the same with --algo.kl.use_loss). Returns advantages [N] and the metrics of
    `rloo_advantages`.
    """
    if rewards.numel() == 0:
        return _no_samples(rewards, "frac_zero_std", "frac_singleton")
    r, inv, count, mean, std = _group_stats(rewards, group_ids)
    centred = r - mean[inv]
    adv = _whiten(centred) if scale_by_std else centred
    return adv, _group_metrics(count, std)


def groups_with_signal(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """DAPO's dynamic-sampling filter (Yu et al. 2025, §3.2): which samples belong to a group whose rewards
    are not all equal (population std ≥ eps), i.e. a group that gives a non-zero group-relative advantage.
    rewards [N], group_ids [N] as in `group_relative_advantages` → keep [N] bool; a group of one sample has
    std 0 and is dropped (the groups `frac_zero_std` counts are exactly those dropped here)."""
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    _, inv, _, _, std = _group_stats(rewards, group_ids)
    return (std >= eps)[inv]


def turn_returns(rewards: list[float], gamma: float) -> list[float]:
    """The discounted reward-to-go of each policy turn of an episode: G_t = Σ_{k≥t} γ^(k−t) · r_k, r_k the
    reward that turn k earned (the environment's per-turn reward; the last turn also carries the outcome)."""
    out, running = [], 0.0
    for r in reversed(rewards):
        running = r + gamma * running
        out.append(running)
    return out[::-1]


def turn_advantages(advantage_fn, returns: list[list[float]], group_ids: list[int]) -> list[list[float]]:
    """Per-turn advantages of episodes (`algorithm.turn_credit=per_turn`): turn t of episode i is compared
    with turn t of the other episodes of its group that reached it, by the stage's own advantage
    (`advantage_fn(rewards [N], group_ids [N])`, e.g. group-relative), i.e. the group (g, t) of G_{i,t}.
    With one turn per episode, or with γ = 1 and no per-turn rewards (every G_{i,t} = the episode's
    reward) and every episode of a group as long, turn 0 is exactly the episode-level advantage.
    returns[i]: G_{i,0..T_i−1}; → the advantages, same shape."""
    flat = [(i, t, g) for i, (row, g) in enumerate(zip(returns, group_ids)) for t in range(len(row))]
    if not flat:
        return [[] for _ in returns]
    keys = {(g, t): k for k, (g, t) in enumerate(dict.fromkeys((g, t) for _, t, g in flat))}
    values = torch.tensor([returns[i][t] for i, t, _ in flat], dtype=torch.float)
    adv, _ = advantage_fn(values, torch.tensor([keys[(g, t)] for _, t, g in flat]))
    out = [[0.0] * len(row) for row in returns]
    for (i, t, _), a in zip(flat, adv.tolist()):
        out[i][t] = a
    return out
