"""Routing the command line's key overrides to stages, and what to say when one matches no stage.

A key override goes to the stages whose config has the key. A key *added* with `+key=v` (or `++key=v`
where the key is missing) goes to the stages whose code takes it: the parameters of the nearest
enclosing node's `_target_` (`trainer` is passed to lightning.Trainer), read from its signature, for a
class from the `__init__` of every class up its MRO while each takes **kwargs (up to `object`: then
they are swallowed on the way, and any key goes). An added key no
stage's code takes is refused before anything is built, with the nearest valid key as a suggestion.
"""
from __future__ import annotations

import inspect
from functools import lru_cache

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from run.errors import did_you_mean

# names users bring from TRL / transformers' TrainingArguments (the leaf of a key), and the key that means it here
FOREIGN = {"learning_rate": "algorithm.optimizer.lr", "lr": "algorithm.optimizer.lr",
           "num_train_epochs": "trainer.max_epochs", "max_steps": "trainer.max_steps",
           "per_device_train_batch_size": "data.micro_batch_size",
           "gradient_accumulation_steps": "data.batch_size (records per optimizer step; data.micro_batch_size per "
                                          "forward pass)",
           "beta": "algorithm.beta", "num_generations": "algorithm.group_size",
           "max_completion_length": "generator.max_new_tokens", "max_new_tokens": "generator.max_new_tokens",
           "temperature": "generator.temperature", "num_iterations": "algorithm.epochs_per_round",
           "warmup_steps": "algorithm.scheduler.num_warmup_steps", "weight_decay": "algorithm.optimizer.weight_decay",
           "max_grad_norm": "algorithm.max_grad_norm", "logging_steps": "trainer.log_every_n_steps",
           "model_name_or_path": "model.name_or_path", "output_dir": "hydra.run.dir", "report_to": "logger",
           "group_size": "algorithm.group_size", "batch_size": "data.batch_size"}
KWARGS_NODES = {"trainer": "lightning.Trainer"}  # nodes without _target_ passed as **kwargs to these
HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


@lru_cache(maxsize=None)
def accepted_params(target: str) -> frozenset[str] | None:
    """The keyword parameters `target` takes, or None when it takes any keyword (or is not inspectable)."""
    try:
        obj = get_object(target)
    except Exception:  # noqa: BLE001 - an import error is reported when the node is built
        return None
    chain = [k.__dict__["__init__"] for k in obj.__mro__ if "__init__" in k.__dict__] if inspect.isclass(obj) else [obj]
    names: set[str] = set()
    for fn in chain:
        if fn is object.__init__:  # **kwargs that reach here are swallowed on the way: any key goes
            return None
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            return None
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return frozenset(names)
    return None


def owner(cfg: DictConfig, key: str) -> tuple[str, str, str | None]:
    """(path of the deepest existing node above `key`, the parameter `key` adds to it, that node's target)."""
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):
        path = ".".join(parts[:i])
        node = OmegaConf.select(cfg, path, default=None, throw_on_resolution_failure=False)
        if isinstance(node, DictConfig):
            target = KWARGS_NODES.get(path) or _raw_target(node)
            return path, parts[i], target
    return "", parts[0], None


def _raw_target(node: DictConfig) -> str | None:
    target = OmegaConf.select(node, "_target_", default=None, throw_on_resolution_failure=False)
    return target if isinstance(target, str) else None


def takes(cfg: DictConfig, key: str) -> bool | None:
    """Whether the code the added `key` reaches takes it: True, False, or None (no target to ask)."""
    _, param, target = owner(cfg, key)
    if target is None:
        return None
    params = accepted_params(target)
    return None if params is None else param in params


def foreign_hint(key: str) -> str:
    """'; did you mean `algorithm.optimizer.lr`? (`learning_rate` is TRL's name)' for a key whose leaf is a
    name from TRL / transformers that this config spells another way; '' otherwise."""
    parent, _, leaf = key.rpartition(".")
    here = FOREIGN.get(leaf)
    if here is None or (parent and here.split(" ")[0].endswith("." + leaf)):  # `algoritm.beta`: the node is misspelled
        return ""
    return f"; did you mean `{here.split(' ')[0]}`{here[len(here.split(' ')[0]):]}? (`{leaf}` is TRL's name)"


def has_key(cfg: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None, throw_on_resolution_failure=False) if parent else cfg
    return isinstance(node, DictConfig) and leaf in node.keys()  # keys() includes '???' values


def unmatched_problem(text: str, ov, stages: list[tuple[str, DictConfig]]) -> str:
    """Why override `text` reached no stage, with the nearest valid key when one is close."""
    key = ov.key_or_group
    if ov.is_add() and any(has_key(c, key) for _, c in stages):
        have = [n for n, c in stages if has_key(c, key)]
        return (f"{text}: `{key}` already exists (stage {', '.join(have)}); '+' only adds a new key: write "
                f"++{key}={ov.get_value_element_as_str()} to set it where it exists")
    leaves, full = set(), set()
    for _, cfg in stages:
        path, _, target = owner(cfg, key)
        node = OmegaConf.select(cfg, path, default=None, throw_on_resolution_failure=False) if path else cfg
        if isinstance(node, DictConfig) and path == key.rpartition(".")[0]:
            leaves |= {k for k in node.keys() if k not in HYDRA_KEYS}
            leaves |= set(accepted_params(target) or ()) if target else set()
        full |= set(dotted_keys(cfg))
    hint = foreign_hint(key) or did_you_mean(key, leaves, full)
    names = ", ".join(n for n, _ in stages)
    if ov.is_add() or ov.is_force_add():
        targets = sorted({t for _, c in stages for _, _, t in [owner(c, key)] if t})
        if targets:
            param = owner(stages[0][1], key)[1]
            return f"{text}: {', '.join(targets)} take(s) no `{param}` (stages: {names}){hint}"
    return f"{text}: no stage's config has `{key}` (stages: {names}){hint}"


def dotted_keys(cfg: DictConfig, depth: int = 4) -> list[str]:
    """Every key of `cfg` as a dotted path, nodes included, down to `depth` levels."""
    out: list[str] = []

    def walk(node, prefix: str, level: int) -> None:
        if not isinstance(node, dict) or level > depth:
            return
        for k, v in node.items():
            if k in HYDRA_KEYS or k == "hydra":
                continue
            out.append(f"{prefix}{k}")
            walk(v, f"{prefix}{k}.", level + 1)

    walk(OmegaConf.to_container(cfg, resolve=False), "", 1)
    return out
