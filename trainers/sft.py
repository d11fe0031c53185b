"""Supervised fine-tuning on demonstrations (or on filtered samples: rejection sampling reuses it)."""
from __future__ import annotations

import torch

from data_modules.experience import ExperienceBatch, collate
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

    @torch.no_grad()
    def heldout_metrics(self, records: list, batch_size: int) -> dict[str, float]:
        """On held-out demonstrations: loss, the mean NLL per completion token (the training loss's
        token_mean form), and target_prob, the mean probability of each target token."""
        was_training = self.policy.training
        self.policy.eval()
        totals = torch.zeros(3, device=self.device)  # NLL, probability, tokens: one host sync at the end
        try:
            for lo in range(0, len(records), batch_size):
                batch = collate(records[lo: lo + batch_size], self.tokenizer.pad_token_id).to(self.device)
                with self.precision_context():
                    logp = self.sequence_logprobs(self.policy, batch).float()
                mask = batch.completion_mask.float()
                totals += torch.stack([-(logp * mask).sum(), (logp.exp() * mask).sum(), mask.sum()])
        finally:
            self.policy.train(was_training)
        nll, prob, tokens = totals.tolist()
        return {"loss": nll / max(tokens, 1.0), "target_prob": prob / max(tokens, 1.0)}
