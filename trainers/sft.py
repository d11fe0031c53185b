"""Supervised fine-tuning on demonstrations (or on filtered samples: rejection sampling reuses it)."""
from __future__ import annotations

from data_modules.experience import ExperienceBatch
from losses.common import aggregate, aggregation_weight
from losses.sft import nll_loss
from trainers.base import PolicyModule


class SFTModule(PolicyModule):
    def __init__(self, loss_agg_mode: str, **kwargs):
        super().__init__(**kwargs)
        self.loss_agg_mode = loss_agg_mode

    def loss_weight(self, batch: ExperienceBatch) -> float:
        return aggregation_weight(batch.completion_mask, self.loss_agg_mode)

    def micro_loss(self, batch: ExperienceBatch):
        logp = self.sequence_logprobs(self.policy, batch)
        per_token, metrics = nll_loss(logp, batch.completion_mask)
        return aggregate(per_token, batch.completion_mask, self.loss_agg_mode), {"target_prob": metrics["target_prob"]}
