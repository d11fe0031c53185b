"""`python train.py experiment=tool_use` end to end with the tiny-model overrides and a few steps: both stages
run with the calculator environment, the tool statistics reach the per-round metrics and summary.json, and
the stored episodes come back with their masks and per-turn provenance (the store takes episodes)."""
from __future__ import annotations

import csv
import json

from data_modules.store import load_experience
from models.tokenizer import build_char_tokenizer
from tests.helpers import TINY_MODEL
from tests.test_train_e2e import train

SMALL = TINY_MODEL + ["trainer.max_steps=3", "data.prompts_per_round=4", "data.batch_size=32", "task.num_heldout=16",
                      "callbacks.progress.refresh_rate=0", "++data.max_examples=64", "logger=csv"]


def test_tool_use_runs_both_stages_and_reports_tool_statistics(tmp_path):
    out, store = tmp_path / "run", tmp_path / "store"
    proc = train("experiment=tool_use", *SMALL, f"++data.store={store}", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["sft", "grpo"]
    grpo = summary["grpo"]
    for key in ("rollout/tool_calls_per_episode_mean", "rollout/tool_malformed_total", "cost/tool_seconds",
                "cost/tool_calls", "val/tool_calls_per_episode"):
        assert key in grpo, key
    assert grpo["cost/generated_tokens"] > 0 and grpo["rollout/rounds"] == 3
    assert "val/tool_calls_per_episode" in summary["sft"]  # SFT's held-out evaluation plays episodes too
    rows = list(csv.DictReader((out / "csv" / "grpo" / "metrics.csv").open()))
    per_round = [r for r in rows if r.get("rollout/tool_calls_per_episode") not in ("", None)]
    assert len(per_round) == 3 and all("rollout/tool_malformed" in r and "cost/tool_seconds" in r for r in per_round)
    records = load_experience(store, build_char_tokenizer())
    assert len(records) == 3 * 4 * 8
    for r in records:
        assert len(r.loss_mask) == len(r.completion_ids) == len(r.behaviour_logprobs)
        assert r.turns and r.turns[0]["kind"] == "policy" and sum(t["length"] for t in r.turns) == len(r.completion_ids)
        for t in r.turns:
            span = slice(t["start"], t["start"] + t["length"])
            assert set(r.loss_mask[span]) <= ({1} if t["kind"] == "policy" else {0})
            if t["kind"] == "observation":
                assert set(r.behaviour_logprobs[span]) == {0.0}
