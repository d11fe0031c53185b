"""scripts/wandb_sweep.py: a W&B agent's --key=value arguments as Hydra overrides, read back by Hydra."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "wandb_sweep.py"
_spec = importlib.util.spec_from_file_location("wandb_sweep", SCRIPT)
wandb_sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wandb_sweep)
translate, build_command = wandb_sweep.translate, wandb_sweep.build_command
SweepArgumentError = wandb_sweep.SweepArgumentError


def hydra_reads(override: str):
    """(key, value) as Hydra's command-line parser reads the override (a sweep would fail the test)."""
    parsed = OverridesParser.create().parse_override(override)
    assert not parsed.is_sweep_override(), override
    return parsed.key_or_group, parsed.value()


@pytest.mark.parametrize("arg,override", [
    ("--algorithm.optimizer.lr=0.001", "algorithm.optimizer.lr=0.001"),
    ("--seed=2", "seed=2"),
    ("--algorithm.beta=1e-05", "algorithm.beta=1e-05"),         # Python's str of 0.00001
    ("--algorithm.group_size=8", "algorithm.group_size=8"),
    ("--model.activation_checkpointing=True", "model.activation_checkpointing=true"),
    ("--data.max_staleness=None", "data.max_staleness=null"),
    ("--algorithm=grpo", "algorithm=grpo"),                      # a config group choice
    ("--++data.max_examples=200", "++data.max_examples=200"),
    ("experiment=quickstart", "experiment=quickstart"),          # already a Hydra override: as it is
])
def test_plain_values(arg, override):
    assert translate([arg]) == [override]


@pytest.mark.parametrize("arg,key,value", [
    ("--task.train_path=my prompts.jsonl", "task.train_path", "my prompts.jsonl"),
    ("--task.train_path=/data/a b/[x].jsonl", "task.train_path", "/data/a b/[x].jsonl"),
    ("--run.note=a,b", "run.note", "a,b"),                       # a string, never a 2-value sweep
    ("--run.note=choice(1,2)", "run.note", "choice(1,2)"),
    ("--run.note=it's \"quoted\"", "run.note", "it's \"quoted\""),
    ("--run.note=back\\slash\\", "run.note", "back\\slash\\"),
    ("--run.note=a\\'b", "run.note", "a\\'b"),
    ("--run.note=x=y", "run.note", "x=y"),
    ("--run.note= padded ", "run.note", " padded "),
    ("--run.note=", "run.note", ""),
    ("--run.note=tag(x)", "run.note", "tag(x)"),
    ("--run.note=naïve", "run.note", "naïve"),
    ("--algorithm.group_size=[4, 8]", "algorithm.group_size", [4, 8]),       # W&B's str of a list
    ("--model.lora={'r': 8, 'target_modules': ['q_proj', 'v proj']}", "model.lora",
     {"r": 8, "target_modules": ["q_proj", "v proj"]}),                    # W&B's str of a dict
    ("--model.lora={r: 8}", "model.lora", {"r": 8}),                        # Hydra's own dict syntax
    ("--seed=${oc.env:SEED}", "seed", "${oc.env:SEED}"),
])
def test_values_with_spaces_brackets_and_quotes_reach_hydra_intact(arg, key, value):
    (override,) = translate([arg])
    assert hydra_reads(override) == (key, value)


def test_a_dict_for_a_config_group_spreads_into_dotted_keys():
    """W&B's nested parameters arrive as one dict per top-level name; a group takes dotted keys."""
    assert translate(["--algorithm={'beta': 0.1, 'optimizer': {'lr': 0.001}}"]) == [
        "algorithm.beta=0.1", "algorithm.optimizer.lr=0.001"]


@pytest.mark.parametrize("args,message", [
    (["--seed"], "has no value"),
    (["--resume"], "flags and .--key value. are not taken"),
    (["--seed", "2"], "'--key value' are not taken"),
    (["2"], "'2' is neither --key=value nor a Hydra override"),
    (["-seed=2"], "two dashes"),
    (["--=2"], "has no key"),
    (["--a b=1"], "is not a config key"),
    (["--seed!=1"], "is not a config key"),
    (["positional"], "neither --key=value"),
    (["--seed=1", "--seed=2"], "'seed' is given twice"),
    (["--algorithm.beta=0", "--algorithm={'beta': 0.1}"], "'algorithm.beta' is given twice"),
    (["--model.lora={'a b': 1}"], "cannot be written as a Hydra dict key"),
])
def test_unknown_forms_are_refused_with_a_clear_error(args, message):
    with pytest.raises(SweepArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        translate(args)


def test_the_command_runs_train_py_in_its_own_folder_and_online():
    env = {"WANDB_SWEEP_ID": "swp1", "WANDB_RUN_ID": "run7", "PATH": "/bin"}
    argv, child_env = build_command(["--seed=2", "--algorithm.beta=0.05"], env)
    assert argv[0] == sys.executable and Path(argv[1]) == ROOT / "train.py"
    assert argv[2:] == ["seed=2", "algorithm.beta=0.05", "hydra.run.dir=outputs/wandb/swp1/run7"]
    assert child_env["WANDB_MODE"] == "online" and child_env["WANDB_RUN_ID"] == "run7"
    assert "WANDB_MODE" not in env  # the caller's mapping is left alone

    argv, child_env = build_command(["--hydra.run.dir=/tmp/x", "--seed=1"], env | {"WANDB_MODE": "offline"})
    assert argv[2:] == ["hydra.run.dir=/tmp/x", "seed=1"] and child_env["WANDB_MODE"] == "offline"
    argv, _ = build_command(["--seed=1"], {})  # no agent (a manual trial run): Hydra's own folder
    assert argv[2:] == ["seed=1"]


def test_the_overrides_compose_into_the_stage_configs(hydra_conf):
    overrides = translate(["--algorithm.optimizer.lr=0.00031", "--algorithm.beta=0.05", "--seed=2",
                           "--algorithm.group_size=4", "experiment=single"])
    cfg = hydra_conf(overrides)
    assert cfg.algorithm.optimizer.lr == 0.00031 and cfg.algorithm.beta == 0.05
    assert cfg.seed == 2 and cfg.algorithm.group_size == 4


def test_the_example_sweep_names_this_program_and_keys_train_py_takes(hydra_conf):
    from omegaconf import OmegaConf

    sweep = yaml.safe_load((ROOT / "scripts" / "wandb_sweep.yaml").read_text())
    assert sweep["program"] == "scripts/wandb_sweep.py" and sweep["method"] == "bayes"
    assert sweep["metric"]["goal"] == "maximize" and sweep["metric"]["name"].endswith("val/accuracy")
    assert sweep["command"] == ["${env}", "${interpreter}", "${program}", "${args}"]
    values = {key: spec["value"] if "value" in spec else spec["values"][0] if "values" in spec else spec["min"]
              for key, spec in sweep["parameters"].items()}
    cfg = hydra_conf(translate([f"--{key}={value}" for key, value in values.items()]))  # as the agent passes them
    for key, value in values.items():
        assert OmegaConf.select(cfg, key) == value, key


def test_a_bad_argument_exits_2_with_one_line():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--seed"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("wandb_sweep.py: error: '--seed' has no value") and proc.stderr.count("\n") == 1
