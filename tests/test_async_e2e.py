"""Asynchronous rounds through `python train.py` (docs/scaling.md): GRPO with
callbacks.regenerate.max_staleness=1 trains every round after the first one version behind, logs its
ledger, and leaves no engine process; a bad value is refused before anything runs, in one line."""
from __future__ import annotations

import csv
import json

from tests.test_train_e2e import SMALL, train

ASYNC = ["algorithm=grpo", "correction=decoupled_ppo", "callbacks.regenerate.max_staleness=1", "logger=csv"]


def test_grpo_with_staleness_one_end_to_end(tmp_path):
    out = tmp_path / "run"
    proc = train(*SMALL, *ASYNC, f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())["grpo"]
    assert summary["rollout/rounds"] == 4 and summary["train/steps"] == 4  # 1 step a round
    assert summary["cost/weight_sync_bytes"] > 0 and summary["rollout/async_dropped_rounds"] == 0
    for key in ("cost/trainer_idle_seconds", "cost/engine_idle_seconds", "cost/weight_sync_seconds"):
        assert summary[key] >= 0, key
    rows = list(csv.DictReader((out / "csv" / "grpo" / "metrics.csv").open()))
    hist = {int(float(r["step"])): float(r["train/staleness_hist/1"]) for r in rows if r.get("train/staleness_hist/1")}
    assert hist == {0: 0.0, 1: 1.0, 2: 1.0, 3: 1.0}  # round 1 made here; then one version behind
    rounds = [r for r in rows if r.get("rollout/async_staleness")]
    assert [float(r["rollout/async_staleness"]) for r in rounds] == [1.0, 1.0, 1.0]
    for key in ("perf/trainer_idle_seconds", "perf/engine_idle_seconds", "perf/engine_tokens_per_sec",
                "perf/weight_sync_seconds", "perf/weight_sync_bytes"):
        assert all(r.get(key) for r in rounds), key


def test_a_negative_staleness_is_refused_in_one_line(tmp_path):
    proc = train(*SMALL, *ASYNC[:2], "callbacks.regenerate.max_staleness=-1", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 1
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "callbacks.regenerate.max_staleness" in lines[0], proc.stderr[-2000:]
    assert not (tmp_path / "run" / "summary.json").exists()
