"""Checks across keys of GRPO's round economy (issue 33 §2; callbacks/round_economy.py): each key's own type
and range are the schema's (run/validation/schemas/algorithm.py)."""
from __future__ import annotations

from omegaconf import DictConfig

from run.validation.values import is_int, raw


def check_economy(cfg: DictConfig, errors: list[str]) -> None:
    """A screen smaller than the group; refill sizing and the carry only with dynamic sampling; none of them
    with asynchronous rounds (their decisions read the round's rewards, which an engine ahead has not scored)."""
    size, group = raw(cfg, "algorithm.screen.size"), raw(cfg, "algorithm.group_size")
    if is_int(size) and is_int(group) and size >= group:
        errors.append(f"algorithm.screen.size={size} must be less than algorithm.group_size={group} (the screen is "
                      f"the first samples of a group; the rest of it is the expansion)")
    dynamic = raw(cfg, "algorithm.dynamic_sampling")
    for key, off in (("algorithm.refill", "full"), ("algorithm.carry_surplus", False)):
        value = raw(cfg, key)
        if value not in (None, off) and dynamic is False:
            errors.append(f"{key}={str(value).lower()} shapes dynamic sampling's refills: set "
                          f"algorithm.dynamic_sampling=true, or leave {key}={str(off).lower()}")
    staleness = raw(cfg, "callbacks.regenerate.max_staleness")
    on = [k for k, v in (("algorithm.screen.size", size is not None),
                         ("algorithm.stored_success.enabled", raw(cfg, "algorithm.stored_success.enabled") is True)) if v]
    if on and is_int(staleness) and staleness > 0:
        errors.append(f"{on[0]} with callbacks.regenerate.max_staleness={staleness}: it reads the round's rewards "
                      f"while the round is made; use max_staleness=0")
