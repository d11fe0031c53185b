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
from data_modules.stored_success import STORED
from hardware import distributed
from losses.common import aggregation_weight, masked_mean
from losses.correction import importance_diagnostics, truncated_is
from trainers import step_log
from trainers.base import PolicyModule, frozen_copy, is_lora

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


def needs_proximal(correction: Callable) -> bool:
    """Whether `correction` (a function or its partial) clips against π_prox (losses.correction.decoupled_ppo)."""
    return getattr(getattr(correction, "func", correction), "needs_proximal", False)


class RolloutModule(PolicyModule):
    """`correction(logprobs, behaviour_logprobs, advantages, mask)` → (per-token loss, metrics) is one of
    losses.correction's functions; β·KL(π ‖ π_ref) is added per token when beta > 0. The reference is
    a frozen copy, or under LoRA the policy with its adapter disabled (no copy). `loss_max_len` is
    the constant that seq_mean_token_sum_norm (Dr. GRPO) divides by."""

    prog_bar_metrics = ("train/kl", "rollout/reward_mean")

    def __init__(self, group_size: int, epochs_per_round: int, correction: Callable, beta: float,
                 kl_estimator: Callable, loss_agg_mode: str, loss_max_len: int | None,
                 annotate_batch_size: int | None, **kwargs):
        super().__init__(**kwargs)
        self.group_size, self.epochs_per_round = group_size, epochs_per_round
        self.correction, self.beta, self.kl_fn = correction, beta, kl_estimator
        self.loss_agg_mode, self.loss_max_len = loss_agg_mode, loss_max_len
        self.annotate_batch_size = annotate_batch_size
        self.reference = None
        self.use_reference = False
        if beta > 0:
            self.add_reference()
        self._step_logps: list[torch.Tensor] = []  # the step's micro-batch log-probs, for diagnostics
        self._step_advs: list[torch.Tensor] = []   # ... and the advantages their loss used, per token
        self.last_diagnostics: dict[str, float] = {}  # of the latest step: read by the regeneration policy
        self._end_round: str | None = None
        self.round_end_reason: str | None = None  # why the current round ended early (None: it ran out)
        self.proximal_forwards = 0  # decoupled_ppo: records of the latest round that needed a π_prox forward
        self.stored_success_cap = 1.0  # GRPO's algorithm.stored_success.cap (stored_success_loss)

    def add_reference(self) -> None:
        """Use a reference policy: a frozen copy, or (LoRA) the adapter-disabled policy itself."""
        self.use_reference = True
        self.reference = None if is_lora(self.policy) else frozen_copy(self.policy)

    # ---- annotation ----------------------------------------------------------------------------
    def annotate_reference(self, records: list[ExperienceRecord]) -> None:
        """Reference log-probs for each record (when a reference is used), in annotation batches."""
        if not self.use_reference:
            return
        with self.reference_model() as ref:
            for chunk, batch in self.annotation_batches(records, self.collate):
                for r, lp in zip(chunk, self.frozen_logprobs(ref, batch)):
                    r.ref_logprobs = lp

    def collate(self, records: list[ExperienceRecord]) -> ExperienceBatch:
        return collate(records, self.tokenizer.pad_token_id)

    # ---- early end of a round --------------------------------------------------------------------
    def request_round_end(self, reason: str) -> None:
        """Ask to end the current round before its next step (the reason is logged as the trigger)."""
        self._end_round = self._end_round or reason

    def round_end(self) -> str | None:
        """Why the round that just ended ended early (drift trigger, target KL), or None if it ran its
        schedule. A request made on the round's last step counts too: with one step a round (common
        for GRPO) every request is made there, and the next round is made for that reason."""
        return self.round_end_reason or self._end_round

    def on_train_epoch_start(self) -> None:
        self.round_end_reason = self._end_round = None  # the regeneration callback has read round_end()
        if self.needs_proximal:
            self.annotate_proximal(self.trainer.train_dataloader.dataset)

    # ---- the proximal policy (correction=decoupled_ppo) ------------------------------------------
    @property
    def needs_proximal(self) -> bool:
        """Whether the correction clips against π_prox (losses.correction.decoupled_ppo)."""
        return needs_proximal(self.correction)

    def annotate_proximal(self, served: list[ExperienceRecord]) -> None:
        """π_prox's log-probs for every record the round serves: the weights at the round's start, before
        its first optimizer step. A record this very policy version sampled (fresh) takes its behaviour
        log-probs, μ = π_prox (so decoupled_ppo is ppo_clip on it, exactly); every other record (replayed,
        stale, loaded) gets a no-grad forward of the current policy (eval mode, the trainer's precision).
        Every rank computes every record (the same list, in order): an FSDP forward is a collective."""
        records = list({id(r): r for r in served}.values())
        version, stale = self.policy_version, []
        for r in records:
            fresh = r.served_as == "fresh" and r.provenance.policy_version == version
            if fresh and r.behaviour_logprobs is not None:
                r.prox_logprobs = list(r.behaviour_logprobs)
            else:
                stale.append(r)
        was_training = self.policy.training
        self.policy.eval()
        try:
            for chunk, batch in self.annotation_batches(stale, self.collate):
                for r, lp in zip(chunk, self.frozen_logprobs(self.policy, batch)):
                    r.prox_logprobs = lp
        finally:
            self.policy.train(was_training)
        self.proximal_forwards = len(stale)  # records that needed the extra forward this round

    def on_train_batch_start(self, batch, batch_idx: int):
        ask = self._end_round is not None
        if self._trainer is not None and self.trainer.world_size > 1:  # every rank stops, or none does
            ask = self.trainer.strategy.reduce_boolean_decision(ask, all=False)
        if ask:
            self.round_end_reason, self._end_round = self._end_round or "peer_rank", None
            return -1
        return None

    # ---- the loss ------------------------------------------------------------------------------
    def loss_weight(self, batch: ExperienceBatch) -> float:
        return aggregation_weight(batch.completion_mask, self.loss_agg_mode)

    def training_step(self, batch: ExperienceBatch, batch_idx: int):
        self._step_logps, self._step_advs = [], []
        return super().training_step(batch, batch_idx)

    def keep_logps(self, logp: torch.Tensor) -> None:
        """Remember a micro-batch's token log-probs: the step's diagnostics cover the whole batch."""
        self._step_logps.append(logp.detach())

    def step_logps(self, batch: ExperienceBatch) -> torch.Tensor:
        """The kept micro-batch log-probs stitched into one [B, T] tensor aligned with `batch`."""
        return _stitched(self._step_logps, batch)

    def policy_loss(self, batch: ExperienceBatch, logp: torch.Tensor, advantages: torch.Tensor
                    ) -> tuple[torch.Tensor, dict]:
        """Per-token corrected policy-gradient loss [B, T] (+ β·KL to the reference) and its metrics."""
        mask = batch.completion_mask
        proximal = {"prox_logprobs": batch.prox_logprobs} if needs_proximal(self.correction) else {}
        per_token, metrics = self.correction(logp, batch.behaviour_logprobs, advantages, mask, **proximal)
        per_token = stored_success_loss(batch, logp, advantages, per_token, getattr(self, "stored_success_cap", 1.0))
        self._step_advs.append((advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages).detach()
                               .expand_as(logp))
        if self.use_reference:
            # Off the completion mask both inputs are 0 (d = 0): a log-prob there, e.g. of the pad after a
            # stop id, which a chat model may put far below the reference's 0 fill, made k3's exp(-d) inf
            # and the masked loss inf · 0 = NaN.
            on = mask.bool()
            kl = self.kl_fn(torch.where(on, logp, 0.0), torch.where(on, batch.ref_logprobs, 0.0))
            per_token = per_token + self.beta * kl
            metrics["kl"] = masked_mean(kl.detach(), mask)
        metrics["entropy"] = -masked_mean(logp.detach(), mask)
        return per_token, metrics

    def log_step(self, batch: ExperienceBatch, loss: torch.Tensor, metrics: dict) -> dict[str, float]:
        """train/* metrics of this optimizer step plus off-policy diagnostics, overall and per slice,
        over the whole batch (diag's token-level ratio_mean/ratio_max replace the correction's), in one
        row read with one host sync (trainers/step_log.py)."""
        n = len(batch)
        diag = self.offpolicy_diagnostics(batch, self.step_logps(batch))
        diag["rollout/reward_mean"] = batch.rewards.mean()
        if distributed.active():  # with ranks: the whole step's batch, every rank alike
            diag = distributed.weighted_means(step_log.to_floats(diag), n)
        kept = {k: v for k, v in metrics.items() if f"train/{k}" not in diag}
        row = super().log_step(batch, loss, kept, extra=diag)
        self.last_diagnostics = {k: row[k] for k in diag if k != "rollout/reward_mean"}  # the drift trigger's
        return row                                                                         # one decision

    @torch.no_grad()
    def offpolicy_diagnostics(self, batch: ExperienceBatch, logp: torch.Tensor) -> dict[str, torch.Tensor | float]:
        """ess_frac, ratio mean/max and KL(behaviour ‖ current) over the batch and per slice (source:
        fresh/replay/dataset; staleness bucket), plus the staleness histogram (share per bucket). A
        slice that is the whole batch (fresh-only on-policy data) takes the overall values, uncomputed."""
        versions = batch.policy_versions.tolist()
        staleness = [self.policy_version - v if v >= 0 else -1 for v in versions]
        buckets = [staleness_bucket(s) for s in staleness]
        overall = importance_diagnostics(logp, batch.behaviour_logprobs, batch.completion_mask)
        out: dict[str, torch.Tensor | float] = {f"train/{k}": v for k, v in overall.items()}
        generated = [s for s in staleness if s >= 0]
        out["train/staleness_mean"] = sum(generated) / len(generated) if generated else 0.0
        out["train/staleness_max"] = float(max(generated)) if generated else 0.0
        counts = Counter(buckets)  # every bucket every step (0 when empty), so each step's histogram sums to 1
        out |= {f"train/staleness_hist/{b}": counts[b] / len(batch) for b in BUCKET_NAMES}
        for kind, labels in (("source", batch.served_as), ("staleness", buckets)):
            names = sorted(set(labels))
            for label in names:
                if len(names) == 1:
                    sliced = overall
                else:
                    rows = torch.tensor([x == label for x in labels], device=logp.device)
                    sliced = importance_diagnostics(logp[rows], batch.behaviour_logprobs[rows],
                                                    batch.completion_mask[rows])
                out |= {f"train/{k}/{kind}_{label}": v for k, v in sliced.items()}
                out |= {f"train/{k}/{kind}_{label}": v for k, v in self.slice_clipping(batch, logp, labels, label).items()}
        return out

    @torch.no_grad()
    def slice_clipping(self, batch: ExperienceBatch, logp: torch.Tensor, labels: list, label) -> dict:
        """clip_frac and adv_clip_frac of the rows whose label is `label`, pooled over their tokens: the step's
        correction applied again (no gradient) to those rows with the log-probs and advantages its loss used.
        Empty when the step kept no advantages (a loss without policy_loss) or the correction reports none."""
        if len(self._step_advs) != len(self._step_logps) or not self._step_advs:
            return {}
        rows = torch.tensor([x == label for x in labels], device=logp.device)
        advantages = _stitched(self._step_advs, batch)
        proximal = {"prox_logprobs": batch.prox_logprobs[rows]} if needs_proximal(self.correction) else {}
        _, m = self.correction(logp[rows], batch.behaviour_logprobs[rows], advantages[rows],
                               batch.completion_mask[rows], **proximal)
        return {k: m[k] for k in ("clip_frac", "adv_clip_frac") if k in m}


def _stitched(parts: list[torch.Tensor], batch: ExperienceBatch) -> torch.Tensor:
    """A step's micro-batch tensors [b, t] stitched into one [B, T] aligned with `batch` (zeros past each t)."""
    if len(parts) == 1:
        return parts[0]
    full = batch.completion_mask.new_zeros(batch.completion_mask.shape)
    row = 0
    for part in parts:
        full[row: row + part.shape[0], : part.shape[1]] = part
        row += part.shape[0]
    return full


def stored_success_loss(batch: ExperienceBatch, logp: torch.Tensor, advantages: torch.Tensor,
                        per_token: torch.Tensor, cap: float) -> torch.Tensor:
    """Rows served as a stored success (data_modules/stored_success.py) take truncated importance sampling,
    −sg(min(π/μ, C))·A·log π with C = `cap`, algorithm.stored_success.cap (losses/correction.py), whatever the
    stage's correction: the sample is many versions old, and its advantage was clipped to ≥ 0."""
    rows = [label == STORED for label in getattr(batch, "served_as", ())]  # (a hand-made batch may have none)
    if not any(rows):
        return per_token
    reused, _ = truncated_is(logp, batch.behaviour_logprobs, advantages, batch.completion_mask, cap)
    return torch.where(torch.tensor(rows, device=logp.device)[:, None], reused, per_token)

