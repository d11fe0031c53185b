"""The `scheduler` group (conf/scheduler, `# @package algorithm.scheduler`): each algorithm's default
schedule is the one it had before the group existed, `scheduler=linear|cosine` decays over each stage's
own trainer.max_steps, and an algorithm= choice in a stage never wipes the command line's choice."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from run.errors import ConfigError
from run.stages import plan_stages
from tests.helpers import TINY

CONF = Path(__file__).resolve().parent.parent / "conf"
ALGORITHMS = sorted(f.stem for f in (CONF / "algorithm").glob("*.yaml"))
CONSTANT = {"_target_": "transformers.get_constant_schedule_with_warmup", "_partial_": True, "num_warmup_steps": 10}


def plan(hydra_conf, overrides):
    return plan_stages(hydra_conf(overrides), overrides)


def node(cfg) -> dict:
    return dict(cfg.algorithm.scheduler)


def test_the_defaults_are_the_schedules_each_algorithm_had(hydra_conf):
    """sft: cosine over its max_steps with 20 warmup steps; every other algorithm: constant after 10 (the
    quickstart's grpo stage picks cosine in its own overrides)."""
    sft, grpo = (s.cfg for s in plan(hydra_conf, []))
    assert node(sft) == {"_target_": "transformers.get_cosine_schedule_with_warmup", "_partial_": True,
                         "num_warmup_steps": 20, "num_training_steps": 2000}
    assert node(grpo) == node(sft) | {"num_warmup_steps": 10, "num_training_steps": 600}
    for algorithm in ALGORITHMS:
        cfg = hydra_conf([f"algorithm={algorithm}"])
        assert node(cfg) == (node(sft) | {"num_training_steps": 100} if algorithm == "sft" else CONSTANT), algorithm


@pytest.mark.parametrize("choice, target", [("linear", "get_linear_schedule_with_warmup"),
                                            ("cosine", "get_cosine_schedule_with_warmup")])
def test_a_decay_lasts_each_stages_own_max_steps(hydra_conf, choice, target):
    """The quickstart's stages set trainer.max_steps 2000 and 600 in their overrides; the stage's
    algorithm=sft|grpo choice keeps the command line's scheduler, and sft keeps its own warmup."""
    sft, grpo = (s.cfg for s in plan(hydra_conf, [f"scheduler={choice}"]))
    assert node(sft) == {"_target_": f"transformers.{target}", "_partial_": True, "num_warmup_steps": 20,
                         "num_training_steps": 2000}
    assert node(grpo) == {"_target_": f"transformers.{target}", "_partial_": True, "num_warmup_steps": 10,
                          "num_training_steps": 600}
    sft, grpo = (s.cfg for s in plan(hydra_conf, [f"scheduler={choice}", "trainer.max_steps=7"]))
    assert sft.algorithm.scheduler.num_training_steps == grpo.algorithm.scheduler.num_training_steps == 7


def test_constant_over_sft_drops_the_decay_length(hydra_conf):
    [sft] = plan(hydra_conf, ["algorithm=sft", "scheduler=constant"])
    assert node(sft.cfg) == CONSTANT | {"num_warmup_steps": 20}


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("choice", ["constant", "linear", "cosine"])
def test_every_choice_builds_for_every_algorithm(hydra_conf, algorithm, choice):
    """Each choice's node is callable with the optimizer alone (as configure_optimizers calls it) over
    every algorithm's own scheduler keys; linear and cosine end near 0 at max_steps, constant stays at lr."""
    cfg = hydra_conf([f"algorithm={algorithm}", f"scheduler={choice}", "trainer.max_steps=40",
                      "algorithm.scheduler.num_warmup_steps=4"] + TINY)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = instantiate(cfg.algorithm.scheduler)(opt)
    lrs = []
    for _ in range(40):  # one scheduler step per optimizer step (trainers/base.py training_step)
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    assert lrs[0] == 0.0 and lrs[4] == pytest.approx(1.0)  # warmup from 0 over 4 steps
    if choice == "constant":
        assert lrs[4:] == [1.0] * 36
    else:
        assert lrs[5:] == sorted(lrs[5:], reverse=True) and lrs[-1] < 0.05


def test_a_decay_needs_a_positive_length(hydra_conf):
    with pytest.raises(ConfigError, match=r"algorithm.scheduler.num_training_steps=0 must be a positive integer"):
        plan(hydra_conf, ["algorithm=grpo", "scheduler=linear", "algorithm.scheduler.num_training_steps=0"])
