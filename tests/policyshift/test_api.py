"""policyshift.train (the Python API for notebooks) runs train.py's job in process: the same config, the
same plan-time checks and messages (raised, not printed), the same stage loop and summary.json; a reward
function passed as an object; the `policyshift` console script is train.py's command line."""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import policyshift
from run.errors import ConfigError, format_error
from run.command_line import command_line_problem
from tests.helpers import TINY

ROOT = Path(__file__).resolve().parent.parent.parent
SFT = TINY + ["algorithm=sft", "trainer.max_steps=3", "++data.batch_size=8", "++data.max_examples=32", "logger=csv"]
GRPO = TINY + ["algorithm=grpo", "trainer.max_steps=2", "data.prompts_per_round=4", "data.batch_size=16",
               "algorithm.group_size=4", "generator.max_new_tokens=4"]


def test_train_runs_a_stage_and_returns_summary_json(tmp_path):
    out = tmp_path / "run"
    summary = policyshift.train(overrides=SFT, output_dir=out)
    assert list(summary) == ["sft"] and summary["sft"]["train/steps"] == 3
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary))
    assert (out / "policy" / "config.json").is_file() and (out / "policy" / "README.md").is_file()
    assert (out / "config.yaml").is_file() and (out / "csv" / "sft" / "metrics.csv").is_file()
    recorded = (out / ".hydra" / "overrides.yaml").read_text()
    assert "algorithm=sft" in recorded and "trainer.max_steps=3" in recorded  # resumable by train.py
    assert "=== stage sft" in (out / "train.log").read_text()


def test_a_bad_override_raises_the_message_train_py_prints(tmp_path):
    bad = ["algorithm=sftt"]
    with pytest.raises(ConfigError) as info:
        policyshift.train(overrides=bad, output_dir=tmp_path / "run")
    assert str(info.value) == command_line_problem(bad)  # what train.py prints after "error: "
    assert "there is no algorithm=sftt" in str(info.value) and "did you mean algorithm=sft" in str(info.value)
    with pytest.raises(ConfigError, match=r"invalid config for stage 'sft'") as info:
        policyshift.train(overrides=SFT + ["trainer.max_steps=0"], output_dir=tmp_path / "run")
    assert "trainer.max_steps=0" in format_error(info.value)
    assert not (tmp_path / "run").exists()  # refused before anything is written, as train.py does


def test_the_messages_are_train_pys_own(tmp_path):
    """The same bad overrides through `python train.py`: its stderr is `error: ` + the API's message."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    for bad in (["algorithm=sftt"], SFT + ["trainer.max_steps=0"]):
        with pytest.raises(ConfigError) as info:
            policyshift.train(overrides=bad, output_dir=tmp_path / "api")
        proc = subprocess.run([sys.executable, "train.py", *bad, f"hydra.run.dir={tmp_path / 'cli'}"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and format_error(info.value) in proc.stderr, (proc.stderr, info.value)


def test_sweeps_and_hydra_settings_are_the_command_lines(tmp_path):
    with pytest.raises(ConfigError, match="a sweep runs from the command line"):
        policyshift.train(overrides=["seed=1,2"], output_dir=tmp_path)
    with pytest.raises(ConfigError, match="output_dir="):
        policyshift.train(overrides=[f"hydra.run.dir={tmp_path}"])


def test_print_config_plans_and_writes_nothing(tmp_path, capsys):
    assert policyshift.train(overrides=["print_config=true", "algorithm=sft"], output_dir=tmp_path / "run") == {}
    assert "# ===== stage 1/1: sft" in capsys.readouterr().out and not (tmp_path / "run").exists()


CALLS: list[int] = []


def test_a_reward_function_object_scores_the_rollouts(tmp_path):
    """reward_fn= goes where reward=function's `reward.fn` goes; its scores are the rollouts' rewards."""
    CALLS.clear()

    def always_point_seven(prompts, completions, examples):  # a closure: no import path reaches it
        CALLS.append(len(completions))
        return [0.7] * len(completions)

    out = tmp_path / "run"
    summary = policyshift.train(overrides=GRPO, output_dir=out, reward_fn=always_point_seven)
    assert CALLS and sum(CALLS) >= 2 * 4 * 4  # two rounds of 4 prompts × 4 samples
    assert summary["grpo"]["rollout/reward_mean"] == pytest.approx(0.7)
    config = (out / "config.yaml").read_text()
    assert "rewards.in_process.always_point_seven" in config and "rewards.verifier.FunctionReward" in config


def test_reward_fn_refuses_another_reward_group(tmp_path):
    with pytest.raises(ConfigError, match="reward=verifier"):
        policyshift.train(overrides=["reward=verifier"], output_dir=tmp_path, reward_fn=lambda p, c, e: [])
    with pytest.raises(ConfigError, match="several ranks"):
        policyshift.train(overrides=["hardware=ddp", "trainer.devices=2"], output_dir=tmp_path,
                          reward_fn=lambda p, c, e: [])


def test_the_console_script_is_train_pys_command_line(capsys):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entry = importlib.metadata.EntryPoint(name="policyshift", value=scripts["policyshift"], group="console_scripts")
    main = entry.load()
    assert main is policyshift.main
    argv = sys.argv
    sys.argv = ["policyshift", "--help"]
    try:
        with pytest.raises(SystemExit) as info:
            main()
    finally:
        sys.argv = argv
    assert info.value.code in (0, None)
    assert "policyshift: LLM post-training" in capsys.readouterr().out
