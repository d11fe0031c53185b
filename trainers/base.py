"""Shared by every algorithm: the policy forward, token log-probs, optimizer/scheduler from config,
batch transfer, and the non-finite-loss guard."""
from __future__ import annotations

import copy
from typing import Callable

import lightning as L
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from data_modules.experience import ExperienceBatch, ExperienceRecord
from losses.common import token_logprobs


class NonFiniteLossError(RuntimeError):
    pass


class PolicyModule(L.LightningModule):
    """Holds the policy; subclasses implement `training_step` (and `annotate` for online data)."""

    def __init__(self, name: str, default_data: str, policy: PreTrainedModel,
                 tokenizer: PreTrainedTokenizerBase, optimizer: Callable, scheduler: Callable | None,
                 temperature: float, max_nonfinite: int):
        super().__init__()
        self.algorithm_name, self.default_data = name, default_data
        self.policy, self.tokenizer = policy, tokenizer
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self.temperature = temperature
        self.max_nonfinite, self.nonfinite = max_nonfinite, 0

    @property
    def policy_version(self) -> int:
        """The optimizer step of the current weights: what rollouts record as their policy_version."""
        return self.trainer.global_step if self._trainer is not None else 0

    def sequence_logprobs(self, model: PreTrainedModel, batch: ExperienceBatch) -> torch.Tensor:
        """Per-token log-probs [B, T] of batch.input_ids[:, 1:] under `model` at the sampling temperature."""
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        return token_logprobs(logits[:, :-1], batch.input_ids[:, 1:], self.temperature)

    @torch.no_grad()
    def frozen_logprobs(self, model: PreTrainedModel, batch: ExperienceBatch) -> list[list[float]]:
        """Completion-token log-probs of a frozen model, one list per record (for annotation)."""
        lp = self.sequence_logprobs(model, batch.to(self.device)).cpu()
        mask = batch.completion_mask.bool()
        return [row[m].tolist() for row, m in zip(lp, mask)]

    def annotate(self, records: list[ExperienceRecord]) -> list[ExperienceRecord]:
        """Add what the loss needs beyond the rollout (reference log-probs, advantages). Default: nothing."""
        return records

    def check_finite(self, loss: torch.Tensor) -> torch.Tensor | None:
        """Return the loss, or None (skip the step) if it is NaN/inf; stop past `max_nonfinite` of them."""
        if torch.isfinite(loss):
            return loss
        self.nonfinite += 1
        self.log("train/nonfinite_losses", float(self.nonfinite))
        if self.nonfinite > self.max_nonfinite:
            raise NonFiniteLossError(
                f"{self.nonfinite} non-finite losses (limit algorithm.max_nonfinite={self.max_nonfinite})")
        return None

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        return batch.to(device) if isinstance(batch, ExperienceBatch) else super().transfer_batch_to_device(
            batch, device, dataloader_idx)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer updates: the policy's trainable weights (a reward model trains its own)."""
        return [p for p in self.policy.parameters() if p.requires_grad]

    def configure_optimizers(self):
        opt = self.optimizer_factory(self.trainable_parameters())
        if self.scheduler_factory is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": self.scheduler_factory(opt), "interval": "step"}}


def frozen_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A frozen, eval-mode copy of `model` (the reference policy)."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
