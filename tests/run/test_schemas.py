"""The config schemas (run/validation/schemas/): every shipped choice passes them, a bad value or an
unknown key in a closed node is one line naming the key, an open node (a user's `_target_`) passes its
extra keys on, and a value written as an interpolation is reported once, where it is written."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import open_dict

from run.validation.schemas import GROUPS, check_schemas

CONF = Path(__file__).resolve().parent.parent.parent / "conf"
CHOICES = [(group, p.stem) for group in ("model", "data", "algorithm", "correction", "generator", "reward", "task",
                                         "hardware", "scheduler") for p in sorted((CONF / group).glob("*.yaml"))]
NEEDS = {("data", "checkpoint_preferences"): ["data.synthetic.checkpoint=/x"], ("model", "hf"): ["model.name_or_path=/x"]}


def errors_of(cfg) -> list[str]:
    errors: list[str] = []
    check_schemas(cfg, errors)
    return errors


@pytest.mark.parametrize("group,choice", CHOICES, ids=[f"{g}={c}" for g, c in CHOICES])
def test_every_shipped_choice_passes_its_schema(hydra_conf, group, choice):
    algorithm = {"data": {"static_preferences": "dpo", "checkpoint_preferences": "dpo", "demonstrations": "sft",
                          "filtered_rollouts": "online_dpo"}}.get(group, {}).get(choice, "grpo")
    cfg = hydra_conf([f"{group}={choice}", f"algorithm={algorithm}", "experiment=single"]
                     + NEEDS.get((group, choice), []))
    assert errors_of(cfg) == []


def test_every_group_has_a_schema_for_each_of_its_project_targets():
    assert [key for key, _, _ in GROUPS] == ["model", "data", "algorithm", "correction", "generator", "reward",
                                              "task", "trainer", "env"]
    from run.validation.schemas import data, model
    assert set(model.SCHEMAS) == {"models.tiny.build_tiny", "models.hf.load_hf"}
    assert "data_modules.replay_mix.ReplayMixDataModule" in data.SCHEMAS


def test_a_bad_value_is_one_line_naming_the_key(hydra_conf):
    cfg = hydra_conf(["model.num_layers=0", "generator.top_p=2", "data.buffer_capacity=-1", "seed=-3"])
    assert errors_of(cfg) == ["model.num_layers=0 must be a positive integer",
                              "data.buffer_capacity=-1 must be a positive integer",
                              "generator.top_p=2 must be in (0, 1]",
                              "seed=-3 must be an integer in [0, 2**32)"]


def test_strict_types_a_float_count_a_bool_number_a_word_for_a_mapping(hydra_conf):
    cfg = hydra_conf(["trainer.max_steps=2.0", "algorithm.optimizer.lr=true", "model.lora=yes"])
    found = errors_of(cfg)
    assert "trainer.max_steps=2.0 must be a positive integer" in found
    assert "algorithm.optimizer.lr=True must be a positive number" in found
    assert any(line.startswith("model.lora='yes' must be null (no adapter)") for line in found)


def test_an_unknown_key_in_a_closed_node_is_refused_with_the_nearest(hydra_conf):
    cfg = hydra_conf([])
    with open_dict(cfg):
        cfg.model.hidden_sise = 16
    [line] = [e for e in errors_of(cfg) if "hidden_sise" in e]
    assert line.startswith("model.hidden_sise: models.tiny.build_tiny has no key `hidden_sise`")
    assert line.endswith("did you mean `model.hidden_size`?")


def test_an_open_node_passes_a_users_keys_on_and_still_types_the_shared_ones(hydra_conf):
    cfg = hydra_conf(["+algorithm.optimizer.amsgrad=true"])
    with open_dict(cfg):
        cfg.model._target_ = "my_models.build"  # a user's factory: any key
        cfg.model.depth = 3
    assert errors_of(cfg) == []
    with open_dict(cfg):
        cfg.model.dtype = "float8"
    assert errors_of(cfg) == ["model.dtype='float8' must be one of float32, bfloat16, float16"]


def test_an_interpolated_value_is_reported_once_where_it_is_written(hydra_conf):
    """scheduler=linear's num_training_steps is ${trainer.max_steps}: one line, for trainer.max_steps."""
    cfg = hydra_conf(["algorithm=sft", "experiment=single", "trainer.max_steps=0"])
    assert cfg.algorithm.scheduler.num_training_steps == 0
    assert errors_of(cfg) == ["trainer.max_steps=0 must be a positive integer"]


def test_lightnings_own_choices(hydra_conf):
    found = errors_of(hydra_conf(["trainer.precision=banana", "trainer.strategy=dpp", "trainer.accelerator=gpuu"]))
    assert [line.split(" must be ")[0] for line in found] == ["trainer.accelerator='gpuu'", "trainer.strategy='dpp'",
                                                             "trainer.precision='banana'"]
    assert "bf16-mixed" in found[2] and "ddp" in found[1]
    assert errors_of(hydra_conf(["trainer.precision=16", "trainer.strategy=ddp_spawn"])) == []


def test_a_tokenizer_without_eos_is_refused_unless_only_rollouts_and_the_model_states_one(hydra_conf, tmp_path):
    """Rollouts stop at generation_config.json's eos too (generators/base.py); demonstrations end with the
    tokenizer's own, so an SFT stage needs it."""
    import json

    from run.errors import ConfigError
    from run.stages import plan_stages
    from tests.bad_inputs.schemas import no_eos
    from tests.bad_inputs.setups import model_folder
    model_folder("m", no_eos)(tmp_path)
    assert json.loads((tmp_path / "m" / "generation_config.json").read_text())["eos_token_id"] is not None
    hf = ["model=hf", f"model.name_or_path={tmp_path / 'm'}", "logger=none",
          "generator.max_new_tokens=8"]  # a 64-token context: not recipe=pretrained's 256 new tokens
    [stage] = plan_stages(hydra_conf(hf + ["algorithm=grpo"]), hf + ["algorithm=grpo"])
    assert stage.name == "grpo"
    with pytest.raises(ConfigError, match="has no eos token"):
        plan_stages(hydra_conf(hf + ["algorithm=sft"]), hf + ["algorithm=sft"])
