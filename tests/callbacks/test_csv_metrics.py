"""StageCSVLogger: every row on disk as it is logged (nothing waits for a flush a kill -9 would skip), the
file kept when a logger reopens it (a resume), and cut back to the rows a checkpoint had seen."""
from __future__ import annotations

import csv

from callbacks.csv_metrics import StageCSVLogger


def rows(path) -> list[dict]:
    with path.open(newline="") as f:
        return [{k: v for k, v in r.items() if v != ""} for r in csv.DictReader(f)]


def test_rows_reach_the_file_as_they_are_logged_and_a_reopened_logger_continues_from_a_checkpoints_count(tmp_path):
    logger = StageCSVLogger(tmp_path, name="csv", version="grpo")
    path = tmp_path / "csv" / "grpo" / "metrics.csv"
    logger.log_metrics({"train/loss": 1.5}, step=1)
    assert rows(path) == [{"train/loss": "1.5", "step": "1"}]  # no save()/finalize() called
    logger.log_metrics({"rollout/reward_mean": 0.25}, step=1)  # a new column: the file rewritten whole
    logger.log_metrics({"train/loss": 1.25}, step=2)
    assert logger.rows_written() == 3 and rows(path)[1] == {"rollout/reward_mean": "0.25", "step": "1"}
    assert not list(path.parent.glob(".*tmp"))

    resumed = StageCSVLogger(tmp_path, name="csv", version="grpo")  # a resume: the file is not deleted
    assert resumed.rows_written() == 3
    resumed.keep_rows(2)  # the checkpoint had seen two rows: the third came after it
    resumed.log_metrics({"train/loss": 1.0}, step=2)
    assert rows(path) == [{"train/loss": "1.5", "step": "1"}, {"rollout/reward_mean": "0.25", "step": "1"},
                          {"train/loss": "1.0", "step": "2"}]
    resumed.keep_rows(0)  # a stage restarted from its beginning
    assert not path.exists() and resumed.rows_written() == 0
