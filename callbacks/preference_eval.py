"""Held-out preference accuracy for algorithms that learn from pairs (DPO, IPO, KTO, reward model).

Active only when the data module has `heldout_pairs` and the module has `preference_metrics`; a no-op
for every other algorithm. Runs at fit start ("before"), every `every_n_steps` steps and at train end
("after"), logging val/pref_accuracy (share of held-out pairs the algorithm's reward ranks right, ties
½: DPO/IPO/KTO's implicit reward β·log π/π_ref relative to the stage's reference, so 0.5 at the start;
the reward model's score), val/reward_margin (its mean gap) and, for policies, val/logp_accuracy (share
of pairs where log π(chosen) > log π(rejected): the policy as a likelihood ranker). Its summary also carries the data
module's load report (data/rows, data/truncated_rows, data/skipped_rows, ...).
"""
from __future__ import annotations

import lightning as L

from callbacks.logging import log_now
from data_modules.state_checks import metrics
from hardware.console import say


class PreferenceEvaluation(L.Callback):
    def __init__(self, every_n_steps: int, batch_size: int):
        self.every_n_steps, self.batch_size = every_n_steps, batch_size
        self.before: dict | None = None
        self.after: dict | None = None
        self.data: dict = {}

    @staticmethod
    def _pairs(trainer, pl_module) -> list:
        pairs = getattr(trainer.datamodule, "heldout_pairs", None)
        return pairs if pairs and hasattr(pl_module, "preference_metrics") else []

    def _run(self, trainer, pl_module) -> dict | None:
        pairs = self._pairs(trainer, pl_module)
        if not pairs:
            return None
        result = {f"val/{k}": v for k, v in pl_module.preference_metrics(pairs, self.batch_size).items()}
        log_now(trainer, result)
        say(trainer, f"[eval] step {trainer.global_step}: held-out preference accuracy "
                     f"{result['val/pref_accuracy']:.3f} on {len(pairs)} pairs")
        return result

    def on_fit_start(self, trainer, pl_module):
        stats = getattr(trainer.datamodule, "stats", None)
        self.data = stats.summary() if hasattr(stats, "summary") else {}
        if hasattr(pl_module, "preference_metrics") and hasattr(trainer.datamodule, "heldout_pairs") \
                and not trainer.datamodule.heldout_pairs:  # a preference stage with nothing held out: say so
            say(trainer, "[eval] no held-out preference accuracy: the stage's data holds out no pairs "
                         "(data.heldout_path, or data.num_heldout > 0, holds some out)")
        if self.before is None:  # resumed: the stage's start value comes from the checkpoint
            self.before = self._run(trainer, pl_module)

    def state_dict(self) -> dict:
        return {"before": self.before}

    def load_state_dict(self, state: dict) -> None:
        metrics(state.get("before"), f"callbacks.{self.state_key}.before")
        self.before = state.get("before")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.every_n_steps and step % self.every_n_steps == 0 and step < trainer.max_steps:
            self._run(trainer, pl_module)

    def on_train_end(self, trainer, pl_module):
        self.after = self._run(trainer, pl_module)
        stats = getattr(trainer.datamodule, "stats", None)
        self.data = stats.summary() if hasattr(stats, "summary") else self.data

    def summary(self) -> dict:
        out = dict(self.data)
        if self.before:
            out |= {f"{k}_before": v for k, v in self.before.items() if k != "val/reward_margin"}
        if self.after:
            out |= {f"{k}_after": v for k, v in self.after.items()}
        return out
