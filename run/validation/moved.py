"""`_target_` paths that moved when the code was given its rooms (issue 18: run/, generators/, tasks/,
hardware/). A config saved before then (an experiment file, a copied config.yaml, a command line)
that names an old path gets an error naming the new one, instead of Hydra's "cannot import"."""
from __future__ import annotations

import importlib

from omegaconf import DictConfig, OmegaConf

MOVED = {  # old module → new module (the names inside are unchanged)
    "trainers.pipeline": "run.stages",
    "trainers.launch": "run.launch",
    "trainers.command_line": "run.command_line",
    "trainers.overrides": "run.overrides",
    "trainers.validation": "run.validation.config",
    "trainers.value_checks": "run.validation.values",
    "trainers.data_checks": "run.validation.data",
    "trainers.run_record": "run.run_record",
    "trainers.checkpointing": "run.checkpointing",
    "trainers.errors": "run.errors",
    "trainers.distributed": "hardware.distributed",
    "models.model_card": "run.model_card",
    "models.sharding": "hardware.sharding",
    "models.memory": "hardware.memory",
    "models.generation": "generators.hf",
    "models.vllm_generator": "generators.vllm",
    "data_modules.tasks": "tasks",
}


def moved_target(target: str) -> str | None:
    """The new path of an old `_target_` (`models.generation.HFGenerator` → `generators.hf.HFGenerator`),
    or None when `target` did not move."""
    for old, new in MOVED.items():
        if target == old or target.startswith(old + "."):
            return new + target[len(old):]
    return None


def check_moved_targets(cfg: DictConfig, errors: list[str]) -> None:
    """One error per `_target_` in `cfg` (read without resolving) that names a moved path, or that cannot be
    imported (instead of Hydra's "Error locating target" after the run has started)."""
    _walk(OmegaConf.to_container(cfg, resolve=False), "", errors)


def _walk(node, prefix: str, errors: list[str]) -> None:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        target = key == "_target_" and isinstance(value, str) and "${" not in value
        new = moved_target(value) if target else None
        why = None if new or not target else unimportable(value)
        if new:
            errors.append(f"{prefix}{key}={value}: that path moved to {new} (set {prefix}{key}={new})")
        elif why:
            errors.append(f"{prefix}{key}={value}: {why}")
        elif key != "hydra":
            _walk(value, f"{prefix}{key}.", errors)


def unimportable(path: str) -> str | None:
    """Why dotted `path` (module.attr...) cannot be imported, or None when it can."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):  # the longest importable module prefix, then attributes
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and not module.startswith(e.name):  # the module exists but an import inside it fails
                return f"importing {module} failed: {e}"
            continue
        except Exception as e:  # noqa: BLE001 - the user's module raised while importing
            return f"importing {module} failed: {type(e).__name__}: {e}"
        for i, attr in enumerate(parts[cut:]):
            if not hasattr(obj, attr):
                return f"{'.'.join(parts[:cut + i])} has no `{attr}`"
            obj = getattr(obj, attr)
        return None
    return f"no module named {parts[0]!r} (is it installed, or is the checkout on PYTHONPATH?)"
