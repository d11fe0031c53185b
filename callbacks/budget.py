"""StageBudget: `budget.generated_tokens` and `budget.usd` end a stage like `trainer.max_steps` does.

Spent = the cost ledger's own counts, never recounted: `cost/generated_tokens` (RegenerateExperience's
totals, counted when a round is generated) and `cost/usd` (CostLedger: generation + training). Both are
whole-run figures, identical on every rank (the round is gathered before it is counted; the ledger sums
the ranks' training counts), so every rank takes the same decision without a vote.

Checked at each round's end (a round is an epoch; GRPO's default round is one optimizer step), after
the round's training and before the next round is generated: the round whose generation crossed the
budget is still trained on (its tokens were paid for), then the stage ends as a normal end
(`trainer.should_stop`): final.ckpt, policy and summary written, `stop_reason` in summary.json. Checked
also at fit start, so a resumed stage whose checkpoint already spent its budget generates nothing more.
This callback must come before RegenerateExperience (it moves itself there at setup): the regeneration
callback reads `trainer.should_stop` and makes no round past the budget.
"""
from __future__ import annotations

import lightning as L

from callbacks.logging import find_callback
from hardware.console import say


class StageBudget(L.Callback):
    def __init__(self, generated_tokens: int | None, usd: float | None):
        self.generated_tokens, self.usd = generated_tokens, usd
        self.stop_reason: str | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        """Put this callback before RegenerateExperience: its round-end decision must come first."""
        if self.usd is not None and find_callback(trainer, "CostLedger") is None:
            raise ValueError(f"budget.usd={self.usd} needs the cost ledger (callbacks.cost), which is off")
        regen = find_callback(trainer, "RegenerateExperience")
        if regen is None or self not in trainer.callbacks:
            return
        others = [cb for cb in trainer.callbacks if cb is not self]
        at = others.index(regen)
        trainer.callbacks = others[:at] + [self] + others[at:]  # a new list: Lightning iterates the old one

    def spent(self, trainer) -> str | None:
        """The first budget this stage has spent, said with its figures, or None."""
        if self.generated_tokens is not None:
            regen = find_callback(trainer, "RegenerateExperience")
            tokens = regen.totals["generated_tokens"] if regen is not None else 0
            if tokens >= self.generated_tokens:
                return f"budget.generated_tokens ({tokens:,} ≥ {self.generated_tokens:,})"
        if self.usd is not None:
            usd = find_callback(trainer, "CostLedger").ledger(trainer)["cost/usd"]
            if usd >= self.usd:
                return f"budget.usd (${usd:,.6g} ≥ ${self.usd:,.6g})"
        return None

    def _check(self, trainer) -> None:
        reason = self.spent(trainer)
        if reason is None:
            return
        self.stop_reason, trainer.should_stop = reason, True
        say(trainer, f"[budget] step {trainer.global_step}: stage ends on {reason}")

    def on_fit_start(self, trainer, pl_module):
        if self.generated_tokens is not None or self.usd is not None:
            self._check(trainer)  # a resumed stage may have spent its budget already

    def on_train_epoch_end(self, trainer, pl_module):
        regen = find_callback(trainer, "RegenerateExperience")
        if regen is not None and trainer.global_step == regen.last_end_step:
            return  # the hook Lightning replays on resuming from a round-end checkpoint: the round made at
                    # fit start (which may have crossed the budget) is still to be trained on
        if self.stop_reason is None and (self.generated_tokens is not None or self.usd is not None):
            self._check(trainer)

    def on_train_end(self, trainer, pl_module):
        if self.stop_reason is None and 0 < trainer.max_steps <= trainer.global_step:
            self.stop_reason = f"trainer.max_steps ({trainer.global_step:,} ≥ {trainer.max_steps:,})"

    def summary(self) -> dict:
        return {"stop_reason": self.stop_reason} if self.stop_reason else {}
