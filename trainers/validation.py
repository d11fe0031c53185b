"""Checks on a composed config before anything heavy is built. Every message names the key at fault."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    pass


def _get(cfg: DictConfig, key: str):
    return OmegaConf.select(cfg, key, default=None)


def _positive(cfg: DictConfig, key: str, errors: list[str]) -> None:
    value = _get(cfg, key)
    if value is not None and (not isinstance(value, (int, float)) or value <= 0):
        errors.append(f"{key}={value!r} must be a positive number")


def validate(cfg: DictConfig, stage: str) -> None:
    """Raise ConfigError listing every problem found in stage `stage`'s config."""
    errors: list[str] = []
    for key in ("algorithm.group_size", "algorithm.epochs_per_round", "data.batch_size",
                "data.prompts_per_round", "trainer.max_steps", "generator.max_new_tokens",
                "generator.temperature"):
        _positive(cfg, key, errors)
    group, prompts, batch = (_get(cfg, k) for k in
                             ("data.group_size", "data.prompts_per_round", "data.batch_size"))
    if not errors and prompts is not None and group is not None:
        if group < 2 and "grpo" in str(_get(cfg, "algorithm._target_")).lower():
            errors.append(f"algorithm.group_size={group}: group-relative advantages need at least 2")
        if (prompts * group) % batch:
            errors.append(
                f"data.prompts_per_round × algorithm.group_size = {prompts} × {group} = {prompts * group}"
                f" records per round is not divisible by data.batch_size={batch}")
    if _get(cfg, "algorithm.beta") is not None and cfg.algorithm.beta < 0:
        errors.append(f"algorithm.beta={cfg.algorithm.beta} must be ≥ 0")
    if errors:
        raise ConfigError(f"invalid config for stage {stage!r}:\n  - " + "\n  - ".join(errors))
