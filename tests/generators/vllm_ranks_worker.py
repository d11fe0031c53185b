"""One rank of tests/generators/test_vllm_ranks.py, started by torchrun (2 CPU ranks, gloo):
    python -m torch.distributed.run --nproc-per-node 2 tests/generators/vllm_ranks_worker.py MODE OUT

MODE: ddp (the policy wrapped in DistributedDataParallel) or fsdp (FSDP2 over both ranks, as
hardware/sharding.py shards it). Each rank builds its own vLLM engine (generators/vllm.py) while
Lightning-like gloo world of 2 exists, loads the policy's weights, takes two real AdamW steps on the
(sharded) policy, loads them again (streamed: under FSDP one gathered parameter at a time) and writes
OUT/rank{r}.json with what the test checks:
    err_new / err_old   max |engine log-prob - the full updated (resp. initial) policy's log-prob|
    gathers, peak_alive, params, peak_alive_bytes, full_bytes   FSDP's gathered parameters during a load
    backend             the engine's executor (vLLM's torchrun mode, external_launcher)
    same_seed / own_seed   completions sampled with the same torch seed on both ranks, and with each
                           rank's own seed (regenerate's per-rank stream)
"""
from __future__ import annotations

import copy
import json
import sys
import weakref
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from generators.base import weights_loaded  # noqa: E402
from generators.vllm import VLLMGenerator  # noqa: E402
from hardware.sharding import shard_model  # noqa: E402
from models.tiny import build_tiny  # noqa: E402
from tests.generators.test_vllm import TINY, make_prompts, max_error, reference_logprobs  # noqa: E402


class GatherCount:
    """Counts DTensor.full_tensor calls and the most gathered parameters alive at once (weak references:
    a gathered tensor is alive while anything, the engine's loader included, still holds it)."""

    def __init__(self):
        from torch.distributed.tensor import DTensor
        self.cls, self.original = DTensor, DTensor.full_tensor
        self.alive: list = []
        self.calls = self.peak = self.peak_bytes = 0

    def __enter__(self):
        def counted(t, *args, **kwargs):
            out = self.original(t, *args, **kwargs)
            self.calls += 1
            self.alive = [r for r in self.alive if r() is not None] + [weakref.ref(out)]
            live = [t for t in (r() for r in self.alive) if t is not None]
            self.peak = max(self.peak, len(live))
            self.peak_bytes = max(self.peak_bytes, sum(t.numel() * t.element_size() for t in live))
            return out
        self.cls.full_tensor = counted
        return self

    def __exit__(self, *exc):
        self.cls.full_tensor = self.original


def train_steps(model, tok, steps: int = 2) -> None:
    """Two AdamW steps raising the likelihood of fixed text: every parameter moves (by ~lr)."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    ids = torch.tensor([tok("12+34=46 and 7+8=15")["input_ids"]] * 2)
    for _ in range(steps):
        logits = model(ids).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()


def full_copy(policy, tok):
    """A plain (unsharded) model holding the policy's whole current weights, on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    plain, _ = build_tiny(**TINY)
    state = get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True))
    plain.load_state_dict(state)
    return plain


def main(mode: str, out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    policy, tok = build_tiny(**TINY)
    initial = copy.deepcopy(policy)
    if mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        shard_model(policy, init_device_mesh("cpu", (dist.get_world_size(),)))
        trained = policy
    else:
        trained = torch.nn.parallel.DistributedDataParallel(policy)
    gen = VLLMGenerator(8, temperature=1.0, top_p=1.0, batch_size=64, kv_cache_memory_bytes=32 << 20,
                        dtype="policy", engine_kwargs={"block_size": 32})
    prompts = make_prompts(tok, n_distinct=8, repeats=2)
    with weights_loaded(gen, policy, tok):  # builds both engines together (process groups: a collective)
        pass
    trained.train()
    train_steps(trained, tok)
    with GatherCount() as count, weights_loaded(gen, policy, tok):  # the updated weights, streamed
        torch.manual_seed(7 + rank)
        own = gen.sample(policy, tok, prompts)
        torch.manual_seed(7)
        same = gen.sample(policy, tok, prompts)
    updated = full_copy(policy, tok) if mode == "fsdp" else policy
    updated.eval()
    initial.eval()
    result = {
        "err_new": max_error(own.logprobs, reference_logprobs(updated, prompts, own.completions, 1.0)),
        "err_old": max_error(own.logprobs, reference_logprobs(initial, prompts, own.completions, 1.0)),
        "gathers": count.calls, "peak_alive": count.peak, "peak_alive_bytes": count.peak_bytes,
        "params": len(updated.state_dict()),
        "full_bytes": sum(t.numel() * t.element_size() for t in updated.state_dict().values()),
        "own_seed": own.completions, "same_seed": same.completions,
        "backend": gen.llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
