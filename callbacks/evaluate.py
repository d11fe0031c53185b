"""Held-out evaluation: greedy decoding on the task's held-out examples, scored by the stage's verifier.

The scorer follows the stage (callbacks.evaluate.verifier, callbacks/eval_verifier.py): `auto` uses the
stage's reward when it is a verifier (math answers, exact match, code execution), else exact match with
the task's reference answers; the console names it once per stage. A stage whose data module does not
train on the task (`trains_on_task` False: DPO on a preference file) is not evaluated on the task: its
own held-out pairs are (callbacks/preference_eval.py); callbacks.evaluate.on_other_data=true evaluates
the task anyway.

Runs at fit start (the "before" number), during the stage on the steps `schedule` names (or, with no
schedule, every `every_n_steps` optimizer steps), and at train end (the "after" number). A schedule is
    [10, 25, 50, 100]     exactly these optimizer steps
    "5:50,25"             EVERY:UNTIL segments, the last one may be a bare EVERY: the steps that are
                          multiples of 5 up to step 50, then the multiples of 25 after it (dense early)
    "10:100,50:500"       multiples of 10 up to 100, of 50 up to 500, none after
A token grid instead (callbacks.evaluate.every_n_tokens=N, N > 0; it replaces both): evaluate after the
first optimizer step at which the stage's cumulative generated tokens (`generated_tokens`) have crossed
the next multiple of N; a round that crosses several multiples is evaluated once, and the next due point
is the first multiple past it. Configs that generate at different rates then share one grid of tokens
(scripts/figures/economics_v2.py); the next due point is checkpointed, so a resumed stage keeps the grid.
(on the command line quote a string with commas: 'callbacks.evaluate.schedule="5:50,25"'; in YAML quote
it too: an unquoted 5:50 is YAML's base-60 number 350). With ranks, each decodes its share of the
examples and all get the whole set's numbers; only rank 0 logs and prints. The before number
and the curve are checkpointed: a resumed stage reports the accuracy it started from, not the one at
the resume point. The curve's `generated_tokens` are the tokens generated for the rounds that the
optimizer steps so far trained on: 0 at step 0 (round 1, made at fit start, is not trained on yet);
its `seconds` the stage's wall seconds so far, its evaluations left out.
Each evaluation's seconds add up in `seconds` (the cost ledger keeps evaluation out of cost/train_seconds).
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import lightning as L
from omegaconf import ListConfig
from torchmetrics import MeanMetric

from callbacks.eval_verifier import choose_verifier, is_verifier
from callbacks.logging import find_callback, log_now
from callbacks.episodes import sample
from data_modules.state_checks import StateError, integer, metrics, number, sequence, within
from generators.base import weights_loaded
from generators.hf import HFGenerator
from hardware import distributed
from hardware.console import say
from hardware.sharding import full_weights
from rewards.base import RewardSource, ScoreReport, safe_score
from tasks.base import Task, encode_example


def evaluate(policy, tokenizer, task: Task, generator: HFGenerator, verifier: RewardSource,
             num_examples: int | None = None, env=None, policy_version: int | None = None) -> dict[str, float]:
    """Greedy held-out accuracy and mean response length of `policy` on `task.heldout` (with ranks: each
    rank decodes its share, every rank gets the whole set's numbers). With an environment (`env`, a
    factory) each example is a greedy episode scored on its final answer: val/accuracy is then the
    held-out success with the tools, and val/tool_calls_per_episode says how often they were called.
    `policy_version`: the policy's version (an engine with its own copy of the weights pushes only when
    it holds another: generators.base.at_version)."""
    examples = task.heldout[:num_examples] if num_examples else task.heldout
    mine = distributed.shard(examples)
    prompts = [encode_example(tokenizer, ex, task.chat) for ex in mine]
    done = sample(generator, policy, tokenizer, prompts, mine, env, task.chat, greedy=True,
                  policy_version=policy_version) if prompts else None
    texts = done.texts if done else []
    report = safe_score(verifier, [ex.prompt for ex in mine], texts, mine)  # never raises
    lengths = [len(c) for c in done.out.completions] if done else []
    calls = done.stats.get("tool_calls", 0.0) if done else 0.0
    parts = distributed.gather((report, lengths, calls))
    report, lengths = ScoreReport.merge([p[0] for p in parts]), [n for p in parts for n in p[1]]
    tools = {"val/tool_calls_per_episode": sum(p[2] for p in parts) / max(len(lengths), 1)} if env else {}
    acc = MeanMetric()
    for s in report.scores:
        acc.update(float(s or 0.0))  # an unscored answer (verifier failed or abstained) counts as wrong
    return {"val/accuracy": float(acc.compute()), "val/unscored": float(report.abstained),
            "val/response_len_mean": sum(lengths) / max(len(lengths), 1), **tools,
            **({"first_error": report.first_error} if report.first_error else {})}


SCHEDULE_FORMS = ("null (every callbacks.evaluate.every_n_steps steps), a list of steps ([10, 50, 100]) or "
                  "'EVERY:UNTIL,...,EVERY' ('5:50,25': every 5 steps up to step 50, then every 25)")


@dataclass(frozen=True)
class EvalSchedule:
    """When held-out evaluation runs during a stage: listed steps, or (every, until) segments in order,
    `until` None for the last one's open end. Step 0 and the stage's end are evaluated anyway."""
    steps: frozenset = frozenset()
    segments: tuple = ()

    def due(self, step: int) -> bool:
        if step in self.steps:
            return True
        for every, until in self.segments:  # the first segment whose range holds the step decides
            if until is None or step <= until:
                return step % every == 0
        return False


def parse_schedule(value) -> EvalSchedule | None:
    """callbacks.evaluate.schedule as an EvalSchedule (None: none given); ValueError says what is wrong."""
    if value is None:
        return None
    if isinstance(value, (list, tuple, ListConfig)):
        steps = list(value)
        bad = [s for s in steps if not (_is_int(s) and s > 0)]
        if not steps or bad:
            raise ValueError(f"step {bad[0]!r} is not an integer ≥ 1" if bad else "the list of steps is empty")
        return EvalSchedule(steps=frozenset(steps))
    if not isinstance(value, str):
        raise ValueError("a number is not a schedule (one interval: callbacks.evaluate.every_n_steps=N; in YAML "
                         "quote a schedule: an unquoted 5:50 is the number 350)" if isinstance(value, (int, float))
                         else f"a {type(value).__name__} is not a schedule")
    parts, segments, lower = [p.strip() for p in value.split(",")], [], 0
    for i, part in enumerate(parts):
        every, colon, until = part.partition(":")
        if not colon and i < len(parts) - 1:
            raise ValueError(f"segment {part!r} needs EVERY:UNTIL (only the last may be a bare EVERY)")
        every = _positive(every, part)
        until = _positive(until, part) if colon else None
        if until is not None and until <= lower:
            raise ValueError(f"segment {part!r} must end after step {lower}, where the one before it ends")
        segments.append((every, until))
        lower = until or lower
    return EvalSchedule(segments=tuple(segments))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(text: str, part: str) -> int:
    if not (text.strip().isascii() and text.strip().isdigit()) or int(text) < 1:
        raise ValueError(f"{text.strip()!r} in segment {part!r} is not an integer ≥ 1")
    return int(text)


class HeldOutEvaluation(L.Callback):
    def __init__(self, generator: HFGenerator, verifier: str | RewardSource, task: Task,
                 every_n_steps: int, num_examples: int | None, schedule: str | list | None = None,
                 reward: RewardSource | None = None, on_other_data: bool = False, env=None,
                 every_n_tokens: int | None = None):
        self.generator, self.task, self.on_other_data = generator, task, on_other_data
        self.env = env  # an environment factory (envs/): held-out episodes; None: one turn
        self.verifier, self.why = choose_verifier(verifier, reward, task)  # why: the console's line
        self.active = True  # False: the stage trains on other data than the task (see on_fit_start)
        self.every_n_steps, self.num_examples = every_n_steps, num_examples
        self.schedule = parse_schedule(schedule)  # None: every_n_steps
        if every_n_tokens is not None and (not _is_int(every_n_tokens) or every_n_tokens < 0):
            raise ValueError(f"callbacks.evaluate.every_n_tokens={every_n_tokens!r}: an integer ≥ 1 (0 or null: off)")
        self.every_n_tokens = every_n_tokens or None  # None: the step schedule decides
        self.next_tokens = self.every_n_tokens or 0  # the next multiple of every_n_tokens due (checkpointed)
        self.before: dict | None = None
        self.after: dict | None = None
        self.history: list[tuple[int, float]] = []
        self.curve: list[dict] = []  # {step, generated_tokens, seconds, accuracy}: accuracy against rollout cost
        self.latest: tuple[int, dict | None] = (-1, None)  # (step, result) of this process's last evaluation
        self.seconds = 0.0  # spent evaluating in this process (CostLedger leaves it out of cost/train_seconds)
        self._clock: tuple[float, float] = (time.perf_counter(), 0.0)  # (fit start, stage seconds before it)

    def due(self, step: int, tokens: int = 0) -> bool:
        """Whether the stage evaluates after optimizer step `step` (> 0), `tokens` generated so far."""
        if self.every_n_tokens:
            return tokens >= self.next_tokens
        if self.schedule is not None:
            return self.schedule.due(step)
        return bool(self.every_n_steps) and step % self.every_n_steps == 0

    def stage_seconds(self) -> float:
        """Wall seconds of the stage so far without its evaluations (a resumed stage continues from its
        checkpoint's last curve point)."""
        started, before = self._clock
        return before + time.perf_counter() - started - self.seconds

    def _run(self, trainer, pl_module) -> dict:
        start, seconds = time.perf_counter(), self.stage_seconds()
        with weights_loaded(self.generator, pl_module.policy, pl_module.tokenizer), full_weights(pl_module):
            # an engine's weights synced by every rank together; FSDP: gathered once (ranks decode uneven shares)
            result = evaluate(pl_module.policy, pl_module.tokenizer, self.task, self.generator,
                              self.verifier, self.num_examples, self.env, getattr(pl_module, "policy_version", None))
        error = result.pop("first_error", None)
        if error:
            say(trainer, f"WARNING [eval] {result['val/unscored']:.0f} held-out answers unscored, counted wrong: {error}")
        self.history.append((trainer.global_step, result["val/accuracy"]))
        tokens = generated_tokens(trainer) if trainer.global_step > 0 else 0  # round 1 is not trained on yet
        self.curve.append({"step": trainer.global_step, "generated_tokens": tokens,
                           "seconds": round(seconds, 2), "accuracy": result["val/accuracy"]})
        log_now(trainer, result)
        say(trainer, f"[eval] step {trainer.global_step}: held-out greedy accuracy "
                     f"{result['val/accuracy']:.3f} on {len(self.task.heldout[:self.num_examples])}")
        self.seconds += time.perf_counter() - start
        self.latest = (trainer.global_step, result)
        return result

    def on_fit_start(self, trainer, pl_module):
        self._clock = (time.perf_counter(), self.curve[-1].get("seconds", 0.0) if self.curve else 0.0)
        datamodule = getattr(trainer, "datamodule", None)
        if not self.on_other_data and not getattr(datamodule, "trains_on_task", True):
            self.active = False
            say(trainer, f"[eval] no held-out accuracy on task {self.task.name!r}: the stage trains on "
                         f"{getattr(datamodule, 'source', 'other data')}, not on the task (its own held-out "
                         f"data is evaluated by callbacks.preference_eval; callbacks.evaluate.on_other_data=true "
                         f"evaluates the task anyway)")
            return
        if is_verifier(self.verifier) and self.task.heldout and not any(getattr(ex, "answer", True) for ex in self.task.heldout):
            self.active = False  # every answer would score wrong: an accuracy of 0 that measures nothing
            say(trainer, f"[eval] no held-out accuracy on task {self.task.name!r}: its held-out rows are prompt-only "
                         f"(no reference answer) and {self.why} checks answers (callbacks.evaluate.verifier names "
                         f"a reward that needs none)")
            return
        say(trainer, f"[eval] held-out accuracy is scored by {self.why}")
        if self.before is None:
            self.before = self._run(trainer, pl_module)
        else:  # resumed: the stage's start value comes from the checkpoint, never from the resumed weights
            say(trainer, f"[eval] held-out greedy accuracy before the stage (from the checkpoint): "
                         f"{self.before['val/accuracy']:.3f}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        tokens = generated_tokens(trainer) if self.every_n_tokens else 0
        if self.active and step > 0 and step < trainer.max_steps and self.due(step, tokens):
            if not self.history or self.history[-1][0] != step:
                self._run(trainer, pl_module)
            if self.every_n_tokens:  # the first multiple past the tokens so far
                self.next_tokens = (tokens // self.every_n_tokens + 1) * self.every_n_tokens

    def on_train_end(self, trainer, pl_module):
        if self.active:  # a stage that ended (budget) right after an evaluation of its last step: that one
            step, result = self.latest
            self.after = result if step == trainer.global_step else self._run(trainer, pl_module)

    STATE = ("before", "history", "curve", "next_tokens")  # checkpointed: a resumed stage keeps its real start value

    def state_dict(self) -> dict:
        return copy.deepcopy({k: getattr(self, k) for k in self.STATE})

    def load_state_dict(self, state: dict) -> None:
        with within(f"callbacks.{self.state_key}"):
            metrics(state.get("before"), "before")
            for i, h in enumerate(sequence(state.get("history", []), "history")):
                if len(sequence(h, f"history[{i}]")) != 2:
                    raise StateError(f"history[{i}]", "not a (step, accuracy) pair")
                integer(h[0], f"history[{i}].step")
                number(h[1], f"history[{i}].accuracy", high=1.0)
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
            if "val/tool_calls_per_episode" in self.after:
                out["val/tool_calls_per_episode"] = self.after["val/tool_calls_per_episode"]
        if self.curve:
            out["val/curve"] = self.curve
        return out


def generated_tokens(trainer: L.Trainer) -> int:
    """Tokens generated for training so far in this stage (by the regeneration callback, if any)."""
    regen = find_callback(trainer, "RegenerateExperience")
    return regen.totals["generated_tokens"] if regen is not None else 0
