"""Reward sources inside real (tiny) runs, through train.py's plan_stages → run_stage path: per-source
and gold curves reach the summary, abstains are dropped and counted, a broken or hostile reward never
stops training, and both experiments of issue 5 run end to end."""
from __future__ import annotations

import itertools

from omegaconf import OmegaConf, open_dict

from rewards.base import RewardSource
from run.stages import plan_stages, run_stage, set_run_fields
from tests.helpers import TINY
from tests.rewards.test_sandbox_security import attacks

SMALL = ["data.prompts_per_round=4", "algorithm.group_size=4", "data.batch_size=16", "generator.max_new_tokens=4",
         "algorithm.scheduler.num_warmup_steps=0", "callbacks.evaluate.every_n_steps=0"]


class CharSum(RewardSource):
    """Varies inside a group; abstains on completions starting with 'a' (so some samples are dropped)."""

    name, version = "char_sum", "test"

    def score(self, prompts, completions, examples):
        return [None if c.startswith(tuple("abcdefgh")) else (sum(map(ord, c)) % 10) / 10 for c in completions]


class Broken(RewardSource):
    name = "broken"

    def score(self, prompts, completions, examples):
        raise RuntimeError("reward server down")


class Hostile(RewardSource):
    """Scores every sample's code with `inner` (code_exec) after swapping in the breakout attempts."""

    name = "hostile"

    def __init__(self, inner):
        self.inner, self.timeout_s = inner, inner.timeout_s

    def score(self, prompts, completions, examples):
        bad = itertools.cycle(attacks(9, "POLICYSHIFT_NOT_SET", "/tmp/policyshift-pwned-training").values())
        return self.inner.score(prompts, [next(bad) for _ in completions],
                                [type(e)(e.prompt, e.answer, {"entry_point": "attack",
                                                               "tests": [{"args": [], "expected": "pwned"}]})
                                 for e in examples])

    def stats(self):
        return self.inner.stats()


def run(hydra_conf, tmp_path, overrides, reward=None, edit=None):
    stages = plan_stages(hydra_conf(overrides), overrides)
    policy = tokenizer = None
    summaries = {}
    for stage in stages:
        set_run_fields(stage.cfg, tmp_path, stage.name, "test", "test")
        with open_dict(stage.cfg):
            if reward is not None:
                stage.cfg.reward = OmegaConf.create(reward)
            if edit:
                edit(stage.cfg)
        policy, tokenizer, summaries[stage.name] = run_stage(stage, policy, tokenizer)
    return summaries


def test_per_source_and_gold_curves_abstains_and_a_broken_child(hydra_conf, tmp_path):
    reward = {"_target_": "rewards.weighted.WeightedReward", "name": "reward", "missing": "renormalize",
              "sources": {"proxy": {"weight": 1.0, "source": {"_target_": "tests.rewards.test_training.CharSum"}},
                          "down": {"weight": 1.0, "source": {"_target_": "tests.rewards.test_training.Broken"}}},
              "gold": {"_target_": "rewards.verifier.ExactMatchVerifier", "name": "exact"}}
    [m] = run(hydra_conf, tmp_path, ["algorithm=grpo", "trainer.max_steps=2"] + SMALL + TINY, reward).values()
    assert m["train/steps"] == 2 and m["rollout/rounds"] == 2
    for name in ("proxy", "down", "gold", "reward"):
        assert len(m[f"rollout/reward_curve/{name}"]) == 2, name
    assert m["rollout/reward_curve/down"] == [None, None]  # broken every round: logged, not fatal
    assert m["rollout/reward_curve/proxy"] == m["rollout/reward_curve/reward"]  # gold and down not in it
    assert m["rollout/first_reward_error"] == "broken: RuntimeError: reward server down"
    assert m["rollout/reward_abstained"] == m["cost/records_dropped"]
    assert m["cost/reward_errors"] >= 2


def test_training_goes_on_through_every_attack(hydra_conf, tmp_path):
    code_exec = OmegaConf.to_container(hydra_conf(["reward=code_exec"]).reward)
    code_exec["sandbox"] |= {"cpu_seconds": 1, "wall_seconds": 3}
    code_exec["timeout_s"] = 120
    reward = {"_target_": "tests.rewards.test_training.Hostile", "inner": code_exec}
    overrides = ["algorithm=grpo", "task=code", "trainer.max_steps=1", "callbacks.evaluate.num_examples=1",
                 "model.max_position_embeddings=512"]  # prompt + 256 new tokens must fit the context
    [m] = run(hydra_conf, tmp_path, overrides + SMALL + TINY, reward).values()
    assert m["train/steps"] == 1 and m["sandbox/runs"] == 16  # 16 samples cycling through the 10 attacks
    assert m["rollout/reward_curve/hostile"] == [0.0]  # every attack failed
    assert m["sandbox/output_limited"] >= 1 and m["sandbox/timeouts"] + m["sandbox/test_timeouts"] >= 1


def test_experiment_grpo_code_runs_with_sandbox_stats_in_the_summary(hydra_conf, tmp_path):
    def shrink(cfg):
        cfg.trainer.max_steps = 2
        cfg.generator.max_new_tokens = 16
        if "prompts_per_round" in cfg.data:
            cfg.data.prompts_per_round, cfg.data.batch_size = 4, 16
    summary = run(hydra_conf, tmp_path, ["experiment=grpo_code"] + TINY, edit=shrink)
    assert list(summary) == ["sft", "grpo"]
    grpo = summary["grpo"]
    assert grpo["sandbox/backend"] in ("bwrap", "unshare") and grpo["sandbox/runs"] == 2 * 16
    for key in ("rollout/reward_abstained", "rollout/reward_timeouts", "sandbox/timeouts", "sandbox/load_errors",
                "rollout/reward_curve/code_exec", "val/accuracy_after"):
        assert key in grpo, key


def test_experiment_rm_vs_gold_summary_has_both_curves(hydra_conf, tmp_path):
    def shrink(cfg):
        cfg.trainer.max_steps = 2
        if "prompts_per_round" in cfg.data:
            cfg.data.prompts_per_round, cfg.data.batch_size = 4, 32
            cfg.reward.sources.rm.source.build.steps = 3
        else:
            cfg.data.max_examples = 32
    summary = run(hydra_conf, tmp_path, ["experiment=rm_vs_gold"] + TINY, edit=shrink)
    grpo = summary["grpo"]
    assert (tmp_path / "reward_model" / "config.json").is_file()  # built once, in the run dir
    assert len(grpo["rollout/reward_curve/rm"]) == len(grpo["rollout/reward_curve/gold"]) == 2
    assert all(0.0 <= g <= 1.0 for g in grpo["rollout/reward_curve/gold"])
    assert grpo["rollout/reward_curve/rm"] == grpo["rollout/reward_curve/reward"]  # trained on the RM only
    assert "reward_model/pair_accuracy_heldout" in grpo
