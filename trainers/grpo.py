"""GRPO (Shao et al. 2024): group-relative advantages, an off-policy-corrected (PPO-clipped by default)
surrogate, and k3 KL to a frozen reference. Everything but the advantages lives in trainers/rollout.py."""
from __future__ import annotations

from typing import Callable

import torch

from data_modules.experience import ExperienceBatch, ExperienceRecord
from losses.common import aggregate
from trainers.rollout import RolloutModule


class GRPOModule(RolloutModule):
    """group_size samples per prompt; μ = epochs_per_round passes over each round; β·KL(π‖π_ref)."""

    def __init__(self, advantage: Callable, **kwargs):
        super().__init__(**kwargs)
        self.advantage_fn = advantage

    def annotate(self, records: list[ExperienceRecord]) -> list[ExperienceRecord]:
        """Advantages from rewards and group ids (`algorithm.advantage`: group-relative, leave-one-out or
        REINFORCE++-baseline, losses/advantages.py); reference log-probs when β > 0."""
        rewards = torch.tensor([r.reward for r in records])
        groups = torch.tensor([r.group_id for r in records])
        adv, stats = self.advantage_fn(rewards, groups)
        for r, a in zip(records, adv.tolist()):
            r.advantage = a
        self.last_round_stats = {k: float(v) for k, v in stats.items()}
        self.annotate_reference(records)
        return records

    def micro_loss(self, batch: ExperienceBatch):
        logp = self.sequence_logprobs(self.policy, batch)
        self.keep_logps(logp)
        per_token, metrics = self.policy_loss(batch, logp, batch.advantages)
        return aggregate(per_token, batch.completion_mask, self.loss_agg_mode, self.loss_max_len), metrics
