"""`python train.py algorithm=dpo data.path=FILE`: a single-algorithm run uses the algorithm's own data source
(`default_data`), so that data's keys apply without `++` (run/command_line.with_default_data)."""
from __future__ import annotations

import json

import yaml

from run.command_line import with_default_data
from tests.test_bad_inputs import train


def test_the_algorithms_own_data_is_added_only_when_nothing_else_picks_the_data():
    assert with_default_data(["algorithm=dpo", "data.path=x"]) == ["algorithm=dpo", "data.path=x",
                                                                  "data=static_preferences"]
    assert with_default_data(["algorithm=dr_grpo"]) == ["algorithm=dr_grpo", "data=fresh_rollouts"]  # via grpo
    assert with_default_data(["algorithm=sft", "seed=2"])[-1] == "data=demonstrations"
    for unchanged in (["algorithm=dpo", "data=preferences"], ["algorithm=dpo", "experiment=single"],
                      ["-m", "algorithm=dpo,kto"], ["algorithm=nosuch"], ["seed=3"], ["data.path=x"]):
        assert with_default_data(unchanged) == unchanged


def test_a_dpo_file_without_the_data_group_plans_on_static_preferences(tmp_path):
    path = tmp_path / "prefs.jsonl"
    rows = [{"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2)} for i in range(40)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = train("algorithm=dpo", f"data.path={path}", "data.num_heldout=10", "print_config=true",
                 f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr  # before: "data=fresh_rollouts has no `path` ... write ++data.path"
    stage = yaml.safe_load(proc.stdout)["dpo"]
    assert stage["data"]["_target_"] == "data_modules.static_preferences.StaticPreferencesDataModule"
    assert stage["data"]["path"] == str(path)
