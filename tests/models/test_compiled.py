"""model.compile (models/compiled.py): the compiled training forward gives the eager forward's log-probs and
parameter gradients on the tiny model, at two batch lengths (dynamic shapes: one graph, no wrong reuse)."""
from __future__ import annotations

import pytest
import torch

from models import compiled
from models.forward import sequence_token_logprobs
from models.tiny import build_tiny


def batch(rows: int, length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 90, (rows, length), generator=g)
    lengths = torch.randint(2, length + 1, (rows,), generator=g)
    lengths[0] = length
    mask = (torch.arange(length) < lengths[:, None]).long()
    return ids * mask, mask


def grads(model, ids, mask):
    lp = sequence_token_logprobs(model, ids, mask, 0.9)
    loss = (lp * mask[:, 1:] * torch.linspace(-1, 1, lp.shape[1])).sum()
    model.zero_grad(set_to_none=True)
    loss.backward()
    return lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_model_compile_key_marks_the_decoder():
    model, _ = build_tiny(32, 1, 2, 64, 64, seed=0, compile=True)
    assert compiled.enabled(model.get_decoder())
    assert not compiled.enabled(build_tiny(32, 1, 2, 64, 64, seed=0)[0].get_decoder())


@pytest.mark.slow  # torch.compile's first call takes tens of seconds on a CPU
def test_compiled_forward_and_gradients_equal_eager():
    eager, _ = build_tiny(32, 2, 2, 64, 64, seed=0)
    twin, _ = build_tiny(32, 2, 2, 64, 64, seed=0, compile=True)
    for rows, length, seed in ((6, 11, 0), (4, 17, 1)):
        ids, mask = batch(rows, length, seed)
        lp_e, g_e = grads(eager, ids, mask)
        lp_c, g_c = grads(twin, ids, mask)
        valid = mask[:, 1:].bool()
        assert torch.allclose(lp_c[valid], lp_e[valid], atol=1e-5)
        assert g_e.keys() == g_c.keys() and len(g_e) > 0
        for n in g_e:
            assert torch.allclose(g_c[n], g_e[n], atol=1e-5), (n, (g_c[n] - g_e[n]).abs().max())


@pytest.mark.slow  # a train.py process plus torch.compile's first calls: minutes on a shared CPU
def test_train_py_runs_with_model_compile(tmp_path):
    """End to end: `python train.py model.compile=true` trains an SFT stage (the compiled forward and backward)."""
    from tests.helpers import TINY_MODEL
    from tests.test_train_e2e import train

    out = tmp_path / "run"
    proc = train(*TINY_MODEL, "experiment=single", "algorithm=sft", "data=demonstrations", "model.compile=true",
                 "data.batch_size=16", "task.num_heldout=20", "callbacks.progress.refresh_rate=0",
                 "trainer.max_steps=2", "logger=csv", "callbacks.evaluate=null", "callbacks.checkpoint=null",
                 "callbacks.plots=null", "trainer.enable_checkpointing=false", f"hydra.run.dir={out}", timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compile: true" in (out / "config.yaml").read_text()
