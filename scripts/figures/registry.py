"""A figure: a name, the commands that measure it, and how their outputs become a Markdown table.

`commands(out, smoke)` gives argv lists run in the repository root, in order, writing under `out`
(smoke: shrunk steps and seeds, for tests); `render(out, smoke)` reads what they wrote and returns the
Markdown that docs/results/<name>.md and the README show (tables and their footnotes) and the notes
that go to the results file only. Figure modules register themselves with `register`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml


@dataclass(frozen=True)
class Rendered:
    table: str   # the README's part: one or more Markdown tables (+ footnotes)
    notes: str = ""  # the results file's `## Notes`: reading guides, per-run details


@dataclass(frozen=True)
class Figure:
    name: str
    title: str
    duration: str  # how long the full measurement takes, as a reader plans it
    commands: Callable[[Path, bool], list[list[str]]]
    render: Callable[[Path, bool], Rendered]


FIGURES: dict[str, Figure] = {}  # measured: each has its docs/results/<name>.md (a test checks)
PENDING: dict[str, Figure] = {}  # built but not yet measured in full: `--only NAME` runs them, nothing else does


def register(figure: Figure, pending: bool = False) -> Figure:
    """A figure; `pending` until its first full measurement has written docs/results/<name>.md (then
    drop the flag in the same commit)."""
    (PENDING if pending else FIGURES)[figure.name] = figure
    return figure


# ------------------------------------------------------------------ reading a multirun's job dirs


@dataclass(frozen=True)
class Job:
    path: Path
    overrides: dict[str, str]   # the job's command-line overrides, key → value (`+`/`++` stripped)
    stages: dict[str, dict]     # summary.json: {stage: final metrics}

    @property
    def seed(self) -> int:
        return int(self.overrides.get("seed", 1))


def jobs(sweep: Path) -> list[Job]:
    """Every job under `sweep` (any depth) with a summary.json and a .hydra/overrides.yaml."""
    found = []
    for summary in sorted(sweep.rglob("summary.json")):
        listed = summary.parent / ".hydra" / "overrides.yaml"
        if listed.is_file():
            pairs = (o.split("=", 1) for o in yaml.safe_load(listed.read_text()) or [] if "=" in o)
            found.append(Job(summary.parent, {k.lstrip("+~"): v for k, v in pairs},
                             json.loads(summary.read_text())))
    return found


def pts(x: float | None) -> str:
    """An accuracy difference in percentage points: +6.8."""
    return "–" if x is None else f"{x * 100:+.1f}"
