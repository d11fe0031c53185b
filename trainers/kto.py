"""KTO (Ethayarajh et al. 2024) on unpaired desirable/undesirable examples (losses.preference.kto_loss).

Each batch holds B records as 2B sequences in one forward pass: rows [0, B) are (prompt, completion),
rows [B, 2B) are (prompt, another record's completion), the mismatched pairs on which the reference
point z₀ = max(0, KL̂(π ‖ π_ref)) is estimated (averaged across ranks, detached).
"""
from __future__ import annotations

from typing import Callable

from data_modules.preferences import PreferenceBatch
from losses.preference import kto_reference_point
from trainers.preference import PreferenceModule


class KTOModule(PreferenceModule):
    """`loss(policy_logps, ref_logps, desirable, reference_point)` → (loss [B], metrics); β and the
    desirable/undesirable weights λ_D, λ_U are bound in the config. `unpaired` is read by the data
    config (pairs are split into unpaired records) and must be true."""

    def __init__(self, loss: Callable, unpaired: bool, **kwargs):
        super().__init__(**kwargs)
        if not unpaired:
            raise ValueError("algorithm=kto learns from unpaired examples: algorithm.unpaired must be true")
        self.loss_fn = loss

    def micro_loss(self, batch: PreferenceBatch):
        if batch.desirable is None:
            raise TypeError("algorithm=kto needs unpaired records (prompt, completion, label), got pairs")
        n = len(batch)
        logps = self.batch_logps(self.policy, batch)  # [2B]: matched rows, then mismatched rows
        ref = self.reference_logps(batch)
        z0 = kto_reference_point(logps[n:], ref[n:])
        z0 = self.trainer.strategy.reduce(z0, reduce_op="mean") if self._trainer is not None else z0
        per_example, metrics = self.loss_fn(logps[:n], ref[:n], batch.desirable, z0)
        return per_example.mean(), metrics
