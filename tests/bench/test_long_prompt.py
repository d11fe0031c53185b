"""The grpo_long_prompt workload (issue 35): both sides read the same prepared prompts, a 256-character system
prompt (one token a character) before each arithmetic sum, on the tiny model with 512 positions."""
from __future__ import annotations

import json
from pathlib import Path

from bench.workloads import policyshift_side
from bench.workloads.prepare import write_data
from bench.workloads.spec import MODELS, WORKLOADS, system_prompt


def test_long_prompt_workload_reads_the_prepared_prompts(tmp_path: Path):
    w = WORKLOADS["grpo_long_prompt"]
    assert w.prompt_prefix == 256 and w.group == 8 and MODELS[w.model]["max_position_embeddings"] >= 256 + 16
    data = write_data(tmp_path, [w])
    rows = [json.loads(line) for line in (data / "prompts_prefix256.jsonl").read_text().splitlines()]
    plain = [json.loads(line) for line in (data / "prompts.jsonl").read_text().splitlines()]
    assert len(rows) == len(plain) and rows[0]["answer"] == plain[0]["answer"]
    assert rows[0]["prompt"] == system_prompt(256) + plain[0]["prompt"] and len(system_prompt(256)) == 256
    args = policyshift_side.overrides(w, tmp_path, tmp_path, tmp_path / "t.json", data)
    assert "task=jsonl" in args and f"task.train_path={data / 'prompts_prefix256.jsonl'}" in args
    assert "model.max_position_embeddings=512" in args and "algorithm.group_size=8" in args
