"""Held-out evaluation follows the stage: its verifier is the stage's reward when that is a verifier
(callbacks/eval_verifier.py), and a stage that trains on other data than the task is not scored on it."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hydra.utils import instantiate

from callbacks.eval_verifier import choose_verifier
from callbacks.evaluate import HeldOutEvaluation
from rewards.base import RewardSource
from rewards.math_answer import MathAnswerVerifier
from rewards.verifier import ExactMatchVerifier
from rewards.weighted import WeightedReward
from run.stages import build_callbacks, set_run_fields
from tasks.base import Example, Task
from tests.helpers import TINY

ANSWERS = ["The answer is 42.", "so \\boxed{42}", "42"]


class ProxyReward(RewardSource):  # a learned reward model or a judge: not a verifier
    name = "rm"

    def score(self, prompts, completions, examples):
        return [0.9] * len(completions)


@pytest.fixture
def math_file(tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"What is 6*7? ({i})", "answer": "42"}) + "\n" for i in range(8)))
    return path


def test_jsonl_task_with_reward_math_is_evaluated_as_the_math_reward_scores(hydra_conf, math_file, tmp_path):
    """The README's own example: the held-out scorer is the stage's math reward, not exact match, so
    "The answer is 42." and \\boxed{42} count as right ([1, 1, 1], where exact match gave [0, 0, 1])."""
    cfg = hydra_conf(TINY + ["task=jsonl", f"task.train_path={math_file}", "task.num_heldout=3", "reward=math"])
    set_run_fields(cfg, tmp_path, "grpo", "g", "n")
    task, reward = instantiate(cfg.task), instantiate(cfg.reward)
    [ev] = [c for c in build_callbacks(cfg, instantiate(cfg.generator), reward, task)
            if isinstance(c, HeldOutEvaluation)]
    examples = task.heldout[:3]
    prompts = [ex.prompt for ex in examples]
    assert reward.score(prompts, ANSWERS, examples) == [1.0, 1.0, 1.0]
    assert ev.verifier.score(prompts, ANSWERS, examples) == [1.0, 1.0, 1.0]
    assert "'math' (MathAnswerVerifier)" in ev.why


def test_exact_is_still_there_when_asked_for(hydra_conf, math_file, tmp_path):
    cfg = hydra_conf(TINY + ["task=jsonl", f"task.train_path={math_file}", "task.num_heldout=3", "reward=math",
                             "callbacks.evaluate.verifier=exact"])
    set_run_fields(cfg, tmp_path, "grpo", "g", "n")
    task = instantiate(cfg.task)
    [ev] = [c for c in build_callbacks(cfg, None, instantiate(cfg.reward), task) if isinstance(c, HeldOutEvaluation)]
    assert ev.verifier.score([""] * 3, ANSWERS, task.heldout[:3]) == [0.0, 0.0, 1.0]


TASK = Task("t", train=[], heldout=[Example("q", "42")])


def test_a_proxy_reward_is_never_accuracy_and_the_console_says_so():
    verifier, why = choose_verifier("auto", ProxyReward(), TASK)
    assert isinstance(verifier, ExactMatchVerifier)
    assert "'rm' (ProxyReward) does not score against the reference answer" in why
    verifier, why = choose_verifier("auto", None, TASK)
    assert isinstance(verifier, ExactMatchVerifier) and "no reward" in why


def test_a_weighted_reward_is_evaluated_by_its_gold_verifier_not_by_its_mix():
    gold = MathAnswerVerifier(name="gold", timeout_s=5)
    mix = WeightedReward(name="mix", sources={"rm": {"weight": 1.0, "source": ProxyReward()}}, missing="abstain",
                         gold=gold)
    assert choose_verifier("auto", mix, TASK)[0] is gold
    no_gold = WeightedReward(name="mix", sources={"m": {"weight": 0.5, "source": gold}}, missing="abstain")
    assert isinstance(choose_verifier("auto", no_gold, TASK)[0], ExactMatchVerifier)


def test_a_function_reward_is_a_verifier_only_when_its_function_says_so():
    from functools import partial

    from rewards.math_answer import math_answer_scores
    from rewards.verifier import FunctionReward
    checker = FunctionReward(name="function", version="1", fn=partial(math_answer_scores),
                             per_sample_timeout_s=None, timeout_s=5)
    assert choose_verifier("auto", checker, TASK)[0] is checker
    other = FunctionReward(name="f", version="1", fn=lambda p, c, e: [0.5] * len(c), per_sample_timeout_s=None,
                           timeout_s=5)
    assert isinstance(choose_verifier("auto", other, TASK)[0], ExactMatchVerifier)


def test_a_node_wins_and_a_bad_word_names_the_key():
    node = MathAnswerVerifier(name="m", timeout_s=5)
    assert choose_verifier(node, ProxyReward(), TASK)[0] is node
    with pytest.raises(ValueError, match="callbacks.evaluate.verifier='math'"):
        choose_verifier("math", None, TASK)


def fake_trainer(datamodule, said):
    return SimpleNamespace(datamodule=datamodule, global_step=0, max_steps=10, is_global_zero=True,
                           callbacks=[], progress_bar_callback=None, loggers=[], said=said)


def test_a_stage_on_its_own_preference_file_is_not_scored_on_the_task(monkeypatch):
    said, runs = [], []
    monkeypatch.setattr("callbacks.evaluate.say", lambda trainer, text: said.append(text))
    ev = HeldOutEvaluation(generator=None, verifier="auto", task=TASK, every_n_steps=1, num_examples=None,
                           reward=MathAnswerVerifier(name="math", timeout_s=5))
    monkeypatch.setattr(ev, "_run", lambda trainer, module: runs.append(trainer.global_step) or {})
    own = SimpleNamespace(trains_on_task=False, source="/data/prefs.jsonl")
    trainer = fake_trainer(own, said)
    ev.on_fit_start(trainer, None)
    trainer.global_step = 1
    ev.on_train_batch_end(trainer, None, None, None, 0)
    ev.on_train_end(trainer, None)
    assert runs == [] and ev.summary() == {}
    assert "no held-out accuracy on task 't'" in said[0] and "/data/prefs.jsonl" in said[0]
    ev = HeldOutEvaluation(generator=None, verifier="auto", task=TASK, every_n_steps=1, num_examples=None,
                           reward=MathAnswerVerifier(name="math", timeout_s=5), on_other_data=True)
    monkeypatch.setattr(ev, "_run", lambda trainer, module: runs.append(trainer.global_step) or {})
    ev.on_fit_start(fake_trainer(own, said), None)
    assert runs == [0] and "scored by the stage's reward 'math'" in said[-1]


def test_static_preferences_from_a_file_do_not_train_on_the_task(hydra_conf, tmp_path):
    from run.stages import build
    from tests.helpers import tiny_model
    rows = [{"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i)} for i in range(6)]
    path = tmp_path / "prefs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, tok = tiny_model()
    task = Task("t", train=[Example("1+1=", "2")], heldout=[Example("2+2=", "4")])
    cfg = hydra_conf(["algorithm=dpo", "data=static_preferences", f"data.path={path}", "data.num_heldout=2"] + TINY)
    assert build(cfg.data, task=task, tokenizer=tok).trains_on_task is False
    cfg = hydra_conf(["algorithm=dpo", "data=static_preferences"] + TINY)
    assert getattr(build(cfg.data, task=task, tokenizer=tok), "trains_on_task", True) is True
