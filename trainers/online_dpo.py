"""Online (iterative) DPO: each round the current policy samples `group_size` completions per prompt
(callbacks/regenerate.py, as for GRPO), the reward source scores them, and `annotate` turns each group
into one (best, worst) pair; DPOModule's training step then runs unchanged on those pairs.

Pairs carry the provenance of the samples they came from (source policy_rollout, the policy version
that generated them, generator, sampling settings, reward source) and their rewards. Their reference
log-probs are computed once, as the round is made (the frozen copy of the stage's initial policy, or
the LoRA base).

`ref_update_every` = K refreshes the reference, as iterative DPO does (Xiong et al. 2024; TRL's
`sync_ref_model`, which does it every K optimizer steps): rounds are numbered from 0 (made at fit
start), and before round i is generated, for i a positive multiple of K, the frozen copy takes the
current policy's weights, in place (`ref_update_alpha` < 1: TR-DPO's soft update, ref ← α·policy +
(1 − α)·ref). So round K·n's pairs, and all pairs up to round K·(n+1) − 1, are scored against the policy
as it was after K·n rounds of training. Pairs made before a refresh keep the reference log-probs they
were cached with (a round that kept nothing serves the previous round's pairs again). The refresh count
and round are checkpointed. Once refreshed (and only then: see PolicyModule.reference_in_checkpoint)
the reference's weights are in every resume checkpoint's state dict (`reference.*`), so a resumed run
continues with the refreshed reference and refreshes on the same rounds; before the first refresh it is
the stage's starting policy, built again on resume.
"""
from __future__ import annotations

from dataclasses import replace

from data_modules.experience import ExperienceRecord
from data_modules.filtered_rollouts import FilteredRolloutsDataModule
from data_modules.preferences import PreferenceRecord
from trainers.base import blend_weights
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
    """`group_size` samples per prompt, `epochs_per_round` passes over each round's pairs; the reference
    refreshed to the policy every `ref_update_every` rounds (None: never), blended by `ref_update_alpha`."""

    def __init__(self, group_size: int, epochs_per_round: int, min_reward_gap: float,
                 ref_update_every: int | None, ref_update_alpha: float, **kwargs):
        super().__init__(**kwargs)
        if self.precompute_reference:
            raise ValueError("algorithm.precompute_reference=true does not apply to online_dpo: its pairs are "
                             "made during training (their reference log-probs are cached as each round is made)")
        if ref_update_every is not None and self.reference is None:
            raise ValueError(f"algorithm.ref_update_every={ref_update_every} with model.lora: the reference is the "
                             f"base with the adapter disabled, so refreshing it would mean merging the adapter "
                             f"into the base; use algorithm.ref_update_every=null with LoRA")
        self.group_size, self.epochs_per_round = group_size, epochs_per_round
        self.min_reward_gap = min_reward_gap
        self.ref_update_every, self.ref_update_alpha = ref_update_every, ref_update_alpha
        self.ref_updates, self.ref_updated_round = 0, -1  # checkpointed
        self.last_round_stats: dict[str, float] = {}

    @classmethod
    def kept_per_group(cls, algorithm) -> tuple[int, str]:
        return 1, "pairs"  # (best, worst) of each group, or none when it ties

    def check_data(self, datamodule) -> None:
        if not isinstance(datamodule, FilteredRolloutsDataModule):
            raise TypeError(f"algorithm={self.algorithm_name} makes its pairs from rollouts: use data=filtered_rollouts "
                            f"(got {type(datamodule).__name__})")

    def annotate(self, records: list[ExperienceRecord]) -> list[PreferenceRecord]:
        pairs = best_worst_pairs(records, self.min_reward_gap)
        self.cache_reference(pairs)
        groups = len(group_records(records))
        self.last_round_stats = {"pairs": float(len(pairs)), "frac_groups_paired": len(pairs) / max(groups, 1)}
        return pairs

    # ---- the reference refresh -------------------------------------------------------------------
    def round_start(self, index: int) -> None:
        """Called by callbacks/regenerate.py before round `index` (0: the first) is generated, outside
        FSDP's gathered weights: refresh the reference when `index` is a positive multiple of
        `ref_update_every` (at most once per round index)."""
        every = self.ref_update_every
        if every and index > 0 and index % every == 0 and index != self.ref_updated_round:
            blend_weights(self.policy, self.reference, self.ref_update_alpha)
            self.ref_updates, self.ref_updated_round = self.ref_updates + 1, index

    def log_step(self, batch, loss, metrics, extra=None):
        return super().log_step(batch, loss, metrics, (extra or {}) | {"train/ref_updates": float(self.ref_updates)})

    def reference_in_checkpoint(self) -> bool:
        """Refreshed, the reference is no longer the stage's starting policy: keep it in the checkpoint."""
        return self.ref_updates > 0

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["reference_refresh"] = {"updates": self.ref_updates, "round": self.ref_updated_round}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("reference_refresh", {})  # a checkpoint from before the refresh existed
        self.ref_updates, self.ref_updated_round = state.get("updates", 0), state.get("round", -1)
