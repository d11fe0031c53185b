"""When to pay for fresh data: end a round early when its data has drifted too far from the policy.

A round normally serves all its steps ("schedule": every N steps, N = the data module's steps per round).
After each step this callback checks the step's off-policy diagnostics (trainers/rollout.py) and asks
the module to end the round before the next step when
    ess          train/ess_frac < min_ess_frac          (the importance weights have degenerated)
    kl           train/kl_behaviour > max_kl            (KL(behaviour ‖ current) per token)
    staleness    the round's oldest record is more than max_staleness policy versions old
The module ends the round through Lightning's supported way (on_train_batch_start returning -1, agreed
across ranks); RegenerateExperience then makes the next round and logs the reason as rollout/trigger.
Each threshold is off when null.
"""
from __future__ import annotations

import lightning as L


class DriftTrigger(L.Callback):
    def __init__(self, min_ess_frac: float | None, max_kl: float | None, max_staleness: int | None):
        self.min_ess_frac, self.max_kl, self.max_staleness = min_ess_frac, max_kl, max_staleness

    def reason(self, trainer: L.Trainer, pl_module) -> str | None:
        """The first threshold crossed after the latest step, or None."""
        diag = getattr(pl_module, "last_diagnostics", {})
        if self.min_ess_frac is not None and diag.get("train/ess_frac", 1.0) < self.min_ess_frac:
            return "ess"
        if self.max_kl is not None and diag.get("train/kl_behaviour", 0.0) > self.max_kl:
            return "kl"
        if self.max_staleness is None:
            return None
        oldest = getattr(trainer.datamodule, "round_oldest_version", lambda: None)()
        now = getattr(pl_module, "policy_version", trainer.global_step)  # run-wide, as records' versions are
        return "staleness" if oldest is not None and now - oldest > self.max_staleness else None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        reason = self.reason(trainer, pl_module)
        if reason and hasattr(pl_module, "request_round_end"):
            pl_module.request_round_end(reason)
