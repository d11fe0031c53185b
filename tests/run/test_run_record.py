"""The run folder's record and its rules (run/run_record.py), in-process: which folders a run may
start in, what `resume=true` takes from the record, and what it refuses."""
from __future__ import annotations

import json

import pytest
import yaml

from run.run_record import (effective_overrides, merge_overrides, plan_run, read_record,
                            write_record)
from run.errors import ConfigError

STARTED = ["trainer.max_steps=4", "logger=csv", "++data.max_examples=50"]


def started_run(out, overrides=STARTED, stages=None):
    """A folder as a run leaves it once it has started: .hydra/, run.json, config.yaml."""
    plan = plan_run(out, overrides, resume=False, allow_changes=False)
    write_record(out, plan, None, None, overrides)
    stages = stages or {"sft": {"seed": 1, "trainer": {"max_steps": 3000}},
                        "grpo": {"seed": 1, "trainer": {"max_steps": 600}}}
    (out / "config.yaml").write_text(yaml.safe_dump(stages, sort_keys=False))
    return plan


def test_merge_keeps_the_record_and_reports_each_changed_value():
    merged, changes = merge_overrides(STARTED, ["resume=true", "logger=csv", "trainer.max_steps=6", "seed=3"])
    assert merged == ["trainer.max_steps=6", "logger=csv", "++data.max_examples=50", "seed=3", "resume=true"]
    assert changes == [{"key": "trainer.max_steps", "was": "trainer.max_steps=4", "now": "trainer.max_steps=6"},
                       {"key": "seed", "was": None, "now": "seed=3"}]
    assert merge_overrides(STARTED, ["++trainer.max_steps=4", "resume=true"])[1] == []  # same value, other form


@pytest.mark.parametrize("marker", ["summary.json", "run.json", "config.yaml", ".hydra", "checkpoints"])
def test_a_folder_holding_a_run_is_refused_without_resume(tmp_path, marker):
    path = tmp_path / marker
    path.mkdir() if "." not in marker or marker == ".hydra" else path.write_text("x")
    with pytest.raises(ConfigError, match=rf"{tmp_path} already holds a run \({marker}\).*resume=true"):
        plan_run(tmp_path, [], resume=False, allow_changes=False)


@pytest.mark.parametrize("state", ["missing", "empty", "hydra_log_only"])
def test_resume_of_a_folder_without_a_run_is_refused_naming_it(tmp_path, state):
    out = tmp_path / "run"
    if state != "missing":
        out.mkdir()
    if state == "hydra_log_only":  # what Hydra itself leaves in a new folder
        (out / "train.log").write_text("")
    with pytest.raises(ConfigError, match=rf"resume=true but {out} .*nothing was trained"):
        plan_run(out, ["resume=true"], resume=True, allow_changes=False)


def test_resume_takes_the_recorded_overrides(tmp_path):
    first = started_run(tmp_path)
    plan = plan_run(tmp_path, ["resume=true"], resume=True, allow_changes=False)
    assert plan.overrides == STARTED + ["resume=true"] and plan.resume == 1 and plan.changes == []
    assert plan.wandb_id == first.wandb_id and len(plan.wandb_id) == 8


def test_resume_refuses_a_changed_value_naming_the_key_and_both_values(tmp_path):
    started_run(tmp_path)
    with pytest.raises(ConfigError) as e:
        plan_run(tmp_path, ["resume=true", "trainer.max_steps=6", "seed=3"], resume=True, allow_changes=False)
    message = str(e.value)
    assert "trainer.max_steps: the run has trainer.max_steps=4, this command line says trainer.max_steps=6" in message
    assert "seed: the run has its default (sft=1, grpo=1), this command line says seed=3" in message
    assert "resume_allow_changes=true" in message


def test_an_allowed_change_is_recorded_beside_the_original(tmp_path):
    started_run(tmp_path)
    original = (tmp_path / ".hydra" / "overrides.yaml").read_bytes()
    line = ["resume=true", "resume_allow_changes=true", "trainer.max_steps=6"]
    plan = plan_run(tmp_path, line, resume=True, allow_changes=True)
    write_record(tmp_path, plan, None, None, line)
    assert (tmp_path / ".hydra" / "overrides.yaml").read_bytes() == original
    [resume] = read_record(tmp_path)["resumes"]
    assert resume["overrides"] == line and resume["changes"][0]["now"] == "trainer.max_steps=6"
    # the next resume continues with the changed value, and needs no flag for it
    assert effective_overrides(tmp_path, read_record(tmp_path))[0] == "trainer.max_steps=6"
    again = plan_run(tmp_path, ["resume=true"], resume=True, allow_changes=False)
    assert again.resume == 2 and "trainer.max_steps=6" in again.overrides and again.changes == []


def test_a_new_run_writes_the_hydra_record(tmp_path):
    plan = started_run(tmp_path)
    assert yaml.safe_load((tmp_path / ".hydra" / "overrides.yaml").read_text()) == STARTED
    assert json.loads((tmp_path / "run.json").read_text())["wandb_id"] == plan.wandb_id


def test_train_refuses_resume_into_an_empty_folder_and_writes_nothing(hydra_conf, tmp_path):
    import train as train_py
    with pytest.raises(ConfigError, match=str(tmp_path)):
        train_py.train(hydra_conf(["resume=true"]), ["resume=true"], tmp_path, "group", "name")
    assert list(tmp_path.iterdir()) == []


def test_an_interpolation_on_the_command_line_is_recorded_and_compared_as_typed(tmp_path):
    started_run(tmp_path, ["callbacks.evaluate.verifier=${reward}"])
    plan = plan_run(tmp_path, ["resume=true", "callbacks.evaluate.verifier=${reward}"], resume=True,
                    allow_changes=False)
    assert plan.overrides == ["callbacks.evaluate.verifier=${reward}", "resume=true"] and plan.changes == []
