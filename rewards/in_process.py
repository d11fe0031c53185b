"""Reward functions handed over as Python objects (`policyshift.train(reward_fn=my_score)`), not by an
import path: each is registered here under a name, and `reward=function`'s node points at it like at any
other function (`reward.fn._target_=rewards.in_process.my_score`), so it reaches FunctionReward, the
plan-time checks and the run's record exactly as a `_target_` typed on the command line does.

A registered name lives as long as this process: a run whose record names one resumes through
`policyshift.train(..., reward_fn=the same function)`, not from `python train.py` (its plan-time check
then says `rewards.in_process has no `<name>``).
"""
from __future__ import annotations

import re
from typing import Callable

_registered: dict[str, Callable] = {}


def register(fn: Callable) -> str:
    """Make `fn` importable as `rewards.in_process.<its name>`; returns that dotted path. A later function
    of the same name replaces an earlier one (one run at a time reads it)."""
    if not callable(fn):
        raise TypeError(f"reward_fn must be a function fn(prompts, completions, examples) -> list[float | None], "
                        f"got {fn!r}")
    name = getattr(fn, "__name__", None) or type(fn).__name__
    name = re.sub(r"\W", "_", name).strip("_") or "reward_fn"
    name = name if name[0].isalpha() else f"fn_{name}"
    _registered[name] = fn
    return f"{__name__}.{name}"


def __getattr__(name: str) -> Callable:  # `from rewards.in_process import x`, Hydra's _locate, hasattr
    try:
        return _registered[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no reward function {name!r} registered in this process "
                             f"(pass it again: policyshift.train(..., reward_fn=...))") from None
