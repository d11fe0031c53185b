"""GRPO (Shao et al. 2024): group-relative advantages, clipped surrogate, k3 KL to a frozen reference."""
from __future__ import annotations

from typing import Callable

import torch

from data_modules.experience import ExperienceBatch, ExperienceRecord, collate
from losses.common import aggregate, masked_mean
from losses.policy_gradient import clipped_surrogate
from trainers.base import PolicyModule, frozen_copy


class GRPOModule(PolicyModule):
    """group_size samples per prompt; μ = epochs_per_round passes over each round; β·KL(π‖π_ref)."""

    def __init__(self, group_size: int, epochs_per_round: int, clip_low: float, clip_high: float,
                 beta: float, advantage: Callable, kl_estimator: Callable, loss_agg_mode: str,
                 annotate_batch_size: int, **kwargs):
        super().__init__(**kwargs)
        self.group_size, self.epochs_per_round = group_size, epochs_per_round
        self.clip_low, self.clip_high, self.beta = clip_low, clip_high, beta
        self.advantage_fn, self.kl_fn = advantage, kl_estimator
        self.loss_agg_mode, self.annotate_batch_size = loss_agg_mode, annotate_batch_size
        self.reference = frozen_copy(self.policy) if beta > 0 else None

    def annotate(self, records: list[ExperienceRecord]) -> list[ExperienceRecord]:
        """Group-relative advantages from rewards; reference log-probs when β > 0."""
        rewards = torch.tensor([r.reward for r in records])
        groups = torch.tensor([r.group_id for r in records])
        adv, stats = self.advantage_fn(rewards, groups)
        for r, a in zip(records, adv.tolist()):
            r.advantage = a
        self.last_round_stats = {k: float(v) for k, v in stats.items()}
        if self.reference is not None:
            self.reference.to(self.device)
            for lo in range(0, len(records), self.annotate_batch_size):
                chunk = records[lo : lo + self.annotate_batch_size]
                lps = self.frozen_logprobs(self.reference, collate(chunk, self.tokenizer.pad_token_id))
                for r, lp in zip(chunk, lps):
                    r.ref_logprobs = lp
        return records

    def training_step(self, batch: ExperienceBatch, batch_idx: int):
        mask = batch.completion_mask
        logp = self.sequence_logprobs(self.policy, batch)
        pg, metrics = clipped_surrogate(logp, batch.behaviour_logprobs, batch.advantages, mask,
                                        self.clip_low, self.clip_high)
        per_token = pg
        if self.reference is not None:
            kl = self.kl_fn(logp, batch.ref_logprobs)
            per_token = pg + self.beta * kl
            metrics["kl"] = masked_mean(kl.detach(), mask)
        loss = aggregate(per_token, mask, self.loss_agg_mode)
        metrics["entropy"] = -masked_mean(logp.detach(), mask)
        n = len(batch)
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=n)
        self.log("rollout/reward_mean", batch.rewards.mean(), prog_bar=True, batch_size=n)
        if "kl" in metrics:
            self.log("train/kl", metrics.pop("kl"), prog_bar=True, batch_size=n)
        self.log_dict({f"train/{k}": v for k, v in metrics.items()}, batch_size=n)
        return self.check_finite(loss)
