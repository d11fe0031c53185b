"""What every preference learner against a reference policy shares (DPO, IPO, KTO, online DPO):
sequence log-probs of a PreferenceBatch in one forward pass, and the reference log-probs.

The reference (DESIGN §8) is, in order of preference:
  cached     log-probs stored on the records: `algorithm.precompute_reference=true` computes them once
             for static data when fit starts (the policy is then the reference, so no copy is kept);
             online DPO caches them in `annotate`, as each round's pairs are made
  LoRA       the policy with its adapter disabled (model.lora): the base weights, no copy
  a copy     a frozen, eval-mode copy of the policy as the stage starts (the default)
"""
from __future__ import annotations

import torch

from data_modules.preferences import PreferenceBatch, PreferenceDataModule, collate_preferences
from losses.preference import ranked_right, sequence_logps
from trainers.base import PolicyModule, frozen_copy, is_lora


class PreferenceModule(PolicyModule):
    """`beta` scales implicit rewards (β·log π/π_ref); `length_normalize` averages token log-probs
    instead of summing them; `annotate_batch_size` records per no-grad reference/eval forward (null:
    data.micro_batch_size)."""

    prog_bar_metrics = ("train/reward_acc",)

    def __init__(self, beta: float, precompute_reference: bool, length_normalize: bool,
                 annotate_batch_size: int, **kwargs):
        super().__init__(**kwargs)
        self.beta, self.precompute_reference = beta, precompute_reference
        self.length_normalize, self.annotate_batch_size = length_normalize, annotate_batch_size
        use_copy = not precompute_reference and not is_lora(self.policy)
        self.reference = frozen_copy(self.policy) if use_copy else None

    # ---------------------------------------------------------------- log-probs
    def batch_logps(self, model, batch: PreferenceBatch) -> torch.Tensor:
        """Sequence log-probs [2B] of all 2B sequences of `batch` through one forward pass of `model`."""
        return self.batch_token_logps(model, batch)[1]

    def batch_token_logps(self, model, batch: PreferenceBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(token log-probs [2B, T], sequence log-probs [2B]) through one forward pass of `model`."""
        seq = batch.sequences
        tokens = self.sequence_logprobs(model, seq)
        return tokens, sequence_logps(tokens, seq.completion_mask, self.length_normalize)

    @torch.no_grad()
    def reference_forward(self, batch: PreferenceBatch) -> torch.Tensor:
        """Reference sequence log-probs [2B]: the frozen copy, or the policy (adapter disabled under
        LoRA; only valid as the reference before training moves it, i.e. when caching at fit start)."""
        with self.reference_model() as model:
            return self.batch_logps(model, batch)

    def reference_logps(self, batch: PreferenceBatch) -> torch.Tensor:
        if batch.ref_logps is not None:
            return batch.ref_logps
        if self.reference is None and not is_lora(self.policy):
            raise RuntimeError("algorithm.precompute_reference=true but a batch has no cached reference "
                               "log-probs (its records were not seen when fit started)")
        return self.reference_forward(batch)

    def cache_reference(self, records: list) -> None:
        """Store reference log-probs on every record that lacks them (no-grad, in chunks, at the
        trainer's precision so cached and on-the-fly values agree)."""
        todo = [r for r in records if None in r.ref_logps]
        with self.precision_context():
            for chunk, batch in self.annotation_batches(todo, self.collate):
                lp, n = self.reference_forward(batch), len(chunk)
                for r, first, second in zip(chunk, lp[:n].tolist(), lp[n:].tolist()):
                    r.set_ref_logps(first, second)

    def collate(self, records: list) -> PreferenceBatch:
        return collate_preferences(records, self.tokenizer.pad_token_id)

    # ---------------------------------------------------------------- hooks
    def check_data(self, datamodule) -> None:
        """Fail fast, before any step, when the data module serves no preference records."""
        if not isinstance(datamodule, PreferenceDataModule):
            raise TypeError(f"algorithm={self.algorithm_name} learns from preference data, but data module "
                            f"{type(datamodule).__name__} serves none: use data=static_preferences")

    def on_fit_start(self) -> None:
        self.check_data(self.trainer.datamodule)
        if self.precompute_reference:  # the policy is still the reference: cache everything now
            self.cache_reference(self.trainer.datamodule.records + self.trainer.datamodule.heldout_pairs)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        if isinstance(batch, PreferenceBatch):
            return batch.to(device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    # ---------------------------------------------------------------- held-out evaluation
    @torch.no_grad()
    def preference_metrics(self, pairs: list, batch_size: int) -> dict[str, float]:
        """On held-out pairs: pref_accuracy, the accuracy of the policy's implicit reward model
        r = β·log π/π_ref (ties ½: 0.5 while π = π_ref); reward_margin, its mean gap; logp_accuracy,
        the share of pairs where log π(chosen) > log π(rejected) (the policy as a likelihood ranker)."""
        self.cache_reference(pairs)
        was_training = self.policy.training
        self.policy.eval()
        totals = {"pref_accuracy": 0.0, "reward_margin": 0.0, "logp_accuracy": 0.0}
        try:
            for lo in range(0, len(pairs), batch_size):
                batch = collate_preferences(pairs[lo: lo + batch_size], self.tokenizer.pad_token_id)
                batch = batch.to(self.device)
                n, lp, ref = len(batch), self.batch_logps(self.policy, batch), batch.ref_logps
                chosen, rejected = self.beta * (lp[:n] - ref[:n]), self.beta * (lp[n:] - ref[n:])
                totals["pref_accuracy"] += ranked_right(chosen, rejected).sum().item()
                totals["reward_margin"] += (chosen - rejected).sum().item()
                totals["logp_accuracy"] += ranked_right(lp[:n], lp[n:]).sum().item()
        finally:
            self.policy.train(was_training)
        return {k: v / max(len(pairs), 1) for k, v in totals.items()}
