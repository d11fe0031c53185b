"""summary.json (final metrics keyed by stage name) and the end-of-run table."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table

from hardware.console import to_log_file


class RunSummary:
    """Accumulates one dict of metrics per stage; rewrites summary.json atomically after each stage,
    so a run killed in stage k keeps the summaries of stages before k."""

    def __init__(self, path: Path, write: bool = True):
        self.path, self.write = path, write  # write: False on ranks > 0 (rank 0 writes the file)
        self.stages: dict[str, dict] = {}

    def add(self, stage: str, metrics: dict) -> None:
        self.stages[stage] = metrics
        if not self.write:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")  # per process
        tmp.write_text(json.dumps(self.stages, indent=2, default=float))
        os.replace(tmp, self.path)

    def table(self) -> Table:
        keys = ["val/accuracy_before", "val/accuracy_after", "val/loss_before", "val/loss_after",
                "val/pref_accuracy_before",
                "val/pref_accuracy_after", "rollout/reward_mean_first",
                "rollout/reward_mean", "rollout/replay_frac_mean", "cost/generated_tokens", "cost/usd",
                "cost/accuracy_gain_per_mtok", "train/steps", "wall_seconds"]
        shown = [k for k in keys if any(m.get(k) is not None for m in self.stages.values())]  # no empty rows
        table = Table(title="policyshift run summary")
        table.add_column("metric")
        for name in self.stages:
            table.add_column(name, justify="right")
        for k in shown:
            table.add_row(k + ("*" if k == "cost/usd" else ""), *[_fmt(m.get(k)) for m in self.stages.values()])
        return table

    def footnote(self) -> str | None:
        """The line under the table when it shows dollars: what they are."""
        if not any(m.get("cost/usd") is not None for m in self.stages.values()):
            return None
        return ("* cost/usd: an estimate at the configured prices (cost.usd_per_mtok_generated, "
                "cost.usd_per_mtok_trained), not a bill")

    def print(self) -> None:
        for console in (Console(), Console(width=120, record=True, file=io.StringIO(), color_system=None)):
            console.print(self.table())
            if self.footnote():
                console.print(self.footnote(), highlight=False, soft_wrap=True)
        to_log_file(console.export_text())


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)
