"""Cheap objects built at plan time, where building them is the honest check: the experience buffer
(data_modules/buffer.py takes its capacity, limits and policies), and the store's folder (data.store
must be a directory, or a path where one can be made). The schema has checked each value's type and
range first; these say what the code itself refuses."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from run.validation.values import raw

BUFFER_KEYS = {"buffer_capacity": "capacity", "max_staleness": "max_staleness", "max_reuse": "max_reuse",
               "eviction": "eviction", "sampling": "sampling", "priority_alpha": "priority_alpha"}


def check_buffer(cfg: DictConfig, errors: list[str]) -> None:
    """Build the stage's ExperienceBuffer (no records: a few attributes) from the data node's keys."""
    if raw(cfg, "data.buffer_capacity") is None:
        return
    from data_modules.buffer import ExperienceBuffer
    given = {key: raw(cfg, f"data.{key}") for key in BUFFER_KEYS}
    kwargs = {BUFFER_KEYS[key]: value for key, value in given.items() if value is not None}
    try:
        ExperienceBuffer(**kwargs)
    except (TypeError, ValueError) as e:
        shown = " ".join(f"data.{key}={raw(cfg, f'data.{key}')!r}" for key in BUFFER_KEYS if key in cfg.data)
        errors.append(f"the experience buffer does not build from {shown}: {e}")


def check_store(cfg: DictConfig, errors: list[str]) -> None:
    """data.store: a directory every round is written to as Parquet; an existing file there would fail the
    first write, after the first round was generated."""
    store = raw(cfg, "data.store")
    if not isinstance(store, str):
        return
    path = Path(store)
    if path.exists() and not path.is_dir():
        errors.append(f"data.store={store!r} is a file, not a directory: the store is a folder of Parquet files "
                      f"(name a new or existing folder)")
    elif not path.exists():
        parent = next((p for p in path.parents if p.exists()), None)
        if parent is not None and not parent.is_dir():
            errors.append(f"data.store={store!r}: {parent} is a file, so the store's folder cannot be made there")
