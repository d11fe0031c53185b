"""Asynchronous rounds through `python train.py` (docs/scaling.md): GRPO with
callbacks.regenerate.max_staleness=1 trains every round after the first one version behind, logs its
ledger, and leaves no engine process; a bad value is refused before anything runs, in one line; a run killed
with -9 while a round is in the engine resumes to the uninterrupted run's summary, each round counted once."""
from __future__ import annotations

import csv
import json
import signal
from pathlib import Path

import psutil
import pytest
import torch

from tests.helpers import TINY_MODEL
from tests.test_resume import start_train, wait_for
from tests.test_resume_exact import comparable
from tests.test_train_e2e import SMALL, train

ASYNC = ["algorithm=grpo", "correction=decoupled_ppo", "callbacks.regenerate.max_staleness=1", "logger=csv",
         "callbacks.regenerate.engine_startup=wait"]  # the schedule fixed by the seed, whatever the machine's load


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


KILL_ARGS = [*TINY_MODEL, "task.num_heldout=20", "callbacks.evaluate.num_examples=20", "callbacks.progress.refresh_rate=0",
             "generator.max_new_tokens=6", "checkpoint_every_n_rounds=1", "seed=3",
             "trainer.max_steps=6", "data.prompts_per_round=4", "data.batch_size=32", *ASYNC]


def round_tokens(out: Path) -> list[float]:
    """Generated tokens of each round, from its row of metrics.csv (mean response length × records)."""
    with (out / "csv" / "grpo" / "metrics.csv").open(newline="") as f:
        return [float(r["rollout/response_len_mean"]) * 32 for r in csv.DictReader(f) if r.get("rollout/response_len_mean")]


@pytest.mark.slow  # three train.py runs (~60 s on an idle 2-core machine)
def test_kill_9_during_an_asynchronous_run_and_resume_counts_every_round_once(tmp_path):
    """max_staleness=1, one step a round, a checkpoint every round: kill -9 the trainer once round 3's
    checkpoint is written (round 4 made, round 5 in the engine). The orphaned engine exits by itself;
    `resume=true` hands the round in flight's planned prompts to a new engine, which generates it again (same seed, same weights version): the ledger counts each of the 6 rounds
    once (records 6 × 32; generated tokens = the rounds' rows summed), and the summary equals the
    uninterrupted run's, timings aside (the schedule is deterministic: the engine samples with the round's
    seed and the weights it was handed)."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    done = train(*KILL_ARGS, f"hydra.run.dir={whole}", timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    proc = start_train(*KILL_ARGS, f"hydra.run.dir={killed}")
    wait_for(killed / "checkpoints" / "grpo" / "epoch=2-step=3.ckpt", proc, timeout=600)  # round 5 in flight
    engines = [c for c in psutil.Process(proc.pid).children(recursive=True) if "python" in c.name().lower()]
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL and engines
    gone, alive = psutil.wait_procs(engines, timeout=120)  # the engine polls its parent every POLL_S
    assert not alive, f"engine processes outlived the killed trainer: {[p.pid for p in alive]}"
    state = torch.load(killed / "checkpoints" / "grpo" / "last.ckpt", weights_only=True, map_location="cpu")
    regenerate = next(v for k, v in state["callbacks"].items() if "Regenerate" in k)
    assert regenerate["pending_prompts"] is not None  # the round in flight: planned, not counted
    assert regenerate["totals"]["records_generated"] == regenerate["rounds"] * 32

    resumed = train("resume=true", f"hydra.run.dir={killed}", timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((killed / "summary.json").read_text())["grpo"]
    assert summary["rollout/rounds"] == 6 and summary["cost/records_generated"] == 6 * 32
    tokens = round_tokens(killed)
    assert len(tokens) == 6 and summary["cost/generated_tokens"] == pytest.approx(sum(tokens))
    a = comparable(json.loads((whole / "summary.json").read_text()))["grpo"]
    b = comparable(json.loads((killed / "summary.json").read_text()))["grpo"]
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and k != "cost/weight_sync_bytes")
    assert not differ, [(k, a.get(k), b.get(k)) for k in differ]
