"""`python train.py experiment=tool_use` end to end with the tiny-model overrides and a few steps: both stages
run with the calculator environment, the tool statistics reach the per-round metrics and summary.json, and
the stored episodes come back with their masks and per-turn provenance (the store takes episodes)."""
from __future__ import annotations

import csv
import json

from transformers import AutoTokenizer

from data_modules.store import load_experience
from envs.chat_tools import ChatRendering
from models.synthetic import write_qwen_like
from models.tokenizer import build_char_tokenizer
from tests.helpers import CHAT_MODEL, TINY_MODEL
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
                "cost/tool_calls", "val/tool_calls_per_episode", "cost/tool_wait_seconds",
                "rollout/tool_budget_spent_total", "cost/tool_wait_seconds_frac"):
        assert key in grpo, key
    assert grpo["rollout/tool_budget_spent_total"] == 0 and 0 <= grpo["cost/tool_wait_seconds_frac"] < 1
    assert grpo["cost/generated_tokens"] > 0 and grpo["rollout/rounds"] == 3
    assert "val/tool_calls_per_episode" in summary["sft"]  # SFT's held-out evaluation plays episodes too
    rows = list(csv.DictReader((out / "csv" / "grpo" / "metrics.csv").open()))
    per_round = [r for r in rows if r.get("rollout/tool_calls_per_episode") not in ("", None)]
    assert len(per_round) == 3 and all("rollout/tool_malformed" in r and "cost/tool_seconds" in r
                                       and "rollout/tool_budget_spent" in r for r in per_round)
    records = load_experience(store, build_char_tokenizer())
    assert len(records) == 3 * 4 * 8
    shown = sum(t["kind"] == "observation" for r in records for t in r.turns)
    assert shown == grpo["cost/tool_calls"], (shown, grpo["cost/tool_calls"])  # every call counted was shown
    for r in records:
        assert len(r.loss_mask) == len(r.completion_ids) == len(r.behaviour_logprobs)
        assert r.turns and r.turns[0]["kind"] == "policy" and sum(t["length"] for t in r.turns) == len(r.completion_ids)
        for t in r.turns:
            span = slice(t["start"], t["start"] + t["length"])
            assert set(r.loss_mask[span]) <= ({1} if t["kind"] == "policy" else {0})
            if t["kind"] == "observation":
                assert set(r.behaviour_logprobs[span]) == {0.0}


CHAT_STAGES = ('stages=[{name: sft, overrides: ["algorithm=sft", "data=episode_demonstrations", "data.max_examples=200", '
               '"trainer.max_steps=100", "data.batch_size=16", "algorithm.optimizer.lr=1e-2"]}, '
               '{name: grpo, overrides: ["algorithm=grpo", "data=fresh_rollouts", "data.prompts_per_round=4", '
               '"data.batch_size=16", "trainer.max_steps=2"]}]')


def test_tool_use_chat_runs_two_turn_episodes_on_an_hf_chat_model(tmp_path):
    """experiment=tool_use_chat on the synthetic ChatML model (model=hf, its chat template lists the tools):
    after a short SFT on teacher episodes the policy calls the calculator, so GRPO's rollouts are two-turn
    episodes, and each stored observation is exactly the template's rendering of a tool message."""
    model = write_qwen_like(tmp_path / "chat", tokenizer="bpe", **{**CHAT_MODEL, "max_position_embeddings": 1024})
    out, store = tmp_path / "run", tmp_path / "store"
    proc = train("experiment=tool_use_chat", f"model.name_or_path={model}", CHAT_STAGES, "task.num_heldout=8",
                 "callbacks.evaluate.num_examples=8", "callbacks.progress.refresh_rate=0", "logger=csv",
                 f"++data.store={store}", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    grpo = json.loads((out / "summary.json").read_text())["grpo"]
    assert grpo["cost/tool_calls"] > 0 and grpo["rollout/tool_calls_per_episode_mean"] > 0
    tok = AutoTokenizer.from_pretrained(model)
    rendering, records = ChatRendering(tok), load_experience(store, tok)
    two_turn = [r for r in records if any(t["kind"] == "observation" for t in r.turns)]
    assert two_turn, "no rollout called the tool"
    shown = sum(t["kind"] == "observation" for r in records for t in r.turns)
    assert shown == grpo["cost/tool_calls"], (shown, grpo["cost/tool_calls"])  # every call counted was shown
    for r in two_turn:
        call, obs = r.turns[0], r.turns[1]
        assert r.completion_ids[call["start"] + call["length"] - 1] == rendering.turn_end_id
        ids = r.completion_ids[obs["start"]: obs["start"] + obs["length"]]
        content = tok.decode(ids).split("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0]
        assert ids == rendering.observation_ids(content, turn_closed=True)
        assert set(r.loss_mask[obs["start"]: obs["start"] + obs["length"]]) == {0}
