"""bf16-mixed on 2 FSDP2 ranks (tests/hardware/mixed_steps.py): the forward computes with bfloat16 weights
(gathered under FSDP2's MixedPrecisionPolicy), while the sharded parameters and AdamW's state stay float32,
so two steps at lr 1e-6 move ≥ 99 % of the weights, as on one process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from tests.hardware.test_equivalence import SLOW, clean_env

SCRIPT = Path(__file__).with_name("mixed_steps.py")


@SLOW
def test_fsdp_bf16_mixed_keeps_float32_shards_and_their_updates(tmp_path):
    out = tmp_path / "mixed.pt"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(SCRIPT), str(out), "fsdp"], env=clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = torch.load(out)
    assert found["sharded"] and found["weights"] == {torch.bfloat16}, found
    assert found["params"] == found["state"] == {torch.float32}, found
    assert found["changed"] >= 0.99, found
