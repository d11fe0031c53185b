"""A Lightning callback that train.py builds like any other (`+callbacks.bench_timer._target_=...`), so
policyshift is measured on the path users run: it marks every optimizer step and writes the marks as
JSON when training ends.

Recorded per optimizer step k (as bench/bench_train.py measures them):
  ends[k]        perf_counter at on_train_batch_end (step k's wall time is ends[k] - ends[k-1]: for
                 GRPO one whole round: generation, reward, annotation, dataloader, train step)
  train_step[k]  on_train_batch_start → on_train_batch_end (forward, backward, clip, optimizer, logging)
  trained_tokens[k]  the tokens step k trained on (its batch's attention mask summed, as the cost ledger
                 counts them; a preference batch's chosen and rejected rows both): the train step's FLOPs
  generation[k], generated_tokens[k]: what RegenerateExperience's totals grew by before step k (its
                 HFGenerator.sample time and tokens; the round step k trains on), online data only
  annotate[k]    GRPOModule.annotate (advantages + reference log-probs) of that round
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import lightning as L


class StepTimer(L.Callback):
    def __init__(self, out: str):
        self.out = Path(out)
        self.ends: list[float] = []
        self.train_step: list[float] = []
        self.trained_tokens: list[int] = []
        self.totals: list[dict] = []  # RegenerateExperience.totals at each step's start
        self.annotate: list[float] = []
        self._start = 0.0
        self._regen = None
        self.fit_start = 0.0

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._regen = next((cb for cb in trainer.callbacks if hasattr(cb, "totals") and hasattr(cb, "regenerate")),
                           None)
        if hasattr(pl_module, "annotate"):
            inner, sink = pl_module.annotate, self.annotate

            def annotate(records):
                start = time.perf_counter()
                out = inner(records)
                sink.append(time.perf_counter() - start)
                return out

            pl_module.annotate = annotate  # the instance's bound method, wrapped (as bench_train.timed)

    def on_fit_start(self, trainer, pl_module) -> None:
        self.fit_start = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._regen is not None:
            self.totals.append(dict(self._regen.totals))
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        self.train_step.append(now - self._start)
        self.ends.append(now)
        sequences = getattr(batch, "sequences", batch)  # a PreferenceBatch wraps its 2B sequences
        mask = getattr(sequences, "attention_mask", None)
        self.trained_tokens.append(int(mask.sum()) if mask is not None else 0)

    def on_train_end(self, trainer, pl_module) -> None:
        result = {"side": "policyshift", "ends": self.ends, "train_step": self.train_step,
                  "trained_tokens": self.trained_tokens,
                  "optimizer_steps": trainer.global_step, "fit_start": self.fit_start,
                  "parameters": sum(p.numel() for p in pl_module.policy.parameters()),
                  "torch_threads": __import__("torch").get_num_threads()}
        if self.totals:
            before = [{"generation_seconds": 0.0, "generated_tokens": 0}] + self.totals[:-1]
            result["generation"] = [t["generation_seconds"] - b["generation_seconds"]
                                    for t, b in zip(self.totals, before)]
            result["generated_tokens"] = [t["generated_tokens"] - b["generated_tokens"]
                                          for t, b in zip(self.totals, before)]
            result["annotate"] = self.annotate[: len(self.ends)]
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, self.out)
