"""Tabulate bench/ranks_equivalence.sh's sweep: held-out greedy accuracy after each stage, per seed and
mean, for 1 process (hardware=cpu) and 2 ranks (hardware=ddp); writes bench/results_ranks.md."""
from __future__ import annotations

import datetime
import json
import platform
import statistics
import sys
from pathlib import Path

import yaml


def rows(sweep: Path):
    for summary in sorted(sweep.glob("*/*/summary.json")):
        job = summary.parent
        overrides = dict(o.split("=", 1) for o in yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()))
        stages = json.loads(summary.read_text())
        for stage, metrics in stages.items():
            yield (job.parent.name, stage, overrides["hardware"], int(overrides["seed"]),
                   metrics.get("val/accuracy_after"), metrics.get("val/accuracy_before"), metrics.get("wall_seconds"))


def table_lines(sweep: Path) -> list[str]:
    """The Markdown table's lines: one row per experiment, stage and hardware."""
    found: dict = {}
    for exp, stage, hardware, seed, acc, before, wall in rows(sweep):
        found.setdefault((exp, stage), {}).setdefault(hardware, {})[seed] = (acc, acc - before, wall)
    lines = ["| experiment | stage | hardware | accuracy after, seeds 1-3 | mean | gain over the stage's start, per seed | mean gain | stage wall s (mean) |",
             "|---|---|---|---|---|---|---|---|"]
    for (exp, stage), by_hw in found.items():
        for hardware in ("cpu", "ddp"):
            seeds = by_hw.get(hardware, {})
            accs, gains, walls = ([seeds[s][i] for s in sorted(seeds)] for i in range(3))
            lines.append(f"| {exp} | {stage} | {hardware} | {', '.join(f'{a:.3f}' for a in accs)} | "
                         f"{statistics.mean(accs):.3f} | {', '.join(f'{g:+.3f}' for g in gains)} | "
                         f"{statistics.mean(gains):+.3f} | {statistics.mean(walls):.0f} |")
    return lines


def table(sweep: Path) -> str:
    head = (f"Ranks equivalence ({datetime.date.today()}, {platform.machine()}, {sweep}): 1 process "
            f"(hardware=cpu) against 2 ranks (hardware=ddp), seeds 1-3, held-out greedy accuracy on 500.\n\n")
    return head + "\n".join(table_lines(sweep)) + "\n"


if __name__ == "__main__":
    text = table(Path(sys.argv[1]))
    Path(sys.argv[2] if len(sys.argv) > 2 else "bench/results_ranks.md").write_text(text)
    print(text)
