"""Learning-nothing guards: say loudly, in the console and in summary.json (`warnings`), when a run is
stepping the optimizer without a learning signal, instead of printing 0.000 for every metric.

After each round (read from RegenerateExperience's `last_round`):
    zero_variance   every group's rewards are equal for `patience_rounds` rounds in a row (GRPO's
                    group-relative advantages are then all zero: e.g. an untrained model that the exact
                    verifier scores 0 everywhere; start from SFT, or use a denser reward)
    truncated       ≥ `max_truncated_frac` of the completions hit generator.max_new_tokens
    no_eos          no completion ended with eos (or another stop id: generators.base.stop_ids) for
                    `patience_rounds` rounds in a row
After each optimizer step:
    zero_loss       the loss was exactly 0 for `patience_steps` steps in a row
Each warning is printed once per episode (it re-arms once the condition clears).
"""
from __future__ import annotations

import lightning as L

from callbacks.logging import find_callback
from data_modules.state_checks import StateError, field, integer, mapping, sequence, within
from hardware.console import say

HINTS = {
    "zero_variance": "every group's rewards are equal (no advantage, no gradient): start from an SFT "
                     "policy, raise algorithm.group_size, or use a denser reward",
    "truncated": "completions hit generator.max_new_tokens: raise it, or the answers are cut before "
                 "the verifier sees them",
    "no_eos": "no completion ended with eos (or another stop id): the policy never learned to stop",
    "zero_loss": "the loss is exactly 0: nothing is being learned",
}


class LearningGuards(L.Callback):
    def __init__(self, patience_rounds: int, patience_steps: int, max_truncated_frac: float):
        self.patience_rounds, self.patience_steps = patience_rounds, patience_steps
        self.max_truncated_frac = max_truncated_frac
        self.streaks = {name: 0 for name in HINTS}
        self.warnings: list[str] = []
        self.rounds_seen = 0

    def _update(self, trainer, name: str, bad: bool, patience: int, what: str) -> None:
        self.streaks[name] = self.streaks[name] + 1 if bad else 0
        if self.streaks[name] == patience:
            message = f"step {trainer.global_step}: {what} ({HINTS[name]})"
            self.warnings.append(message)
            say(trainer, f"WARNING [guard] {message}")

    def on_train_epoch_start(self, trainer, pl_module):
        regen = find_callback(trainer, "RegenerateExperience")
        if regen is None or regen.rounds == self.rounds_seen or not regen.last_round:
            return
        self.rounds_seen, r, k = regen.rounds, regen.last_round, self.patience_rounds
        zero_std = r.get("rollout/frac_zero_std")
        if zero_std is not None and zero_std == zero_std:  # NaN: the algorithm has no groups
            self._update(trainer, "zero_variance", zero_std >= 1.0, k, f"{k} rounds with zero reward variance in every group")
        truncated = r.get("rollout/truncated_frac", 0.0)
        self._update(trainer, "truncated", truncated >= self.max_truncated_frac, 1,
                     f"{truncated:.0%} of the round's completions hit the token limit")
        self._update(trainer, "no_eos", r.get("rollout/eos_frac", 1.0) == 0.0, k, f"{k} rounds without an eos")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self._update(trainer, "zero_loss", float(loss) == 0.0, self.patience_steps,
                         f"{self.patience_steps} optimizer steps in a row with a loss of exactly 0")

    def state_dict(self) -> dict:
        return {"streaks": dict(self.streaks), "warnings": list(self.warnings), "rounds_seen": self.rounds_seen}

    def load_state_dict(self, state: dict) -> None:
        with within(f"callbacks.{self.state_key}"):
            for name, n in mapping(field(state, "streaks"), "streaks").items():
                integer(n, f"streaks.{name}")
            if not all(isinstance(w, str) for w in sequence(field(state, "warnings"), "warnings")):
                raise StateError("warnings", "not a list of texts")
            integer(field(state, "rounds_seen"), "rounds_seen")
        self.streaks, self.warnings = dict(state["streaks"]), list(state["warnings"])
        self.rounds_seen = state["rounds_seen"]

    def summary(self) -> dict:
        return {"warnings": list(self.warnings)} if self.warnings else {}
