"""Held-out evaluation on a schedule (callbacks.evaluate.schedule: a list of steps or dense-early
'EVERY:UNTIL,...,EVERY' segments), the curve's step-0 point at 0 generated tokens, and the cost ledger's
cost/train_seconds without the evaluation time, with a real Lightning Trainer in the default hook order
(regenerate, evaluate, ..., cost)."""
from __future__ import annotations

import time

import lightning as L
import pytest
from hydra.utils import instantiate

import callbacks.evaluate as evaluate_module
from callbacks.cost import CostLedger, StepClock
from callbacks.evaluate import EvalSchedule, HeldOutEvaluation, parse_schedule
from run.stages import build, plan_stages
from tests.callbacks.test_hook_order import CharSumReward
from tests.data_modules.test_replay_mix import stage_cfg

EVAL_SECONDS = 0.8


def due_steps(schedule, upto=130) -> list[int]:
    return [s for s in range(1, upto + 1) if parse_schedule(schedule).due(s)]


def test_dense_early_segments_and_lists_of_steps():
    assert due_steps("5:50,25") == [5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 75, 100, 125]
    assert due_steps("10:30,50:200", 400) == [10, 20, 30, 50, 100, 150, 200]  # none after the last UNTIL
    assert due_steps(" 2:6 , 4 ", 12) == [2, 4, 6, 8, 12]  # after 6: the multiples of 4
    assert due_steps([40, 10, 25], 50) == [10, 25, 40]
    assert due_steps("25") == [25, 50, 75, 100, 125]
    assert parse_schedule(None) is None and parse_schedule([3]) == EvalSchedule(steps=frozenset({3}))


@pytest.mark.parametrize("value, reason", [
    ("5,25", "segment '5' needs EVERY:UNTIL (only the last may be a bare EVERY)"),
    ("5:50,x", "'x' in segment 'x' is not an integer ≥ 1"),
    ("0:50,25", "'0' in segment '0:50' is not an integer ≥ 1"),
    ("10:50,5:40", "segment '5:40' must end after step 50, where the one before it ends"),
    ([10, 0], "step 0 is not an integer ≥ 1"),
    ([], "the list of steps is empty"),
    (350, "a number is not a schedule"),
])
def test_bad_schedules_say_what_is_wrong(value, reason):
    with pytest.raises(ValueError) as e:
        parse_schedule(value)
    assert str(e.value).startswith(reason)


def test_a_bad_schedule_is_one_line_naming_the_key_when_planning(hydra_conf):
    from run.errors import ConfigError
    overrides = ["algorithm=grpo", 'callbacks.evaluate.schedule="5,25"']
    with pytest.raises(ConfigError) as e:
        plan_stages(hydra_conf(overrides), overrides)
    assert e.value.problems == ["callbacks.evaluate.schedule='5,25' must be null (every "
                                "callbacks.evaluate.every_n_steps steps), a list of steps ([10, 50, 100]) or "
                                "'EVERY:UNTIL,...,EVERY' ('5:50,25': every 5 steps up to step 50, then every 25): "
                                "segment '5' needs EVERY:UNTIL (only the last may be a bare EVERY)"]
    [stage] = plan_stages(hydra_conf(["algorithm=grpo", "callbacks.evaluate.schedule=[2,4]"]),
                          ["algorithm=grpo", "callbacks.evaluate.schedule=[2,4]"])
    assert list(stage.cfg.callbacks.evaluate.schedule) == [2, 4]


def slow_evaluate(*args, **kwargs):
    time.sleep(EVAL_SECONDS)
    return {"val/accuracy": 0.5, "val/unscored": 0.0, "val/response_len_mean": 3.0}


def test_scheduled_evaluations_zero_tokens_at_step_0_and_train_seconds_without_evaluation(tmp_path, monkeypatch):
    """6 steps of 2-step rounds, evaluations at steps 0 (before), 2 and 4 (the schedule) and 6 (after),
    each sleeping 0.8 s: steps 2 and 4's evaluations run inside the ledger's batch window, and must not be
    counted as training time; the step-0 point comes after round 1 was generated but reports 0 tokens."""
    monkeypatch.setattr(evaluate_module, "evaluate", slow_evaluate)
    stage = stage_cfg(tmp_path, ["data.replay_ratio=0", "callbacks.evaluate.schedule=[2,4,5]",
                                 "callbacks.evaluate.every_n_steps=1"])  # the schedule wins over every_n_steps
    cfg = stage.cfg
    L.seed_everything(cfg.seed, verbose=False)
    policy, tokenizer = instantiate(cfg.model)
    generator = instantiate(cfg.generator)
    regenerate = build(cfg.callbacks.regenerate, generator=generator, reward=CharSumReward())
    evaluation = build(cfg.callbacks.evaluate, generator=generator, task=stage.task)
    ledger = instantiate(cfg.callbacks.cost)
    assert isinstance(evaluation, HeldOutEvaluation) and isinstance(ledger, CostLedger)
    trainer = L.Trainer(**(dict(cfg.trainer) | {"max_steps": 6, "enable_checkpointing": False}),
                        logger=False, enable_progress_bar=False, default_root_dir=str(tmp_path),
                        callbacks=[regenerate, evaluation, ledger])  # conf/callbacks/default.yaml's order
    start = time.perf_counter()
    trainer.fit(build(cfg.algorithm, policy=policy, tokenizer=tokenizer),
                datamodule=build(cfg.data, task=stage.task, tokenizer=tokenizer))
    wall = time.perf_counter() - start
    assert [step for step, _ in evaluation.history] == [0, 2, 4, 5, 6]
    assert isinstance(trainer.callbacks[0], StepClock) and sum(isinstance(c, StepClock) for c in trainer.callbacks) == 1
    tokens = [p["generated_tokens"] for p in evaluation.curve]
    assert tokens[0] == 0 and regenerate.totals["generated_tokens"] > 0
    assert 0 < tokens[1] <= tokens[-1] == regenerate.totals["generated_tokens"]
    assert evaluation.seconds >= 5 * EVAL_SECONDS
    seconds = [p["seconds"] for p in evaluation.curve]  # the stage's wall seconds, its evaluations left out
    assert seconds == sorted(seconds) and seconds[0] >= 0
    assert seconds[-1] < wall - 4 * EVAL_SECONDS, (seconds, wall)  # the 4 evaluations before the last are out
    train_seconds = ledger.summary()["cost/train_seconds"]
    assert 0 < train_seconds < min(EVAL_SECONDS, wall - evaluation.seconds), (train_seconds, wall)
