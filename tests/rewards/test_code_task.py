"""task=code: the shipped function tasks load with their tests; malformed files fail naming file:line."""
from __future__ import annotations

import json

import pytest
from hydra.utils import instantiate

from tasks.code import code_task
from tasks.jsonl import DataFileError


def test_shipped_set_loads_through_the_config(hydra_conf):
    task = instantiate(hydra_conf(["task=code"]).task)
    names = [e.meta["entry_point"] for e in task.train + task.heldout]
    assert len(task.train) == 23 and len(task.heldout) == 3 and len(set(names)) == 26
    assert {"longest_increasing_subsequence", "two_sum", "reverse_string"} <= set(names)
    for ex in task.train + task.heldout:
        assert f"def {ex.meta['entry_point']}(" in ex.answer and ex.meta["entry_point"] in ex.prompt
        assert len(ex.meta["tests"]) >= 4 and ex.meta["origin"].startswith("code_tasks.jsonl:")


ONE_TEST = [{"args": [], "expected": 1}]


@pytest.mark.parametrize("fields,match", [
    ({"tests": ONE_TEST}, r"x.jsonl:2: 'entry_point'"),
    ({"entry_point": "f", "tests": []}, r"x.jsonl:2: 'tests'"),
    ({"entry_point": "f", "tests": [{"args": 1, "expected": 1}]}, r"x.jsonl:2: tests\[0\]"),
    ({"entry_point": "not valid", "tests": ONE_TEST}, "identifier"),
])
def test_malformed_rows_name_file_and_line(tmp_path, fields, match):
    row = {"prompt": "p", "answer": "a"} | fields
    good = {"prompt": "p", "answer": "a", "entry_point": "f", "tests": [{"args": [], "expected": 1}]}
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n" + json.dumps(good) + "\n")
    with pytest.raises(DataFileError, match=match):
        code_task(str(path), num_heldout=1)


def test_num_heldout_must_leave_both_splits(tmp_path):
    with pytest.raises(DataFileError, match="task.num_heldout=0"):
        code_task(None, num_heldout=0)
    with pytest.raises(DataFileError, match="task.num_heldout=26"):
        code_task(None, num_heldout=26)
