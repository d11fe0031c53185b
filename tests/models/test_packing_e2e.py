"""model.packing through train.py: GRPO on prompts of mixed lengths runs its training and annotation
forwards packed (counted by a callback), and its first optimizer step's loss equals the padded run's
(the same seed samples the same completions: generation does not pack)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.test_train_e2e import SMALL, train


def prompts_file(tmp_path: Path) -> Path:
    """Arithmetic-style prompts of 6 to 40 characters (= tokens) with their answers."""
    rows = []
    for i in range(120):
        a, b = i % 50, (7 * i) % 50
        rows.append({"prompt": "." * ((i * 13) % 35) + f"{a}+{b}=", "answer": str(a + b)})
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(tmp_path: Path, packing: bool, algorithm: str = "grpo") -> tuple[dict, float]:
    out = tmp_path / f"run_{packing}"
    counts = tmp_path / f"counts_{packing}.json"
    args = [a for a in SMALL if not a.startswith("trainer.max_steps")] + [
        "experiment=single", f"algorithm={algorithm}", "trainer.max_steps=2", "logger=csv", "callbacks.plots=null",
        "task=jsonl", f"task.train_path={prompts_file(tmp_path)}", "task.num_heldout=20",
        f"model.packing={str(packing).lower()}", "callbacks.checkpoint=null", "trainer.enable_checkpointing=false",
        "+callbacks.packed_counter._target_=tests.models.packing_counter.PackedCounter",
        f"+callbacks.packed_counter.out={counts}", f"hydra.run.dir={out}"]
    result = train(*args, timeout=900)  # two train.py runs on a shared 2-core machine
    assert result.returncode == 0, result.stderr[-3000:]
    rows = list(csv.DictReader(next(out.rglob("metrics.csv")).open()))
    first = float(next(r["train/loss"] for r in rows if r.get("train/loss")))
    return json.loads(counts.read_text()), first


def test_grpo_runs_packed_through_train_py(tmp_path):
    counts, loss = run(tmp_path, packing=True)
    assert counts["packed"] > 0, counts  # mixed prompt lengths: the batches do pack
    assert loss == loss  # finite, logged


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_first_step_loss_equals_padded(tmp_path, algorithm):
    packed_counts, packed = run(tmp_path, packing=True, algorithm=algorithm)
    padded_counts, padded = run(tmp_path, packing=False, algorithm=algorithm)
    assert packed_counts["packed"] > 0 and padded_counts == {"packed": 0, "fallback": 0}
    assert packed == pytest.approx(padded, abs=1e-4)
