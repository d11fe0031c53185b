"""bench/gpu_speed.py's plumbing: the --dry-run (CPU, tiny Qwen2, 2 prompts × 2, 8 tokens, 2 steps) runs
generation (seam, generate) and GRPO + DPO through train.py, and writes the JSON and markdown with every
part's figures (vLLM skipped with its reason). ~35 s on 2 cores: slow."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_vllm_python_names_why_it_is_skipped():
    sys.path.insert(0, str(ROOT))
    from bench.gpu_speed import vllm_python

    assert vllm_python("dry", None)[0] is None
    py, why = vllm_python("gpu", "/nonexistent/python")
    assert py is None and "/nonexistent/python" in why


@pytest.mark.slow
def test_dry_run_writes_every_part(tmp_path):
    env = os.environ | {"OMP_NUM_THREADS": "1", "OUT": str(tmp_path / "out")}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_speed.py"), "--dry-run",
                           "--work", str(tmp_path / "work")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "out" / "gpu_speed_dry.json").read_text())
    assert res["meta"]["dry_run"] and res["meta"]["parameters"] > 0
    assert set(res["generation"]) == {"seam", "generate", "vllm"}
    for engine in ("seam", "generate"):
        g = res["generation"][engine]
        assert g["generated_tokens"] == 2 * 2 * 8 and g["full_length"], g
        assert g["tokens_per_s"] > 0 and g["mfu"] > 0
    assert "skipped" in res["generation"]["vllm"]
    assert set(res["train"]) == {"grpo_hf", "dpo_ref", "grpo_vllm"}
    for name in ("grpo_hf", "dpo_ref"):
        t = res["train"][name]
        assert t["rc"] == 0 and t["optimizer_steps"] == 2, t
        assert {"s_per_step", "train_step_s", "trained_tokens_per_step", "mfu", "throughput"} <= set(t)
    assert res["train"]["grpo_hf"]["tokens_per_step"] == 2 * 2 * 8  # ignore_eos: full-length rollouts
    assert "skipped" in res["train"]["grpo_vllm"]
    md = (tmp_path / "out" / "gpu_speed_dry.md").read_text()
    assert "| seam |" in md and "| grpo_hf |" in md and "DRY RUN" in md
    assert set(res["async"]) == {"grpo_cpu_sync", "grpo_cpu_async_k1"}  # the async block (issue 32)
    for name, row in res["async"].items():
        assert row["rc"] == 0 and row["optimizer_steps"] == 4 and row["trainer_idle_s"] >= 0, (name, row)
    assert "| grpo_cpu_async_k1 |" in md and "Async ÷ sync wall per round" in md


def test_async_report_tables_the_two_runs_and_their_ratio():
    """The async block's markdown: one row a run, s/round, tokens/s from the trained tokens a step, idle
    seconds, and the async ÷ sync wall per round (0.75 / 1.5 = 0.5)."""
    sys.path.insert(0, str(ROOT))
    from bench.gpu_speed import async_report

    row = dict(rc=0, throughput=200.0, trained_tokens_per_step=300.0, train_step_s=0.4, trainer_idle_s=0.1,
               engine_idle_s=0.2)
    res = {"meta": {"dry_run": False}, "async": {"grpo_cpu_sync": row | {"s_per_step": 1.5},
                                                   "grpo_cpu_async_k1": row | {"s_per_step": 0.75}}}
    md = "\n".join(async_report(res))
    assert "Async ÷ sync wall per round: 0.50." in md and "8 threads each" in md
    assert "| grpo_cpu_async_k1 | 0.750 | 200 | 400 | 0.400 | 0.10 | 0.20 |  |" in md
