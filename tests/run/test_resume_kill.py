"""A stage killed with SIGKILL at any point and resumed leaves what an uninterrupted run leaves: the same
summary.json (timings aside), the same csv/<stage>/metrics.csv (its timing columns aside) and the same
final weights; killed after the stage's last checkpoint (in the stage's end: the final evaluation) as well
as mid-stage. GRPO, one step a round, a checkpoint every round; through `python train.py resume=true`."""
from __future__ import annotations

import csv
import json
import signal
import time
from pathlib import Path

import pytest

from tests.helpers import TINY_MODEL
from tests.test_resume import start_train, wait_for
from tests.test_resume_exact import comparable, weights_digest
from tests.test_train_e2e import train

# 200 held-out examples: the stage's final evaluation takes long enough (~0.5 s) for a kill to land in it
ARGS = TINY_MODEL + ["task.num_heldout=200", "callbacks.evaluate.num_examples=200", "callbacks.progress.refresh_rate=0",
                     "generator.max_new_tokens=6", "checkpoint_every_n_rounds=1", "seed=3", "algorithm=grpo",
                     "trainer.max_steps=6", "data.prompts_per_round=4", "data.batch_size=32", "logger=csv"]


def csv_rows(out: Path) -> list[dict]:
    """metrics.csv's rows, without the columns that time something, empty cells dropped."""
    with (out / "csv" / "grpo" / "metrics.csv").open(newline="") as f:
        return [{k: v for k, v in row.items() if v != "" and "seconds" not in k and not k.startswith("perf/")}
                for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kill") / "uninterrupted"
    done = train(*ARGS, f"hydra.run.dir={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.parametrize("round_", [6, 3], ids=["after_the_last_checkpoint", "mid_stage"])
def test_a_run_killed_at_any_point_resumes_to_the_uninterrupted_summary_and_metrics_file(uninterrupted, tmp_path,
                                                                                         round_):
    killed = tmp_path / "killed"
    proc = start_train(*ARGS, f"hydra.run.dir={killed}")
    wait_for(killed / "checkpoints" / "grpo" / f"epoch={round_ - 1}-step={round_}.ckpt", proc)
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "summary.json").exists() and not (killed / "checkpoints" / "grpo" / "final.ckpt").exists()
    before = csv_rows(killed)  # kill -9: the rows logged so far are on disk
    assert before and before == csv_rows(uninterrupted)[: len(before)]

    resumed = train("resume=true", f"hydra.run.dir={killed}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {killed / 'checkpoints' / 'grpo' / 'last.ckpt'}" in resumed.stdout
    a = comparable(json.loads((uninterrupted / "summary.json").read_text()))["grpo"]
    b = comparable(json.loads((killed / "summary.json").read_text()))["grpo"]
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    assert not differ, [(k, a.get(k), b.get(k)) for k in differ]
    assert b["rollout/rounds"] == 6 and b["stop_reason"] == "trainer.max_steps (6 ≥ 6)"
    assert csv_rows(killed) == csv_rows(uninterrupted)
    assert not list((killed / "csv").glob("grpo-resume-*"))
    assert weights_digest(killed) == weights_digest(uninterrupted)
