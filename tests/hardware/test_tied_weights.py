"""FSDP2 writes a tied LM head once (issue 31, item 12). The tiny model ties `lm_head.weight` to
`model.embed_tokens.weight` (as Qwen2.5-0.5B does, 151,936 × 896: 136 M parameters). The full state dict
gathered from 2 ranks' shards held the two keys as two tensors, so save_pretrained wrote the embedding
matrix twice into <run>/policy; the tensors of tied parameters now share one storage, as in the model."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from safetensors import safe_open

from models.hf import load_hf
from tests.hardware.test_equivalence import clean_env
from tests.helpers import tiny_model

SCRIPT = Path(__file__).with_name("save_tied.py")


def test_fsdp_writes_a_tied_head_once(tmp_path):
    out = tmp_path / "policy"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(SCRIPT), str(out)], env=clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys, sorted(keys)
    start = tiny_model(seed=2)[0]
    loaded, _ = load_hf(str(out), dtype="float32", trust_remote_code=False, activation_checkpointing=False)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert (loaded.lm_head.weight == start.lm_head.weight).all()
    assert sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in start.parameters())
