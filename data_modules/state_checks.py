"""Checks of the state a checkpoint hands a component (data module, buffer, adaptive policy, callback).

A resume trusts nothing it reads: every component checks its state (types, ranges, references between
its parts) before it takes any of it, and refuses with StateError naming the key inside its state
(`cursor`, `buffer.latest_ids[2]`); the spine (run/stages.py) adds the checkpoint's file. A NaN count,
a cursor far past the stream, an id that refers to nothing, an RNG state of the wrong size: each would
otherwise be taken silently and train other weights, or fail later with a message about something else.
"""
from __future__ import annotations

import math
import random
from collections.abc import Mapping
from contextlib import contextmanager


class StateError(ValueError):
    """A component's checkpointed state is not one it could have written: `key` and why."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")
        self.key, self.problem = key, problem


@contextmanager
def within(prefix: str):
    """A StateError raised in the block names its key under `prefix` (where the state sits in the checkpoint)."""
    try:
        yield
    except StateError as e:
        raise StateError(f"{prefix}.{e.key}", e.problem) from None


def field(state, key: str, where: str = ""):
    """state[key], or StateError naming `where.key` when `state` is not a mapping or lacks it."""
    name = f"{where}.{key}" if where else key
    if not isinstance(state, Mapping):
        raise StateError(where or key, f"a {type(state).__name__}, not a mapping")
    if key not in state:
        raise StateError(name, "missing")
    return state[key]


def integer(value, key: str, low: int = 0, high: int | None = None) -> int:
    """An int (not a bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise StateError(key, f"{value!r} is not an integer")
    if value < low or (high is not None and value > high):
        raise StateError(key, f"{value} is out of range [{low}, {'∞' if high is None else high}]")
    return value


def number(value, key: str, low: float | None = 0.0, high: float | None = None, nan: bool = False) -> float:
    """A finite int or float (not a bool) in [low, high]; NaN only where `nan` allows it (never ±inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise StateError(key, f"{value!r} is not a number")
    if value != value:
        if nan:
            return value
        raise StateError(key, "NaN")
    if math.isinf(value) or (low is not None and value < low) or (high is not None and value > high):
        raise StateError(key, f"{value} is out of range [{'-∞' if low is None else f'{low:g}'}, "
                              f"{'∞' if high is None else f'{high:g}'}]")
    return value


def sequence(value, key: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise StateError(key, f"a {type(value).__name__}, not a list")
    return list(value)


def mapping(value, key: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise StateError(key, f"a {type(value).__name__}, not a mapping")
    return value


def one_of(value, key: str, allowed) -> object:
    if value not in allowed:
        raise StateError(key, f"{value!r} is not one of {sorted(map(str, allowed))}")
    return value


def metrics(value, key: str) -> None:
    """None, or a mapping of metric names to numbers (NaN allowed: a metric with nothing to average)."""
    if value is not None:
        for name, v in mapping(value, key).items():
            number(v, f"{key}.{name}", low=None, nan=True)


def python_rng(value, key: str) -> tuple:
    """A random.Random state (tuples may come back as lists), as a tuple random.setstate takes."""
    state = _as_tuple(value)
    try:
        random.Random().setstate(state)
    except (TypeError, ValueError, OverflowError) as e:
        raise StateError(key, f"not a Python random state ({e})") from None
    return state


def _as_tuple(x):
    return tuple(_as_tuple(v) for v in x) if isinstance(x, (list, tuple)) else x
