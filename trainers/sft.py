"""Supervised fine-tuning on demonstrations (or on filtered samples: rejection sampling reuses it)."""
from __future__ import annotations

from data_modules.experience import ExperienceBatch
from losses.common import aggregate
from losses.sft import nll_loss
from trainers.base import PolicyModule


class SFTModule(PolicyModule):
    def __init__(self, loss_agg_mode: str, **kwargs):
        super().__init__(**kwargs)
        self.loss_agg_mode = loss_agg_mode

    def training_step(self, batch: ExperienceBatch, batch_idx: int):
        logp = self.sequence_logprobs(self.policy, batch)
        per_token, metrics = nll_loss(logp, batch.completion_mask)
        loss = aggregate(per_token, batch.completion_mask, self.loss_agg_mode)
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=len(batch))
        self.log("train/target_prob", metrics["target_prob"], batch_size=len(batch))
        return self.check_finite(loss)
