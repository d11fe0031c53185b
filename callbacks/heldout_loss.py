"""Held-out loss of supervised fine-tuning: the NLL per token of the task's held-out demonstrations.

Active only when the data module has `heldout_records` (data=demonstrations: the task's held-out
examples with their reference answers, never trained on) and the module has `heldout_metrics` (SFT); a
no-op for every other stage. Runs at fit start ("before"), every `every_n_steps` steps and at train end
("after"), logging val/loss (mean NLL per completion token) and val/target_prob (mean probability of the
target token). It needs no verifier: on data whose answers no verifier checks (free text) it is the
held-out measure of what SFT trains; held-out greedy accuracy (callbacks/evaluate.py) runs beside it.
"""
from __future__ import annotations

import lightning as L

from callbacks.logging import log_now
from data_modules.state_checks import metrics
from hardware.console import say


class HeldOutLoss(L.Callback):
    def __init__(self, every_n_steps: int, batch_size: int, num_examples: int | None):
        self.every_n_steps, self.batch_size, self.num_examples = every_n_steps, batch_size, num_examples
        self.before: dict | None = None
        self.after: dict | None = None

    def _records(self, trainer, pl_module) -> list:
        records = getattr(trainer.datamodule, "heldout_records", None)
        if not records or not hasattr(pl_module, "heldout_metrics"):
            return []
        return records[: self.num_examples] if self.num_examples else records

    def _run(self, trainer, pl_module) -> dict | None:
        records = self._records(trainer, pl_module)
        if not records:
            return None
        result = {f"val/{k}": v for k, v in pl_module.heldout_metrics(records, self.batch_size).items()}
        log_now(trainer, result)
        say(trainer, f"[eval] step {trainer.global_step}: held-out loss {result['val/loss']:.4f} (target-token "
                     f"probability {result['val/target_prob']:.3f}) on {len(records)} demonstrations")
        return result

    def on_fit_start(self, trainer, pl_module):
        if self.before is None:  # resumed: the stage's start value comes from the checkpoint
            self.before = self._run(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.every_n_steps and step % self.every_n_steps == 0 and 0 < step < trainer.max_steps:
            self._run(trainer, pl_module)

    def on_train_end(self, trainer, pl_module):
        self.after = self._run(trainer, pl_module)

    def state_dict(self) -> dict:
        return {"before": self.before}

    def load_state_dict(self, state: dict) -> None:
        metrics(state.get("before"), f"callbacks.{self.state_key}.before")
        self.before = state.get("before")

    def summary(self) -> dict:
        out = {f"{k}_before": v for k, v in (self.before or {}).items()}
        return out | {f"{k}_after": v for k, v in (self.after or {}).items()}
