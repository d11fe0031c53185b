"""Provenance names the model, the weights and the run, and the store's reuse counts are true when read
back (issue 31, item 11), through `python train.py` (SFT 4 steps → GRPO with data.store): records used to
carry no model, no run id, a policy_version restarting at 0 in the GRPO stage (after 4 SFT steps) and
prov_times_used 0 on disk (written when the round was made, before any record was served)."""
from __future__ import annotations

import json

from data_modules.store import load_experience, round_files
from models.tokenizer import build_char_tokenizer
from tests.test_train_e2e import SMALL, train


def test_a_grpo_store_after_sft_names_model_weights_run_and_reuse(tmp_path):
    out, store = tmp_path / "run", tmp_path / "store"
    proc = train(*SMALL, "algorithm.epochs_per_round=2", f"data.store={store}", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["sft"]["train/steps"] == 4 and summary["grpo"]["train/steps"] == 4
    run_id = json.loads((out / "run.json").read_text())["wandb_id"]
    # 4 prompts × 8 samples = 32 records a round = one batch, served twice (epochs_per_round=2): 2 steps a
    # round, so the GRPO stage's 4 steps are 2 rounds, made at run-wide steps 4 (after SFT's 4) and 6.
    assert [i for i, _ in round_files(store)] == [0, 1]
    records = load_experience(store, build_char_tokenizer())
    assert len(records) == 64
    assert [r.provenance.policy_version for r in records] == [4] * 32 + [6] * 32
    assert [r.provenance.created_step for r in records] == [4] * 32 + [6] * 32
    assert {r.provenance.times_used for r in records} == {2}  # both rounds' records served in 2 batches
    assert {r.provenance.run_id for r in records} == {run_id} and len(run_id) == 8
    assert {r.provenance.model for r in records} == {
        "models.tiny.build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, "
        "max_position_embeddings=64, seed=1, dtype=float32, activation_checkpointing=False, packing=False, compile=False)"}
    assert {r.provenance.model_revision for r in records} == {None}  # built in code: its settings name it
