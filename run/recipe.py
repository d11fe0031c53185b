"""The console line that says which of a stage's values came from the model's recipe (conf/recipe): the
keys whose config value interpolates `recipe.*` (a key set on the command line is no longer one of them).

    [recipe] sft (recipe=pretrained): algorithm.optimizer.lr=2e-05, algorithm.scheduler.num_warmup_steps=0, ...
"""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

SKIPPED = ("run", "hydra", "recipe")


def recipe_keys(cfg: DictConfig) -> list[str]:
    """The dotted keys of `cfg` whose value is written as an interpolation of `recipe.*`."""
    found: list[str] = []

    def walk(node, prefix: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if not (prefix == "" and k in SKIPPED):
                    walk(v, f"{prefix}{k}.")
        elif isinstance(node, str) and "recipe." in node and "${" in node:
            found.append(prefix[:-1])

    walk(OmegaConf.to_container(cfg, resolve=False), "")
    return found


def recipe_line(name: str, cfg: DictConfig) -> str | None:
    """`[recipe] <stage> (recipe=<name>): key=value, ...`, or None when the stage takes nothing from it."""
    values = {k: OmegaConf.select(cfg, k) for k in recipe_keys(cfg)}
    if values.get("trainer.max_epochs") == -1:  # the recipe names no epochs for this algorithm
        del values["trainer.max_epochs"]
    if not values:
        return None
    shown = ", ".join(f"{k}={v}" for k, v in values.items())
    return f"[recipe] {name} (recipe={OmegaConf.select(cfg, 'recipe.name', default='?')}): {shown}"
