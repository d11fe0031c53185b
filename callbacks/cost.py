"""The cost ledger: what the run's experience cost and what it bought, per round and per run.

Generation is counted by RegenerateExperience (prompt/generated tokens, generation seconds, records
generated and dropped); this callback adds the training side and the verdict:
    cost/train_seconds, cost/trained_tokens     time in training steps (from the ledger's on_train_batch_start
                                                to the first on_train_batch_end hook: held-out evaluation
                                                and other callbacks' batch-end work left out); prompt+completion
                                                tokens trained on
    cost/records_used                           distinct records served at least once
    cost/records_evicted_unused                 records the buffer dropped before they were ever served
    cost/records_unused_at_end                  records still in the buffer, never served, at the end (and
                                                surplus groups dynamic sampling carried past the last round)
    cost/mean_reuse                             serves per used record (μ × replays)
    cost/usd = generated Mtok × usd_per_mtok_generated + trained Mtok × usd_per_mtok_trained
    cost/reward_gain_per_mtok                   (last round's mean reward - first round's) per million
                                                generated tokens: the learning signal a token bought
    cost/accuracy_gain_per_mtok                 the same with held-out accuracy (after - before)
    cost/tool_wait_seconds_frac                 with an env: the seconds rounds waited for tools
                                                (cost/tool_wait_seconds) over those and the generation
                                                and training seconds
Per round (at each round's end) the cumulative values are logged, plus cost/round_train_seconds.
With ranks, each counts its share of every step and each report adds them up (seconds: the slowest).
"""
from __future__ import annotations

import time

import lightning as L

from callbacks.logging import find_callback, log_now
from data_modules.state_checks import field, integer, number, within
from hardware import distributed


class StepClock(L.Callback):
    """Stops the ledger's step clock in the first on_train_batch_end hook of the step, before any other
    callback's (held-out evaluation, preference evaluation, the progress bar, drift checks): CostLedger
    puts it at the head of the trainer's callbacks at setup. Holds no state of its own."""

    def __init__(self, ledger: CostLedger):
        self.ledger = ledger

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.ledger.stop_clock()


class CostLedger(L.Callback):
    def __init__(self, usd_per_mtok_generated: float, usd_per_mtok_trained: float):
        self.usd_gen, self.usd_train = usd_per_mtok_generated, usd_per_mtok_trained
        self.train_seconds = self.round_train_seconds = 0.0
        self.trained_tokens = self.serves = self.records_used = 0
        self.unused_at_end = 0
        self._t0 = self._dt = 0.0
        self._clock = StepClock(self)
        self._pending = {"seconds": 0.0, "tokens": 0.0, "serves": 0.0, "used": 0.0}  # since the last report
        self.generation: dict = {}  # RegenerateExperience.totals, read at each report
        self.tool_wait_seconds: float | None = None  # RegenerateExperience.tool_totals' (env set)
        self.reward_first = self.reward_last = None
        self.accuracy_before = self.accuracy_after = None
        self.last: dict[str, float] = {}
        self.last_end_step = -1  # the step of the last round end reported (checkpointed)

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not any(cb is self._clock for cb in trainer.callbacks):  # a new list: Lightning iterates the old one
            trainer.callbacks = [self._clock, *trainer.callbacks]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._t0, self._dt = time.perf_counter(), None

    def stop_clock(self) -> None:
        """The step's training time ends here (StepClock, first of the batch-end hooks)."""
        if self._dt is None:
            self._dt = time.perf_counter() - self._t0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        """Counts this rank's share of the step; `ledger` adds up the ranks' counts at each report."""
        self.stop_clock()  # already stopped by StepClock unless the ledger runs without it
        dt = self._dt
        sequences = getattr(batch, "sequences", batch)  # a PreferenceBatch wraps its 2B sequences
        records = getattr(batch, "records", [])
        self._pending["seconds"] += dt
        self._pending["tokens"] += int(sequences.attention_mask.sum()) if hasattr(sequences, "attention_mask") else 0
        self._pending["serves"] += len(records)
        self._pending["used"] += sum(getattr(r, "provenance", None) is not None and r.provenance.times_used == 1
                                     for r in records)

    def _settle(self) -> None:
        """Fold the steps since the last report into the totals: tokens and records summed over the ranks
        (each rank trained on its share), seconds those of the slowest rank. Every rank calls it."""
        p = self._pending
        seconds = distributed.reduce_max([p["seconds"]])[0]
        tokens, serves, used = distributed.reduce_sum([p["tokens"], p["serves"], p["used"]])
        self.train_seconds += seconds
        self.round_train_seconds += seconds
        self.trained_tokens += int(tokens)
        self.serves += int(serves)
        self.records_used += int(used)
        self._pending = dict.fromkeys(p, 0.0)

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.global_step == self.last_end_step:  # Lightning replays the hook when it resumes from a
            return                                     # round-end checkpoint: that round was reported
        self.last_end_step = trainer.global_step
        log_now(trainer, self.ledger(trainer) | {"cost/round_train_seconds": self.round_train_seconds})
        self.round_train_seconds = 0.0

    def on_train_end(self, trainer, pl_module):
        buffer = getattr(trainer.datamodule, "buffer", None)
        if buffer is not None:
            self.unused_at_end = sum(r.provenance.times_used == 0 for g in buffer.groups.values() for r in g)
        carry = getattr(trainer.datamodule, "carry", None)  # data_modules/carry.py: scored, not yet served
        self.unused_at_end += len(carry.records) if carry is not None else 0
        log_now(trainer, self.ledger(trainer))

    def ledger(self, trainer: L.Trainer) -> dict[str, float]:
        """The run's ledger so far (reads the generation totals and the eval numbers it needs)."""
        self._settle()
        regen = find_callback(trainer, "RegenerateExperience")
        evaluation = find_callback(trainer, "HeldOutEvaluation")
        if regen is not None:
            self.generation = dict(regen.totals)
            self.tool_wait_seconds = regen.tool_totals.get("tool_wait_seconds") if regen.env is not None else None
            seen = [m for m in regen.reward_means if m == m]
            self.reward_first, self.reward_last = (seen[0], seen[-1]) if seen else (None, None)
        if evaluation is not None and evaluation.before:
            self.accuracy_before = evaluation.before["val/accuracy"]
            self.accuracy_after = (evaluation.after or evaluation.before)["val/accuracy"]
        buffer = getattr(trainer.datamodule, "buffer", None)
        self.last = self._numbers(getattr(buffer, "evicted_unused", 0))
        return self.last

    def _numbers(self, evicted_unused: int) -> dict[str, float]:
        gen_mtok = self.generation.get("generated_tokens", 0) / 1e6
        out = {"cost/train_seconds": self.train_seconds, "cost/trained_tokens": float(self.trained_tokens),
               "cost/records_used": float(self.records_used),
               "cost/records_evicted_unused": float(evicted_unused),
               "cost/records_unused_at_end": float(self.unused_at_end),
               "cost/mean_reuse": self.serves / self.records_used if self.records_used else 0.0,
               "cost/usd_generation": gen_mtok * self.usd_gen,
               "cost/usd_training": self.trained_tokens / 1e6 * self.usd_train}
        out["cost/usd"] = out["cost/usd_generation"] + out["cost/usd_training"]
        if gen_mtok > 0 and self.reward_first is not None:
            out["cost/reward_gain_per_mtok"] = (self.reward_last - self.reward_first) / gen_mtok
        if self.tool_wait_seconds is not None:  # tool time against generation and training time
            total = self.tool_wait_seconds + self.generation.get("generation_seconds", 0.0) + self.train_seconds
            out["cost/tool_wait_seconds_frac"] = self.tool_wait_seconds / total if total > 0 else 0.0
        if gen_mtok > 0 and self.accuracy_before is not None:
            out["cost/accuracy_gain_per_mtok"] = (self.accuracy_after - self.accuracy_before) / gen_mtok
        return out

    def summary(self) -> dict:
        """The final ledger (on_train_end runs after HeldOutEvaluation's: it comes later in the list)."""
        return self.last

    def state_dict(self) -> dict:
        return {"train_seconds": self.train_seconds, "trained_tokens": self.trained_tokens,
                "serves": self.serves, "records_used": self.records_used, "last_end_step": self.last_end_step}

    def load_state_dict(self, state: dict) -> None:
        with within(f"callbacks.{self.state_key}"):
            number(field(state, "train_seconds"), "train_seconds")
            for key in ("trained_tokens", "serves", "records_used"):
                integer(field(state, key), key)
            integer(state.get("last_end_step", -1), "last_end_step", low=-1)
        self.train_seconds, self.trained_tokens = state["train_seconds"], state["trained_tokens"]
        self.serves, self.records_used = state["serves"], state["records_used"]
        self.last_end_step = state.get("last_end_step", -1)
