"""StageCSVLogger (logger=csv): one `csv/<stage>/metrics.csv` per stage that survives a kill and a resume.

Lightning's CSVLogger keeps rows in memory (written every 100 steps: a `kill -9` loses them) and deletes
the file when a new logger opens its folder (a resume lost the killed part). Here every row reaches the
file as it is logged (a header change rewrites the file through a temporary file and a rename: a kill
never leaves half a file), the file is never deleted on opening, and the stage's checkpoints carry the
number of rows written so far (run/checkpointing.py `ResumeState`): a resumed stage cuts the file back
to the rows its checkpoint had seen and appends from there, so a run killed at any point and resumed
leaves the file an uninterrupted run writes. A stage started from its beginning starts the file empty.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities.rank_zero import rank_zero_only


class RowWriter(ExperimentWriter):
    """Appends each row to metrics.csv as it comes; knows how many rows the file holds."""

    def __init__(self, log_dir: str):
        super().__init__(log_dir)
        self.path = Path(self.metrics_file_path)
        self.rows = 0
        if self.path.is_file():  # a resumed stage's file: its header and rows as they are
            with self.path.open(newline="") as f:
                reader = csv.reader(f)
                self.metrics_keys = list(next(reader, []))
                self.rows = sum(1 for _ in reader)

    def _check_log_dir_exists(self) -> None:  # Lightning's deletes the file: a resume keeps it
        pass

    def save(self) -> None:
        if not self.metrics:
            return
        if self._record_new_keys() and self.path.is_file():
            self._rewrite(self._read())
        with self.path.open("a" if self.path.is_file() else "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.metrics_keys)
            if f.tell() == 0:
                writer.writeheader()
            writer.writerows(self.metrics)
        self.rows += len(self.metrics)
        self.metrics = []

    def keep(self, rows: int) -> None:
        """Cut the file back to its header and first `rows` rows (0: no file)."""
        self.metrics = []
        if rows <= 0:
            self.path.unlink(missing_ok=True)
            self.metrics_keys, self.rows = [], 0
            return
        kept = self._read()[:rows]
        self._rewrite(kept)
        self.rows = len(kept)

    def _read(self) -> list[dict]:
        with self.path.open(newline="") as f:
            return list(csv.DictReader(f))

    def _rewrite(self, rows: list[dict]) -> None:
        """Header and `rows` to a temporary file, renamed into place (a kill keeps the old file)."""
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=self.metrics_keys, restval="")
            writer.writeheader()
            writer.writerows({k: v for k, v in row.items() if k in self.metrics_keys} for row in rows)
        os.replace(tmp, self.path)


class StageCSVLogger(CSVLogger):
    def __init__(self, save_dir: str, name: str, version: str):
        super().__init__(save_dir, name=name, version=version)

    @property
    @rank_zero_experiment
    def experiment(self) -> RowWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = RowWriter(log_dir=self.log_dir)
        return self._experiment

    @rank_zero_only
    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        super().log_metrics(metrics, step)
        self.experiment.save()  # every row on disk as it comes (a kill -9 loses none)

    def rows_written(self) -> int | None:
        """Rows in metrics.csv so far (rank 0; None elsewhere): what a checkpoint records."""
        if rank_zero_only.rank != 0:
            return None
        self.experiment.save()
        return self.experiment.rows

    @rank_zero_only
    def keep_rows(self, rows: int) -> None:
        """A resumed stage: the first `rows` rows stay (those its checkpoint had seen), the rest go."""
        self.experiment.keep(rows)
