"""`python train.py experiment=tool_use generator=vllm` end to end (issue 23): both stages play their episodes with
the vLLM engine (SFT's held-out evaluation, GRPO's rollouts), the episodes make tool calls, every policy turn that
an observation follows ends at the close tag's ids, and the stored records name vLLM as their generator.

Needs the vllm venv (bash scripts/test_vllm.sh); skipped where vllm is not installed. The model is the tiny one
with head_dim 32 (hidden 64, 2 heads: vLLM's CPU attention has no head_dim 16 kernel); SFT on teacher episodes
that all call the calculator (as tests.helpers.TOOL_EPISODES), so that GRPO's episodes open calls. ~1 min.
"""
from __future__ import annotations

import json

import pytest

vllm = pytest.importorskip("vllm")

from transformers import AutoTokenizer  # noqa: E402

from data_modules.store import load_experience  # noqa: E402
from envs.chat_tools import ChatRendering  # noqa: E402
from models.synthetic import write_qwen_like  # noqa: E402
from models.tokenizer import build_char_tokenizer  # noqa: E402
from tests.envs.test_tool_use_e2e import CHAT_STAGES  # noqa: E402
from tests.helpers import CHAT_MODEL  # noqa: E402
from tests.test_train_e2e import train  # noqa: E402

pytestmark = pytest.mark.vllm

VLLM_TOOL_USE = [
    "experiment=tool_use", "generator=vllm", "model.hidden_size=64", "model.num_layers=1", "model.num_heads=2",
    "model.intermediate_size=64", "task.tool_rate=1.0", "task.num_heldout=16", "callbacks.progress.refresh_rate=0",
    "logger=none", "stages.0.overrides=['algorithm=sft','data=episode_demonstrations','data.max_examples=128',"
    "'trainer.max_steps=150']",
    "stages.1.overrides=['algorithm=grpo','data=fresh_rollouts','data.prompts_per_round=4','data.batch_size=32',"
    "'trainer.max_steps=3']"]


def test_tool_use_runs_its_episodes_with_vllm(tmp_path):
    out, store = tmp_path / "run", tmp_path / "store"
    proc = train(*VLLM_TOOL_USE, f"++data.store={store}", f"hydra.run.dir={out}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary) == ["sft", "grpo"]
    grpo = summary["grpo"]
    assert grpo["rollout/rounds"] == 3 and grpo["cost/generated_tokens"] > 0
    assert grpo["cost/tool_calls"] > 0 and grpo["rollout/tool_calls_per_episode_mean"] > 0
    assert summary["sft"]["val/tool_calls_per_episode"] > 0  # held-out greedy episodes, through vLLM too
    tok = build_char_tokenizer()
    close = tok("]", add_special_tokens=False)["input_ids"]
    records = load_experience(store, tok)
    assert len(records) == 3 * 4 * 8
    assert {r.provenance.generator for r in records} == {"vllm"}
    assert "vllm_version" in records[0].provenance.sampling
    observed = 0
    for r in records:
        assert len(r.loss_mask) == len(r.completion_ids) == len(r.behaviour_logprobs)
        assert sum(t["length"] for t in r.turns) == len(r.completion_ids)
        for turn, after in zip(r.turns, r.turns[1:]):
            if after["kind"] == "observation":
                observed += 1
                assert r.completion_ids[turn["start"] + turn["length"] - 1:][:1] == close
                span = slice(after["start"], after["start"] + after["length"])
                assert set(r.loss_mask[span]) == {0} and set(r.behaviour_logprobs[span]) == {0.0}
    assert observed > 0


def test_tool_use_chat_runs_its_two_turn_episodes_with_vllm(tmp_path):
    """experiment=tool_use_chat (model=hf, the chat template's <tool_call> format) with generator=vllm: the
    rollouts call the calculator, and each stored observation is the template's rendering of a tool message
    after a turn that vLLM ended at the turn-end id."""
    model = write_qwen_like(tmp_path / "chat", tokenizer="bpe", **{**CHAT_MODEL, "max_position_embeddings": 1024})
    out, store = tmp_path / "run", tmp_path / "store"
    proc = train("experiment=tool_use_chat", "generator=vllm", f"model.name_or_path={model}", CHAT_STAGES,
                 "task.num_heldout=8", "callbacks.evaluate.num_examples=8", "callbacks.progress.refresh_rate=0",
                 "logger=none", f"++data.store={store}", f"hydra.run.dir={out}", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    grpo = json.loads((out / "summary.json").read_text())["grpo"]
    assert grpo["cost/tool_calls"] > 0 and grpo["rollout/tool_calls_per_episode_mean"] > 0
    tok = AutoTokenizer.from_pretrained(model)
    rendering, records = ChatRendering(tok), load_experience(store, tok)
    assert {r.provenance.generator for r in records} == {"vllm"}
    two_turn = [r for r in records if any(t["kind"] == "observation" for t in r.turns)]
    assert two_turn
    for r in two_turn:
        call, obs = r.turns[0], r.turns[1]
        assert r.completion_ids[call["start"] + call["length"] - 1] == rendering.turn_end_id
        ids = r.completion_ids[obs["start"]: obs["start"] + obs["length"]]
        content = tok.decode(ids).split("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0]
        assert ids == rendering.observation_ids(content, turn_closed=True)
