"""`python train.py`: each stage is evaluated on what it trains (a subprocess each, ~15 s)."""
from __future__ import annotations

import json

from tests.helpers import TINY_MODEL
from tests.test_train_e2e import train

SMALL = TINY_MODEL + ["trainer.max_steps=3", "logger=none", "callbacks.progress.refresh_rate=0"]


def test_dpo_on_its_own_file_is_scored_on_its_pairs_not_on_the_arithmetic_task(tmp_path):
    rows = [{"prompt": f"{i}+{i}=", "chosen": str(2 * i), "rejected": str(2 * i + 1)} for i in range(40)]
    (tmp_path / "prefs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    proc = train("algorithm=dpo", "data=static_preferences", f"data.path={tmp_path / 'prefs.jsonl'}",
                 "data.num_heldout=8", "data.batch_size=8", *SMALL, f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[eval] no held-out accuracy on task 'arithmetic2': the stage trains on" in proc.stdout
    dpo = json.loads((out / "summary.json").read_text())["dpo"]
    assert "val/accuracy_after" not in dpo and "val/accuracy_before" not in dpo  # no arithmetic decoding
    assert dpo["val/pref_accuracy_before"] == 0.5 and "val/reward_margin_after" in dpo
    assert sorted(p.name for p in (out / "plots").glob("*.png")) == ["loss.png", "margin.png"]


def test_sft_on_a_math_file_is_scored_by_the_math_reward_and_reports_its_heldout_loss(tmp_path):
    rows = [{"prompt": f"What is {i} times 2? ", "answer": f"The answer is {2 * i}."} for i in range(30)]
    (tmp_path / "math.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    proc = train("algorithm=sft", "task=jsonl", f"task.train_path={tmp_path / 'math.jsonl'}", "task.num_heldout=4",
                 "reward=math", "data.batch_size=8", "generator.max_new_tokens=4", *SMALL, f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("[eval] held-out accuracy is scored by the stage's reward 'math' "
                             "(MathAnswerVerifier)") == 1
    sft = json.loads((out / "summary.json").read_text())["sft"]
    assert sft["val/loss_after"] < sft["val/loss_before"]  # three steps on the same answers' format
    assert 0 <= sft["val/accuracy_after"] <= 1
    assert "loss.png" in [p.name for p in (out / "plots").glob("*.png")]
