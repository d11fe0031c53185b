"""The model's recipe (conf/recipe): model=tiny keeps the values the configs held before the recipe
existed, model=hf takes a pretrained model's (near TRL's defaults), a key on the command line wins, and
the console names the values a stage took from it."""
from __future__ import annotations

from pathlib import Path

import pytest

from run.stages import plan_stages
from tests.bad_inputs.setups import edit_config, model_folder

CONF = Path(__file__).resolve().parent.parent.parent / "conf"
ALGORITHMS = sorted(f.stem for f in (CONF / "algorithm").glob("*.yaml"))
# before conf/recipe: each algorithm file's own lr, the scheduler group's warmups, the generator's length
TINY_LR = {"sft": 1e-3, "dpo": 1e-4, "ipo": 1e-4, "online_dpo": 1e-4, "spin": 1e-4, "kto": 5e-5, "reward_model": 3e-4,
           "grpo": 3e-4, "dr_grpo": 3e-4, "rloo": 3e-4, "reinforce_pp": 3e-4, "ppo": 3e-4,
           "rejection_sampling": 3e-4}
PRETRAINED_LR = {"sft": 2e-5, "dpo": 1e-6, "ipo": 1e-6, "online_dpo": 5e-7, "spin": 5e-7, "kto": 1e-6, "reward_model": 1e-5,
                 "grpo": 1e-6, "dr_grpo": 1e-6, "rloo": 1e-6, "reinforce_pp": 1e-6, "ppo": 3e-6,
                 "rejection_sampling": 1e-5}
STATIC = {"sft", "dpo", "ipo", "kto", "reward_model"}


@pytest.fixture
def hf_folder(tmp_path) -> str:
    """The tests' tiny model saved as a Hugging Face folder, with room for 256 new tokens."""
    model_folder("m", edit_config(max_position_embeddings=512))(tmp_path)
    return str(tmp_path / "m")


def test_every_algorithm_lists_its_lr():
    assert sorted(TINY_LR) == sorted(PRETRAINED_LR) == ALGORITHMS


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_model_tiny_keeps_the_values_it_had(hydra_conf, algorithm):
    cfg = hydra_conf([f"algorithm={algorithm}"])
    assert cfg.recipe.name == "tiny"
    assert cfg.algorithm.optimizer.lr == TINY_LR[algorithm]
    assert cfg.algorithm.scheduler.num_warmup_steps == (20 if algorithm == "sft" else 10)
    assert cfg.generator.max_new_tokens == 8 and cfg.trainer.max_epochs == -1


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_model_hf_takes_a_pretrained_models_recipe(hydra_conf, algorithm):
    """TRL 1.9: SFTConfig 2e-5, DPOConfig/KTOConfig/GRPOConfig/RLOOConfig 1e-6, OnlineDPOConfig 5e-7,
    PPOConfig 3e-6, no warmup, 3 SFT epochs; one epoch over preference data; 256 new tokens."""
    cfg = hydra_conf([f"algorithm={algorithm}", "model=hf", "model.name_or_path=/m"])
    assert cfg.recipe.name == "pretrained"
    assert cfg.algorithm.optimizer.lr == PRETRAINED_LR[algorithm]
    assert cfg.algorithm.scheduler.num_warmup_steps == 0
    assert cfg.generator.max_new_tokens == 256
    assert cfg.trainer.max_epochs == (3 if algorithm == "sft" else 1 if algorithm in STATIC else -1)


def test_the_command_line_wins_over_the_recipe(hydra_conf):
    cfg = hydra_conf(["algorithm=sft", "model=hf", "model.name_or_path=/m", "algorithm.optimizer.lr=1e-4",
                      "generator.max_new_tokens=32"])
    assert cfg.algorithm.optimizer.lr == 1e-4 and cfg.generator.max_new_tokens == 32
    cfg = hydra_conf(["algorithm=sft", "model=hf", "model.name_or_path=/m", "recipe=tiny"])
    assert cfg.algorithm.optimizer.lr == 1e-3 and cfg.trainer.max_epochs == -1


def test_the_quickstart_under_model_hf_plans_a_pretrained_run(hydra_conf, hf_folder):
    """Before the recipe: SFT at lr 3e-3 for 3,000 steps, GRPO at 3e-4 with 8 new tokens. Now SFT runs 3
    epochs over its 1,500 demonstrations at batch 64: ceil(1500 / 64) = 24 steps an epoch, 72 steps."""
    overrides = ["model=hf", f"model.name_or_path={hf_folder}", "logger=none"]
    sft, grpo = (s.cfg for s in plan_stages(hydra_conf(overrides), overrides))
    assert (sft.algorithm.optimizer.lr, sft.trainer.max_epochs, sft.trainer.max_steps) == (2e-5, 3, 72)
    assert sft.algorithm.scheduler.num_training_steps == 72
    assert (grpo.algorithm.optimizer.lr, grpo.generator.max_new_tokens, grpo.trainer.max_steps) == (1e-6, 256, 600)


def test_the_console_names_the_values_taken_from_the_recipe(hydra_conf):
    from run.recipe import recipe_line
    cfg = hydra_conf(["algorithm=grpo", "model=hf", "model.name_or_path=/m", "algorithm.optimizer.lr=1e-5"])
    assert recipe_line("grpo", cfg) == ("[recipe] grpo (recipe=pretrained): algorithm.scheduler.num_warmup_steps=0, "
                                        "generator.max_new_tokens=256")
    cfg = hydra_conf(["algorithm=sft", "model=hf", "model.name_or_path=/m"])
    assert recipe_line("sft", cfg) == ("[recipe] sft (recipe=pretrained): algorithm.scheduler.num_warmup_steps=0, "
                                       "algorithm.optimizer.lr=2e-05, generator.max_new_tokens=256, "
                                       "trainer.max_epochs=3")


def test_a_bad_recipe_value_is_refused_where_it_is_written(hydra_conf):
    from run.errors import ConfigError
    overrides = ["algorithm=sft", "recipe.lr.sft=-1", "recipe.epochs.dpo=0"]
    with pytest.raises(ConfigError) as e:
        plan_stages(hydra_conf(overrides), overrides)
    assert e.value.problems == ["recipe.lr.sft=-1 must be a positive number",
                                "recipe.epochs.dpo=0 must be a positive integer, or -1 (trainer.max_steps ends the stage)"]
