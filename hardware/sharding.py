"""FSDP2 (`hardware=fsdp`: Lightning's ModelParallelStrategy, `fully_shard` in `configure_model`).

Each decoder block (the model's `_no_split_modules` classes) is one FSDP unit and the rest (embeddings,
final norm, LM head: tied or not) the root unit, as torchtitan and accelerate's transformer policy do.
The frozen reference is sharded the same way. Training forwards go through the root's `forward`
(models/forward.py), so FSDP's hooks gather and free each unit and reduce-scatter its gradients.

No-grad passes over a rank's own, uneven share of the data (generation, annotation, held-out
evaluation) run inside `full_weights`: every unit is gathered once, on every rank together, and stays
gathered until the pass ends, so those passes make no collective calls and ranks may take different
numbers of steps. That is the one full copy a rank holds, for as long as FSDP itself would need it to
generate; with one process, or without FSDP, `full_weights` does nothing.

Mixed precision (`trainer.precision=bf16-mixed`): every unit gets FSDP2's `MixedPrecisionPolicy(param_dtype=
bfloat16, reduce_dtype=float32)`: the sharded parameters, which the optimizer updates, stay float32 (the
master weights, and AdamW's state with them); each unit is gathered in bfloat16 for its forward and
backward, and gradients are reduce-scattered in float32 into the float32 shards.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


def fsdp_units(model: torch.nn.Module) -> list:
    """The FSDP2 units of `model`, root first ([] when it is not sharded)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_sharded(model) -> bool:
    return model is not None and bool(fsdp_units(model))


def block_classes(model: torch.nn.Module) -> set[str]:
    names = set(getattr(model, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(f"hardware=fsdp: {type(model).__name__} names no decoder block class "
                         f"(`_no_split_modules`) to shard by")
    return names


def mixed_precision(precision) -> dict:
    """fully_shard's keyword arguments for Lightning's `precision`: under "bf16-mixed" a MixedPrecisionPolicy
    that computes in bfloat16 over float32 shards and reduces gradients in float32; otherwise none (FSDP
    computes in the parameters' own dtype)."""
    if str(precision) != "bf16-mixed":
        return {}
    from torch.distributed.fsdp import MixedPrecisionPolicy
    return {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}


def shard_model(model: torch.nn.Module, mesh, precision=None) -> torch.nn.Module:
    """`fully_shard` each decoder block, then the root, over `mesh` (in place; a sharded model as is),
    with the mixed precision policy of Lightning's `precision` (`mixed_precision`)."""
    from torch.distributed.fsdp import fully_shard
    if is_sharded(model):
        return model
    names, kwargs = block_classes(model), mixed_precision(precision)
    for module in list(model.modules()):
        if type(module).__name__ in names:
            fully_shard(module, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model


def fully_shard_module(module: torch.nn.Module, mesh, precision=None) -> torch.nn.Module:
    """One FSDP unit for a small module with its own weights (PPO's value head)."""
    from torch.distributed.fsdp import fully_shard
    return module if is_sharded(module) else fully_shard(module, mesh=mesh, **mixed_precision(precision))


def full_state_dict(model: torch.nn.Module) -> dict:
    """The whole state dict of a sharded model on rank 0's CPU ({} on other ranks); every rank calls.

    Tied parameters (an LM head tied to the embedding) come back as one tensor under each of their names,
    as `model.state_dict()` gives them: gathered from several ranks' shards they were separate copies, and
    save_pretrained, which finds ties by shared storage, wrote the embedding matrix twice (Qwen2.5-0.5B:
    136 M parameters more)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    for names in tied_names(model):
        present = [n for n in names if n in state]
        for name in present[1:]:
            state[name] = state[present[0]]
    return state


def tied_names(model: torch.nn.Module) -> list[list[str]]:
    """Groups of parameter names that are one parameter (tied weights), each in the model's order."""
    by_param: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_param.setdefault(id(param), []).append(name)
    return [names for names in by_param.values() if len(names) > 1]


def reshard(*models) -> None:
    """Put every FSDP unit of `models` in its sharded state (a no-op for plain models and for units
    already sharded): the shards are FSDP's weights, and a write to a gathered copy would be lost."""
    for model in models:
        for unit in fsdp_units(model):
            unit.reshard()


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded (DTensor) parameter, sharing its storage; a plain tensor as is.
    Call under torch.no_grad (then DTensor.to_local returns the shard itself, not an autograd view)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


@contextmanager
def full_weights(pl_module):
    """Gather the sharded policy and reference of `pl_module` once, keep them gathered inside."""
    roots = [m for m in (getattr(pl_module, "policy", None), getattr(pl_module, "reference", None))
             if is_sharded(m)]
    if not roots:
        yield
        return
    units = [u for root in roots for u in fsdp_units(root)]
    for unit in units:  # the root first: its lazy init must come before any block's
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
        for root in roots:  # blocks free their weights after forward again; the root keeps its own,
            for unit in fsdp_units(root)[1:]:  # as FSDP does for a root (backward needs them at once)
                unit.set_reshard_after_forward(True, recurse=False)
