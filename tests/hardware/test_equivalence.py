"""One optimizer step with 2 ranks (DDP, FSDP2) equals one single-process step on the same records, to
1e-6, for GRPO (token-mean loss + KL to a reference), DPO (pairs, precomputed reference) and SFT, each
rank running its share in 2 micro-batches. SGD, so a wrongly scaled gradient shows (a rank-local token
mean instead of the global one moves weights by ~4e-2 here); the step must move weights by > 1e-2."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import tiny_model

SCRIPT = Path(__file__).with_name("one_step.py")


def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TORCHELASTIC_")) and k not in ("MASTER_PORT", "MASTER_ADDR", "LOCAL_RANK", "RANK", "WORLD_SIZE")}
    return env | {"OMP_NUM_THREADS": "1"}


def one_step(tmp: Path, hardware: str, algorithm: str) -> dict:
    out = tmp / f"{hardware}_{algorithm}.pt"
    ranks = [] if hardware == "cpu" else ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    proc = subprocess.run([sys.executable, *ranks, str(SCRIPT), str(out), hardware, algorithm],
                          env=clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return torch.load(out)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    tmp, cache = tmp_path_factory.mktemp("single"), {}
    return lambda algorithm: cache.setdefault(algorithm, one_step(tmp, "cpu", algorithm))


SLOW = pytest.mark.slow  # each case is a 2-process run (~15 s on 2 cores): the default run keeps three


@pytest.mark.parametrize("hardware,algorithm", [
    ("ddp", "grpo"), ("fsdp", "grpo"), ("ddp", "dpo"),
    pytest.param("fsdp", "dpo", marks=SLOW), pytest.param("ddp", "sft", marks=SLOW),
    pytest.param("fsdp", "sft", marks=SLOW)])
def test_two_ranks_step_equals_one_process(single, tmp_path, hardware, algorithm):
    one, two = single(algorithm), one_step(tmp_path, hardware, algorithm)
    start = tiny_model(seed=2)[0].state_dict()
    assert sorted(one) == sorted(two)
    assert max((one[k] - start[k]).abs().max().item() for k in one) > 1e-2  # the step did move the weights
    worst = max((one[k] - two[k]).abs().max().item() for k in one)
    assert worst < 1e-6, f"{hardware} {algorithm}: weights differ from one process by {worst}"


@SLOW
def test_fsdp_reference_refresh_writes_each_ranks_shards(tmp_path):
    """Online DPO, ref_update_every=1, FSDP2 on 2 ranks (tests/hardware/ref_refresh.py): after every
    refresh each rank's reference shards equal its policy shards, and they still do at the end (the
    write landed in FSDP's shards, not in a gathered copy); rounds with uneven pairs per rank don't hang."""
    out = tmp_path / "refresh.pt"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(SCRIPT.with_name("ref_refresh.py")), str(out)],
                          env=clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        found = torch.load(f"{out}.{rank}")
        assert found["sharded"] and len(found["rounds"]) >= 3, found
        assert [r["updates"] for r in found["rounds"]] == list(range(len(found["rounds"])))
        assert all(r["equal"] for r in found["rounds"]), found["rounds"]
        assert found["end_reference_is_last_refresh"] and found["end_policy_moved_on"]
