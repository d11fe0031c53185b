"""Every experiment file (and every algorithm alone) runs a few steps of each of its stages on CPU,
through the same `plan_stages` → `run_stage` path as train.py, and every stage changes the policy."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import open_dict

from run.stages import plan_stages, run_stage, set_run_fields
from run.validation.config import validate
from tests.conftest import CONF
from models.synthetic import write_qwen_like
from tests.helpers import CHAT_MODEL, TINY, TINY_MODEL

EXPERIMENTS = sorted(p.stem for p in (Path(CONF) / "experiment").glob("*.yaml"))
ALGORITHMS = sorted(p.stem for p in (Path(CONF) / "algorithm").glob("*.yaml"))
SMALL = {"trainer.max_steps": 2, "data.prompts_per_round": 4, "data.batch_size": 16,
         "data.max_examples": 64, "callbacks.evaluate.every_n_steps": 0}


def shrink(cfg) -> None:
    """Make a stage tiny: set each SMALL key its config has (a stage without the key is left alone)."""
    with open_dict(cfg):
        for dotted, value in SMALL.items():
            parent, _, leaf = dotted.rpartition(".")
            node = _select(cfg, parent)
            if node is not None and leaf in node:
                node[leaf] = value
        if "group_size" in cfg.algorithm:
            cfg.algorithm.group_size = 4


def _select(cfg, dotted):
    node = cfg
    for part in dotted.split("."):
        node = node.get(part) if node is not None else None
    return node


def run_all_stages(hydra_conf, overrides, tmp_path):
    overrides = overrides + ["reward._target_=tests.helpers.LengthReward"]
    stages = plan_stages(hydra_conf(overrides), overrides)
    policy = tokenizer = None
    for stage in stages:
        shrink(stage.cfg)
        validate(stage.cfg, stage.name)
        set_run_fields(stage.cfg, tmp_path, stage.name, "test", "test")
        if policy is None:
            before, _ = instantiate(stage.cfg.model)
        else:
            before = policy
        start = {k: v.detach().clone() for k, v in before.state_dict().items()}
        policy, tokenizer, metrics = run_stage(stage, policy, tokenizer)
        assert metrics["train/steps"] == 2, stage.name
        changed = [k for k, v in policy.state_dict().items() if not torch.equal(v, start[k])]
        if stage.cfg.algorithm.name == "reward_model":  # trains its own model, saved beside the policy
            assert not changed and (tmp_path / "reward_model" / "config.json").is_file()
        else:
            assert changed, f"stage {stage.name}: no parameter changed"
        assert "val/accuracy_after" in metrics
    return stages


HF_EXPERIMENTS = {"tool_use_chat"}  # model=hf: run on the synthetic ChatML model (a long context: tools in the prompt)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_runs_a_few_steps(hydra_conf, tmp_path, experiment):
    small = TINY
    if experiment in HF_EXPERIMENTS:
        folder = write_qwen_like(tmp_path / "chat", tokenizer="bpe", **{**CHAT_MODEL, "max_position_embeddings": 1024})
        small = [f"model.name_or_path={folder}", *TINY[len(TINY_MODEL):]]
    stages = run_all_stages(hydra_conf, [f"experiment={experiment}", *small], tmp_path)
    assert stages


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_alone_runs_a_few_steps(hydra_conf, tmp_path, algorithm):
    [stage] = run_all_stages(hydra_conf, [f"algorithm={algorithm}"] + TINY, tmp_path)
    assert stage.name == algorithm
