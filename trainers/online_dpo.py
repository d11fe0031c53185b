"""Online (iterative) DPO: each round the current policy samples `group_size` completions per prompt
(callbacks/regenerate.py, as for GRPO), the reward source scores them, and `annotate` turns each group
into one (best, worst) pair; DPOModule's training step then runs unchanged on those pairs.

Pairs carry the provenance of the samples they came from (source policy_rollout, the policy version
that generated them, generator, sampling settings, reward source) and their rewards. Their reference
log-probs are computed once, as the round is made (the frozen copy of the stage's initial policy, or
the LoRA base).
"""
from __future__ import annotations

from dataclasses import replace

from data_modules.experience import ExperienceRecord
from data_modules.filtered_rollouts import FilteredRolloutsDataModule
from data_modules.preferences import PreferenceRecord
from trainers.dpo import DPOModule


def group_records(records: list[ExperienceRecord]) -> dict[int, list[ExperienceRecord]]:
    groups: dict[int, list[ExperienceRecord]] = {}
    for r in records:
        groups.setdefault(r.group_id, []).append(r)
    return groups


def best_worst_pairs(records: list[ExperienceRecord], min_reward_gap: float) -> list[PreferenceRecord]:
    """One pair per group whose best reward exceeds its worst by more than `min_reward_gap`: chosen =
    the first sample with the highest reward, rejected = the first with the lowest. Ties give no pair."""
    pairs = []
    for gid, group in group_records(records).items():
        best = max(group, key=lambda r: r.reward)
        worst = min(group, key=lambda r: r.reward)
        if best.reward - worst.reward <= min_reward_gap or best.completion_ids == worst.completion_ids:
            continue
        pairs.append(PreferenceRecord(
            prompt_ids=best.prompt_ids, chosen_ids=best.completion_ids, rejected_ids=worst.completion_ids,
            provenance=replace(best.provenance, times_used=0), group_id=gid, prompt_text=best.prompt_text,
            chosen_text=best.completion_text, rejected_text=worst.completion_text, answer=best.answer,
            chosen_reward=best.reward, rejected_reward=worst.reward))
    return pairs


class OnlineDPOModule(DPOModule):
    """`group_size` samples per prompt, `epochs_per_round` passes over each round's pairs."""

    def __init__(self, group_size: int, epochs_per_round: int, min_reward_gap: float, **kwargs):
        super().__init__(**kwargs)
        if self.precompute_reference:
            raise ValueError("algorithm.precompute_reference=true does not apply to online_dpo: its pairs are "
                             "made during training (their reference log-probs are cached as each round is made)")
        self.group_size, self.epochs_per_round = group_size, epochs_per_round
        self.min_reward_gap = min_reward_gap
        self.last_round_stats: dict[str, float] = {}

    def check_data(self, datamodule) -> None:
        if not isinstance(datamodule, FilteredRolloutsDataModule):
            raise TypeError(f"algorithm=online_dpo makes its pairs from rollouts: use data=filtered_rollouts "
                            f"(got {type(datamodule).__name__})")

    def annotate(self, records: list[ExperienceRecord]) -> list[PreferenceRecord]:
        pairs = best_worst_pairs(records, self.min_reward_gap)
        self.cache_reference(pairs)
        groups = len(group_records(records))
        self.last_round_stats = {"pairs": float(len(pairs)), "frac_groups_paired": len(pairs) / max(groups, 1)}
        return pairs
