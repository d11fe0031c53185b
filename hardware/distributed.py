"""What the rest of the code needs to know about ranks, in one place: who am I, my share of a list, the
whole round back from every rank, and sums/means across ranks. With one process every function is the
identity (no process group is needed, nothing is communicated).

Under `hardware=ddp|fsdp|deepspeed_*` every rank runs the same code on its share of the data:
    - a round's prompts are split by rank, whole groups each (`shard`); each rank generates, scores and
      annotates its groups, then `gather` gives every rank the whole round, so buffers, replay choices
      and round metrics are the same on every rank by construction (one decision, no drift);
    - a data loader serves rank r the records r, r+W, r+2W, ... of the epoch's seeded order
      (`shard_records`), so optimizer step k covers the same records as a 1-process step k;
    - per-step metrics are reduced (`weighted_means`) before they are logged; rank 0 alone logs.
"""
from __future__ import annotations

import hashlib
import os

import torch
import torch.distributed as dist


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's global rank: from the process group, else from the launcher's environment."""
    if active():
        return dist.get_rank()
    for key in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):  # before the group exists (start-up, train.py)
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_zero() -> bool:
    return rank() == 0


def shard(items: list, r: int | None = None, w: int | None = None) -> list:
    """Rank r's share of `items`: items r, r+W, r+2W, ... (a round's prompts: each one a whole group)."""
    r, w = rank() if r is None else r, world_size() if w is None else w
    return items[r::w]


def shard_records(order: list, r: int | None = None, w: int | None = None) -> list:
    """Rank r's share of an epoch's ordered records, the tail cut so every rank gets as many (and so
    takes as many optimizer steps): W ranks × batch b cover the same records as one batch of W·b."""
    w = world_size() if w is None else w
    return shard(order[: len(order) // w * w], r, w)


def gather(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank (pickled Python objects; [obj] alone)."""
    if not active():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def gather_lists(items: list) -> list:
    """Every rank's list, concatenated in rank order, on every rank."""
    return [x for part in gather(items) for x in part]


def reduce_sum(values: list[float]) -> list[float]:
    """Element-wise sums across ranks of a list of numbers (one all-reduce)."""
    return _all_reduce(values, dist.ReduceOp.SUM) if active() else list(values)


def reduce_max(values: list[float]) -> list[float]:
    """Element-wise maxima across ranks (one all-reduce)."""
    return _all_reduce(values, dist.ReduceOp.MAX) if active() else list(values)


def _all_reduce(values: list[float], op) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=op)
    return t.tolist()


def weighted_means(metrics: dict[str, float], weight: float) -> dict[str, float]:
    """Per key, the mean across ranks weighted by each rank's `weight` (its tokens or records): see
    `combine`. One gather of the small dicts."""
    if not active():
        return dict(metrics)
    return combine(gather((float(weight), {k: float(v) for k, v in metrics.items()})))


def combine(parts: list[tuple[float, dict]]) -> dict[str, float]:
    """(weight, metrics) of each rank → per key the weighted mean; `*_max` keys take the maximum; a key
    some rank lacks (a slice it did not see) averages over the ranks that have it."""
    out = {}
    for key in dict.fromkeys(k for _, m in parts for k in m):
        seen = [(w, m[key]) for w, m in parts if key in m]
        if key.endswith("_max"):
            out[key] = max(v for _, v in seen)
        else:
            total = sum(w for w, _ in seen)
            out[key] = sum(w * v for w, v in seen) / total if total else sum(v for _, v in seen) / len(seen)
    return out


def check_same_config(text: str, what: str = "config") -> None:
    """Fail loudly when the ranks do not run the same settings (e.g. a sweeper that gave each rank its
    own trial): every rank compares a hash of `text`."""
    if not active():
        return
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    digests = gather(digest)
    if len(set(digests)) > 1:
        raise RuntimeError(f"the ranks run different {what}s (hashes by rank: {digests}): each rank must be "
                           f"launched with the same overrides (see docs/hardware.md)")


def close() -> None:
    """Destroy this process's group before the interpreter exits (a no-op without one). Left to exit,
    gloo's worker threads can still hold work whose tensors reference Python objects; finalization then
    aborts the process (SIGABRT, "terminate called without an active exception") after a run that
    succeeded, and torchrun reports the job as failed."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _device() -> torch.device:
    """The device collectives run on: the current CUDA device under NCCL, else the CPU (gloo)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
