"""generator=vllm with 2 CPU ranks (issue 32, an engine per rank): each rank's engine holds the policy's
current weights after real optimizer steps (DDP, and FSDP2 streaming one gathered parameter at a time,
never a full state dict), ranks sample from their own seed streams, and `train.py hardware=ddp
generator=vllm` runs GRPO whose rounds are the 1-process run's rounds, shared out.

Needs the vllm venv (bash scripts/test_vllm.sh); skipped where vllm is not installed. The worker
(tests/generators/vllm_ranks_worker.py) runs under torchrun; ~1.5 min per mode on a loaded 2-core CPU.
"""
from __future__ import annotations

import csv
import json
import math
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm")

from data_modules.store import load_experience  # noqa: E402
from models.tokenizer import build_char_tokenizer  # noqa: E402
from tests.test_train_e2e import train  # noqa: E402

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-4  # float32 engine vs the trainer's forward: ~1e-6 measured (tests/generators/test_vllm.py)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def worker_runs(tmp_path_factory) -> dict[str, list[dict]]:
    """Per mode (ddp, fsdp), each rank's results from tests/generators/vllm_ranks_worker.py."""
    runs = {}
    for mode in ("ddp", "fsdp"):
        out = tmp_path_factory.mktemp(mode)
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
             str(free_port()), str(ROOT / "tests" / "generators" / "vllm_ranks_worker.py"), mode, str(out)],
            cwd=ROOT, env=env | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
            capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
        runs[mode] = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    return runs


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_each_ranks_engine_holds_the_updated_weights(worker_runs, mode):
    """After two AdamW steps (lr 3e-2) each rank's engine samples with log-probs of the updated policy
    (~1e-6), not of the initial one (~2.7 apart): a rank whose engine kept its old weights, or under FSDP
    loaded its own shard only, fails here."""
    for rank in worker_runs[mode]:
        assert rank["backend"] == "external_launcher"  # its device from LOCAL_RANK, not device 0 on every rank
        assert rank["err_new"] < TOL
        assert rank["err_old"] > 0.1


def test_fsdp_streams_one_gathered_parameter_at_a_time(worker_runs):
    """Under FSDP a load gathers each parameter once (`full_tensor`: 21 for the 2-layer tiny policy) and
    the gathered copies are freed as the engine takes them: at most 4 alive at once (vLLM holds q, k, v
    until it fuses them), a quarter of the model's bytes; a full state dict would hold all 21."""
    for rank in worker_runs["fsdp"]:
        assert rank["gathers"] == rank["params"] == 21
        assert rank["peak_alive"] <= rank["params"] // 4
        assert rank["peak_alive_bytes"] < rank["full_bytes"] / 2


def test_fsdp_engines_sample_what_ddp_engines_sample(worker_runs):
    """Same initial weights, same steps, same seeds: the FSDP-streamed engines draw exactly the DDP
    engines' completions on both ranks (their weights agree to sampling)."""
    for ddp, fsdp in zip(worker_runs["ddp"], worker_runs["fsdp"]):
        assert fsdp["own_seed"] == ddp["own_seed"]


def test_each_rank_samples_from_its_own_seed_stream(worker_runs):
    """The engine draws from torch's global generator: reseeded alike, both ranks draw the same
    completions; with each rank's own seed (callbacks/regenerate.py reseeds per rank) they differ."""
    for mode in ("ddp", "fsdp"):
        r0, r1 = worker_runs[mode]
        assert r0["same_seed"] == r1["same_seed"]
        differ = sum(a != b for a, b in zip(r0["own_seed"], r1["own_seed"]))
        assert differ >= len(r0["own_seed"]) // 2


GRPO = ["algorithm=grpo", "generator=vllm", "generator.kv_cache_memory_bytes=33554432", "model.hidden_size=64",
        "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64", "trainer.max_steps=4",
        "data.prompts_per_round=8", "data.batch_size=32", "data.micro_batch_size=16", "generator.max_new_tokens=6",
        "algorithm.optimizer.lr=0.01", "algorithm.scheduler.num_warmup_steps=0", "task.num_heldout=8",
        "callbacks.evaluate.num_examples=8", "callbacks.progress.refresh_rate=0", "reward=function",
        "reward.fn._target_=tests.helpers.char_sum_scores", "logger=csv"]


def run_grpo(tmp_path, hardware: str):
    out, store = tmp_path / hardware, tmp_path / f"{hardware}-store"
    proc = train(f"hardware={hardware}", *GRPO, f"++data.store={store}", f"hydra.run.dir={out}", timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = list(csv.DictReader((out / "csv" / "grpo" / "metrics.csv").open()))
    mismatch = [float(r["rollout/logp_mismatch_abs"]) for r in rows if r.get("rollout/logp_mismatch_abs")]
    return json.loads((out / "summary.json").read_text())["grpo"], load_experience(store, build_char_tokenizer()), mismatch


def by_round(records) -> dict[int, list]:
    rounds: dict[int, list] = {}
    for r in records:
        rounds.setdefault(r.provenance.policy_version, []).append(r)
    return rounds


def test_ddp_grpo_runs_an_engine_per_rank_and_its_rounds_are_the_one_process_rounds(tmp_path):
    """`train.py hardware=ddp generator=vllm` against `hardware=cpu`, same seed and global batch: 2 rounds
    of 8 prompts × 8 samples. Per round the 2 ranks' records together are the 1-process round's prompts,
    each group whole and counted once; every round's behaviour log-probs are the trainer's (the engines
    got each update: lr 1e-2 moves them ~1e-1 otherwise); the first round's mean reward (both from the
    initial weights, different draws) agrees within 4 standard errors."""
    ranks, ranks_records, ranks_mismatch = run_grpo(tmp_path, "ddp")
    one, one_records, one_mismatch = run_grpo(tmp_path, "cpu")
    assert ranks["rollout/rounds"] == one["rollout/rounds"] == 2
    assert ranks["cost/records_generated"] == one["cost/records_generated"] == 2 * 64
    assert {r.provenance.generator for r in ranks_records} == {"vllm"}
    assert len(ranks_mismatch) == 2 and max(ranks_mismatch + one_mismatch) < TOL
    two_rounds, one_rounds = by_round(ranks_records), by_round(one_records)
    assert sorted(two_rounds) == sorted(one_rounds) == [0, 2]
    for version in (0, 2):
        groups: dict[int, list] = {}
        for r in two_rounds[version]:
            groups.setdefault(r.group_id, []).append(r)
        assert len(groups) == 8 and all(len(g) == 8 and len({tuple(r.prompt_ids) for r in g}) == 1
                                        for g in groups.values())
        prompts = sorted(tuple(r.prompt_ids) for r in two_rounds[version])
        assert prompts == sorted(tuple(r.prompt_ids) for r in one_rounds[version])
    first_two = [r.reward for r in two_rounds[0]]
    first_one = [r.reward for r in one_rounds[0]]
    se = math.sqrt(statistics.variance(first_two) / len(first_two) + statistics.variance(first_one) / len(first_one))
    assert abs(statistics.mean(first_two) - statistics.mean(first_one)) < 4 * se
