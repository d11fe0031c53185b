"""Rejection sampling fine-tuning (RAFT, Dong et al. 2023; ReST, Gulcehre et al. 2023): each round the
policy samples `group_size` completions per prompt, the reward source scores them, `annotate` keeps the
best `keep_per_group` of each prompt whose reward reaches `threshold`, and SFTModule's training step
runs unchanged on the kept samples (their provenance stays that of the rollout)."""
from __future__ import annotations

from data_modules.experience import ExperienceRecord
from data_modules.filtered_rollouts import FilteredRolloutsDataModule
from trainers.online_dpo import group_records
from trainers.sft import SFTModule


def best_of_n(records: list[ExperienceRecord], threshold: float, keep_per_group: int) -> list[ExperienceRecord]:
    """Per group, up to `keep_per_group` distinct completions with the highest rewards ≥ threshold
    (stable: among equal rewards, the earlier sample first)."""
    kept = []
    for group in group_records(records).values():
        seen: set[tuple[int, ...]] = set()
        for r in sorted(group, key=lambda r: -r.reward):
            if len(seen) == keep_per_group or r.reward < threshold:
                break
            if tuple(r.completion_ids) not in seen:
                seen.add(tuple(r.completion_ids))
                kept.append(r)
    return kept


class RejectionSamplingModule(SFTModule):
    def __init__(self, group_size: int, epochs_per_round: int, threshold: float, keep_per_group: int, **kwargs):
        super().__init__(**kwargs)
        self.group_size, self.epochs_per_round = group_size, epochs_per_round
        self.threshold, self.keep_per_group = threshold, keep_per_group
        self.last_round_stats: dict[str, float] = {}

    @classmethod
    def kept_per_group(cls, algorithm) -> tuple[int, str]:
        return min(int(algorithm.keep_per_group), int(algorithm.group_size)), "records"  # the best, above threshold

    def on_fit_start(self) -> None:
        if not isinstance(self.trainer.datamodule, FilteredRolloutsDataModule):
            raise TypeError(f"algorithm=rejection_sampling filters rollouts: use data=filtered_rollouts "
                            f"(got {type(self.trainer.datamodule).__name__})")

    def annotate(self, records: list[ExperienceRecord]) -> list[ExperienceRecord]:
        kept = best_of_n(records, self.threshold, self.keep_per_group)
        groups = len(group_records(records))
        self.last_round_stats = {"kept": float(len(kept)),
                                 "frac_groups_kept": len({r.group_id for r in kept}) / max(groups, 1)}
        return kept
