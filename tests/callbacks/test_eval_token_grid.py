"""callbacks.evaluate.every_n_tokens (issue 33, measurement v2): held-out evaluation on a grid of generated
tokens that every config shares, whatever its tokens a step; the next due point is checkpointed."""
from __future__ import annotations

import pytest

import callbacks.evaluate as evaluate_module
from callbacks.evaluate import HeldOutEvaluation
from run.stages import plan_stages
from tasks.arithmetic import arithmetic_task

TOKENS_A_ROUND, STEPS_A_ROUND = 700, 2


class FakeTrainer:
    def __init__(self, max_steps: int = 100):
        self.global_step, self.max_steps = 0, max_steps


def evaluation(monkeypatch, tokens: list[int], every: int | None = 1000, every_n_steps: int = 0):
    """A HeldOutEvaluation whose evaluations only note their step, and whose tokens come from `tokens[0]`."""
    monkeypatch.setattr(evaluate_module, "generated_tokens", lambda trainer: tokens[0])
    ev = HeldOutEvaluation(generator=None, verifier="exact", task=arithmetic_task(1, 10, 0),
                           every_n_steps=every_n_steps, num_examples=None, every_n_tokens=every)
    monkeypatch.setattr(ev, "_run", lambda trainer, module: ev.history.append((trainer.global_step, 0.5)))
    return ev


def run_steps(ev, tokens: list[int], steps: range) -> None:
    trainer = FakeTrainer()
    for step in steps:  # round r (700 tokens) is generated before its 2 steps: steps 1-2 see 700, 3-4 1,400, ...
        trainer.global_step = step
        tokens[0] = TOKENS_A_ROUND * ((step + STEPS_A_ROUND - 1) // STEPS_A_ROUND)
        ev.on_train_batch_end(trainer, None, None, None, 0)


def test_the_grid_evaluates_once_per_crossing_hand_worked(monkeypatch):
    """Tokens at steps 1…10: 700 700 1400 1400 2100 2100 2800 2800 3500 3500. The multiples of 1,000 are
    crossed at step 3 (1,400), step 5 (2,100: 2,000) and step 9 (3,500: 3,000); never twice for one."""
    tokens = [0]
    ev = evaluation(monkeypatch, tokens, every_n_steps=4)  # the token grid replaces the step schedule
    run_steps(ev, tokens, range(1, 11))
    assert [s for s, _ in ev.history] == [3, 5, 9]
    assert ev.next_tokens == 4000


def test_a_round_crossing_two_multiples_is_evaluated_once(monkeypatch):
    tokens = [0]
    ev = evaluation(monkeypatch, tokens, every=300)  # 700 a round: 300 and 600 crossed by round 1 at once
    run_steps(ev, tokens, range(1, 5))
    assert [s for s, _ in ev.history] == [1, 3]  # 700 ≥ 300 (next 900), 1,400 ≥ 900 (next 1,500)
    assert ev.next_tokens == 1500


def test_the_next_due_point_is_checkpointed(monkeypatch):
    tokens = [0]
    ev = evaluation(monkeypatch, tokens)
    run_steps(ev, tokens, range(1, 7))
    state = ev.state_dict()
    assert state["next_tokens"] == 3000
    resumed = evaluation(monkeypatch, tokens)
    resumed.load_state_dict(state)
    run_steps(resumed, tokens, range(7, 11))
    assert [s for s, _ in resumed.history] == [3, 5, 9]  # as the uninterrupted run: not re-evaluated at 7


def test_off_by_default_the_step_schedule_decides(monkeypatch):
    tokens = [0]
    ev = evaluation(monkeypatch, tokens, every=None, every_n_steps=4)
    run_steps(ev, tokens, range(1, 11))
    assert [s for s, _ in ev.history] == [4, 8]


def test_a_bad_value_is_refused(monkeypatch, hydra_conf):
    with pytest.raises(ValueError, match=r"callbacks.evaluate.every_n_tokens=-5: an integer ≥ 1"):
        evaluation(monkeypatch, [0], every=-5)
    from run.errors import ConfigError
    overrides = ["algorithm=grpo", "callbacks.evaluate.every_n_tokens=-5"]
    with pytest.raises(ConfigError) as e:
        plan_stages(hydra_conf(overrides), overrides)
    assert "callbacks.evaluate.every_n_tokens" in " ".join(e.value.problems)
    ok = ["algorithm=grpo", "callbacks.evaluate.every_n_tokens=20000"]
    [stage] = plan_stages(hydra_conf(ok), ok)
    assert stage.cfg.callbacks.evaluate.every_n_tokens == 20000


def test_a_stage_ending_right_after_a_grid_evaluation_is_not_evaluated_twice(monkeypatch):
    """A budget ends the stage at step 5, just evaluated on the grid (2,100 tokens ≥ 2,000): the end's
    'after' number is that evaluation, not a second one of the same weights."""
    tokens, calls = [0], []

    def fake_run(trainer, module):
        calls.append(trainer.global_step)
        ev.history.append((trainer.global_step, 0.5))
        ev.latest = (trainer.global_step, {"val/accuracy": 0.5})
        return ev.latest[1]
    ev = evaluation(monkeypatch, tokens)
    monkeypatch.setattr(ev, "_run", fake_run)
    run_steps(ev, tokens, range(1, 6))
    trainer = FakeTrainer()
    trainer.global_step = 5
    ev.on_train_end(trainer, None)
    assert calls == [3, 5] and ev.after == {"val/accuracy": 0.5}
    trainer.global_step = 6  # a stage that ends elsewhere is evaluated at its end
    ev.on_train_end(trainer, None)
    assert calls == [3, 5, 6]
