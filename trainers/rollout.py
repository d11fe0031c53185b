"""Shared by the algorithms that learn from rollouts (GRPO, PPO): the off-policy-corrected policy loss,
the KL penalty to a frozen reference, per-step off-policy diagnostics sliced by data source and
staleness, and ending a round early (drift trigger, PPO's target KL) the way Lightning supports:
`on_train_batch_start` returning -1, agreed across ranks.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import torch

from data_modules.experience import ExperienceBatch, ExperienceRecord, collate
from losses.common import masked_mean
from losses.correction import importance_diagnostics
from trainers.base import PolicyModule, frozen_copy

STALENESS_BUCKETS = ((0, 0, "0"), (1, 1, "1"), (2, 3, "2_3"), (4, 7, "4_7"), (8, None, "8_up"))
BUCKET_NAMES = [name for *_, name in STALENESS_BUCKETS] + ["dataset"]


def staleness_bucket(staleness: int) -> str:
    """Bucket name of a record's staleness (policy versions behind the current weights); "dataset"
    for records this run's policy did not generate (staleness < 0)."""
    if staleness < 0:
        return "dataset"
    for lo, hi, name in STALENESS_BUCKETS:
        if staleness >= lo and (hi is None or staleness <= hi):
            return name
    raise AssertionError(staleness)


class RolloutModule(PolicyModule):
    """`correction(logprobs, behaviour_logprobs, advantages, mask)` → (per-token loss, metrics) is one of
    losses.correction's functions; β·KL(π ‖ π_ref) is added per token when beta > 0."""

    def __init__(self, group_size: int, epochs_per_round: int, correction: Callable, beta: float,
                 kl_estimator: Callable, loss_agg_mode: str, annotate_batch_size: int, **kwargs):
        super().__init__(**kwargs)
        self.group_size, self.epochs_per_round = group_size, epochs_per_round
        self.correction, self.beta, self.kl_fn = correction, beta, kl_estimator
        self.loss_agg_mode, self.annotate_batch_size = loss_agg_mode, annotate_batch_size
        self.reference = frozen_copy(self.policy) if beta > 0 else None
        self.last_diagnostics: dict[str, float] = {}  # of the latest step: read by the regeneration policy
        self._end_round: str | None = None
        self.round_end_reason: str | None = None  # why the current round ended early (None: it ran out)

    # ---- annotation ----------------------------------------------------------------------------
    def annotate_reference(self, records: list[ExperienceRecord]) -> None:
        """Reference log-probs for each record (β > 0 only), in chunks of annotate_batch_size."""
        if self.reference is None:
            return
        self.reference.to(self.device)
        for lo in range(0, len(records), self.annotate_batch_size):
            chunk = records[lo : lo + self.annotate_batch_size]
            for r, lp in zip(chunk, self.frozen_logprobs(self.reference, collate(chunk, self.tokenizer.pad_token_id))):
                r.ref_logprobs = lp

    # ---- early end of a round --------------------------------------------------------------------
    def request_round_end(self, reason: str) -> None:
        """Ask to end the current round before its next step (the reason is logged as the trigger)."""
        self._end_round = self._end_round or reason

    def on_train_epoch_start(self) -> None:
        self.round_end_reason = self._end_round = None  # a request from the last step of a round lapses

    def on_train_batch_start(self, batch, batch_idx: int):
        ask = self._end_round is not None
        if self._trainer is not None and self.trainer.world_size > 1:  # every rank stops, or none does
            ask = self.trainer.strategy.reduce_boolean_decision(ask, all=False)
        if ask:
            self.round_end_reason, self._end_round = self._end_round or "peer_rank", None
            return -1
        return None

    # ---- the loss ------------------------------------------------------------------------------
    def policy_loss(self, batch: ExperienceBatch, logp: torch.Tensor, advantages: torch.Tensor
                    ) -> tuple[torch.Tensor, dict]:
        """Per-token corrected policy-gradient loss [B, T] (+ β·KL to the reference) and its metrics."""
        mask = batch.completion_mask
        per_token, metrics = self.correction(logp, batch.behaviour_logprobs, advantages, mask)
        if self.reference is not None:
            kl = self.kl_fn(logp, batch.ref_logprobs)
            per_token = per_token + self.beta * kl
            metrics["kl"] = masked_mean(kl.detach(), mask)
        metrics["entropy"] = -masked_mean(logp.detach(), mask)
        return per_token, metrics

    def log_step(self, loss: torch.Tensor, batch: ExperienceBatch, logp: torch.Tensor, metrics: dict) -> None:
        """train/* metrics of this step plus off-policy diagnostics, overall and per slice."""
        n = len(batch)
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=n)
        self.log("rollout/reward_mean", batch.rewards.mean(), prog_bar=True, batch_size=n)
        if "kl" in metrics:
            self.log("train/kl", metrics.pop("kl"), prog_bar=True, batch_size=n)
        diag = self.offpolicy_diagnostics(batch, logp.detach())
        self.last_diagnostics = {k: float(v) for k, v in diag.items()}
        # diag's token-level ratio_mean/ratio_max replace the correction's (at its level) under one name
        self.log_dict({f"train/{k}": v for k, v in metrics.items()} | diag, batch_size=n)

    @torch.no_grad()
    def offpolicy_diagnostics(self, batch: ExperienceBatch, logp: torch.Tensor) -> dict[str, float]:
        """ess_frac, ratio mean/max and KL(behaviour ‖ current) over the batch and per slice (source:
        fresh/replay/dataset; staleness bucket), plus the staleness histogram (share per bucket)."""
        staleness = (self.policy_version - batch.policy_versions).where(batch.policy_versions >= 0, -1)
        buckets = [staleness_bucket(int(s)) for s in staleness]
        out = {f"train/{k}": float(v) for k, v in
               importance_diagnostics(logp, batch.behaviour_logprobs, batch.completion_mask).items()}
        generated = staleness[staleness >= 0].float()
        out["train/staleness_mean"] = float(generated.mean()) if generated.numel() else 0.0
        out["train/staleness_max"] = float(generated.max()) if generated.numel() else 0.0
        counts = Counter(buckets)  # every bucket every step (0 when empty), so each step's histogram sums to 1
        out |= {f"train/staleness_hist/{b}": counts[b] / len(batch) for b in BUCKET_NAMES}
        for kind, labels in (("source", batch.served_as), ("staleness", buckets)):
            for label in sorted(set(labels)):
                rows = torch.tensor([x == label for x in labels], device=logp.device)
                sliced = importance_diagnostics(logp[rows], batch.behaviour_logprobs[rows],
                                                batch.completion_mask[rows])
                out |= {f"train/{k}/{kind}_{label}": float(v) for k, v in sliced.items()}
        return out
