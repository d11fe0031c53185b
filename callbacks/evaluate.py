"""Held-out evaluation: greedy decoding on the task's held-out examples, scored by the exact verifier.

Runs at fit start (the "before" number), every `every_n_steps` optimizer steps, and at train end (the
"after" number). With ranks, each decodes its share of the examples and all get the whole set's
numbers; only rank 0 logs and prints. The before number
and the curve are checkpointed: a resumed stage reports the accuracy it started from, not the one at
the resume point.
"""
from __future__ import annotations

import copy

import lightning as L
from torchmetrics import MeanMetric

from callbacks.logging import find_callback, log_now, say
from data_modules.tasks.base import Task, encode_prompt
from models.generation import HFGenerator
from models.sharding import full_weights
from rewards.base import RewardSource, ScoreReport, safe_score
from trainers import distributed


def evaluate(policy, tokenizer, task: Task, generator: HFGenerator, verifier: RewardSource,
             num_examples: int | None = None) -> dict[str, float]:
    """Greedy held-out accuracy and mean response length of `policy` on `task.heldout` (with ranks: each
    rank decodes its share, every rank gets the whole set's numbers)."""
    examples = task.heldout[:num_examples] if num_examples else task.heldout
    mine = distributed.shard(examples)
    prompts = [encode_prompt(tokenizer, ex.prompt, task.chat) for ex in mine]
    out = generator.sample(policy, tokenizer, prompts, greedy=True) if prompts else None
    texts = tokenizer.batch_decode(out.completions, skip_special_tokens=True) if out else []
    report = safe_score(verifier, [ex.prompt for ex in mine], texts, mine)  # never raises
    lengths = [len(c) for c in out.completions] if out else []
    parts = distributed.gather((report, lengths))
    report, lengths = ScoreReport.merge([p[0] for p in parts]), [n for p in parts for n in p[1]]
    acc = MeanMetric()
    for s in report.scores:
        acc.update(float(s or 0.0))  # an unscored answer (verifier failed or abstained) counts as wrong
    return {"val/accuracy": float(acc.compute()), "val/unscored": float(report.abstained),
            "val/response_len_mean": sum(lengths) / max(len(lengths), 1),
            **({"first_error": report.first_error} if report.first_error else {})}


class HeldOutEvaluation(L.Callback):
    def __init__(self, generator: HFGenerator, verifier: RewardSource, task: Task,
                 every_n_steps: int, num_examples: int | None):
        self.generator, self.verifier, self.task = generator, verifier, task
        self.every_n_steps, self.num_examples = every_n_steps, num_examples
        self.before: dict | None = None
        self.after: dict | None = None
        self.history: list[tuple[int, float]] = []
        self.curve: list[dict] = []  # {step, generated_tokens, accuracy}: accuracy against rollout cost

    def _run(self, trainer, pl_module) -> dict:
        with full_weights(pl_module):  # FSDP: gathered once (ranks decode uneven shares)
            result = evaluate(pl_module.policy, pl_module.tokenizer, self.task, self.generator,
                              self.verifier, self.num_examples)
        error = result.pop("first_error", None)
        if error:
            say(trainer, f"WARNING [eval] {result['val/unscored']:.0f} held-out answers unscored, counted wrong: {error}")
        self.history.append((trainer.global_step, result["val/accuracy"]))
        self.curve.append({"step": trainer.global_step, "generated_tokens": generated_tokens(trainer),
                           "accuracy": result["val/accuracy"]})
        log_now(trainer, result)
        say(trainer, f"[eval] step {trainer.global_step}: held-out greedy accuracy "
                     f"{result['val/accuracy']:.3f} on {len(self.task.heldout[:self.num_examples])}")
        return result

    def on_fit_start(self, trainer, pl_module):
        if self.before is None:
            self.before = self._run(trainer, pl_module)
        else:  # resumed: the stage's start value comes from the checkpoint, never from the resumed weights
            say(trainer, f"[eval] held-out greedy accuracy before the stage (from the checkpoint): "
                         f"{self.before['val/accuracy']:.3f}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.every_n_steps and step % self.every_n_steps == 0 and step < trainer.max_steps:
            if not self.history or self.history[-1][0] != step:
                self._run(trainer, pl_module)

    def on_train_end(self, trainer, pl_module):
        self.after = self._run(trainer, pl_module)

    STATE = ("before", "history", "curve")  # checkpointed: a resumed stage keeps its real start value

    def state_dict(self) -> dict:
        return copy.deepcopy({k: getattr(self, k) for k in self.STATE})

    def load_state_dict(self, state: dict) -> None:
        for k in self.STATE:
            setattr(self, k, copy.deepcopy(state.get(k, getattr(self, k))))
        self.history = [tuple(h) for h in self.history]

    def summary(self) -> dict:
        out = {}
        if self.before:
            out["val/accuracy_before"] = self.before["val/accuracy"]
        if self.after:
            out["val/accuracy_after"] = self.after["val/accuracy"]
            out["val/response_len_mean"] = self.after["val/response_len_mean"]
        if self.curve:
            out["val/curve"] = self.curve
        return out


def generated_tokens(trainer: L.Trainer) -> int:
    """Tokens generated for training so far in this stage (by the regeneration callback, if any)."""
    regen = find_callback(trainer, "RegenerateExperience")
    return regen.totals["generated_tokens"] if regen is not None else 0
