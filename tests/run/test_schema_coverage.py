"""Every node a run reads has a schema, and every key of every config file in conf/ is one a schema names
(run/validation/schemas/coverage.py): a key or node added without a schema fails here, so the class of
"silent nonsense in a node nothing checks" stays closed. Each config file is composed as a run would
compose it (its group choice over the defaults) and must pass its schemas too."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import open_dict

from run.validation.schemas import check_schemas
from run.validation.schemas.coverage import uncovered

CONF = Path(__file__).resolve().parent.parent.parent / "conf"
GROUPS = ("model", "data", "algorithm", "correction", "generator", "reward", "task", "hardware", "scheduler", "env",
          "logger", "recipe", "callbacks", "experiment")
ALGORITHM = {"static_preferences": "dpo", "checkpoint_preferences": "dpo", "demonstrations": "sft",
             "filtered_rollouts": "online_dpo", "conversations": "sft", "episode_demonstrations": "sft"}
NEEDS = {("data", "checkpoint_preferences"): ["data.synthetic.checkpoint=/x"], ("model", "hf"): ["model.name_or_path=/x"]}
FILES = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]


def overrides(group: str, choice: str) -> list[str]:
    extra = [] if group in ("algorithm", "experiment") else [f"algorithm={ALGORITHM.get(choice, 'grpo') if group == 'data' else 'grpo'}",
                                                            "experiment=single"]
    return [f"{group}={choice}", *extra, *NEEDS.get((group, choice), [])]


def test_every_config_group_is_walked():
    walked = {g for g, _ in FILES}
    groups = {p.name for p in CONF.iterdir() if p.is_dir()} - {"hydra", "hparams_search"}  # Hydra's own nodes
    assert groups == walked


@pytest.mark.parametrize("group,choice", FILES, ids=[f"{g}={c}" for g, c in FILES])
def test_every_key_of_every_config_file_has_a_schema(hydra_conf, group, choice):
    cfg = hydra_conf(overrides(group, choice))
    assert uncovered(cfg) == []
    errors: list[str] = []
    check_schemas(cfg, errors)
    assert errors == []


def test_a_key_or_node_without_a_schema_is_found(hydra_conf):
    cfg = hydra_conf(["env=calculator", "algorithm=grpo", "experiment=single"])
    with open_dict(cfg):
        cfg.callbacks.evaluate.every_n_stepz = 3          # an open node's key no schema names
        cfg.env.tools.calculator.precision = 2           # a tool's key
        cfg.env.tools.abacus = {"_target_": "my.abacus", "_partial_": True}  # a user's tool: open, its keys its own
        cfg.brand_new = {"size": 1}                      # a top-level node
    assert uncovered(cfg) == ["brand_new", "callbacks.evaluate.every_n_stepz", "env.tools.calculator.precision"]
