"""Epochs of a static-data stage: `trainer.max_epochs=N` makes SFT, DPO, IPO, KTO and reward-model stages
run N passes over their training data. At plan time the stage's records are counted (demonstrations:
data.max_examples or the task's training examples; preference files: the rows that parse, less the
held-out ones; KTO: two records a pair), and trainer.max_steps becomes N × the optimizer steps of one pass,
so the learning-rate schedule (num_training_steps: ${trainer.max_steps}), the progress bar and every
callback count the real length. Rollout stages keep Lightning's meaning: an epoch is a round.

Which wins: a trainer.max_steps on the command line alone turns the epochs off (the recipe's too); both
on the command line: the smaller; otherwise trainer.max_epochs > 0 replaces the config's step count
(model=hf's recipe runs SFT for 3 epochs, whatever step count an experiment wrote for the tiny model).
"""
from __future__ import annotations

import math

from omegaconf import DictConfig, open_dict

from data_modules.demonstrations import demonstration_examples
from hardware.processes import world_size_of
from run.errors import ConfigError
from run.validation.values import raw
from tasks.base import Task

DEMONSTRATIONS = "data_modules.demonstrations.DemonstrationsDataModule"


def steps_per_epoch(records: int, batch_size: int, world: int = 1) -> int:
    """Optimizer steps of one pass: the loader serves every record once, in batches of `batch_size`, the
    last one short (the records cut to a multiple of the ranks first: data_modules/base.py)."""
    return math.ceil(records // world * world / batch_size)


def plan_epochs(name: str, cfg: DictConfig, task: Task, records: int | None, user_keys: set[str]) -> str | None:
    """Set stage `name`'s trainer.max_steps from its epochs (see the module's docstring); `records`: its
    training records per epoch for preference data (None: not counted). A console line saying what was
    set, or None when the stage runs by steps."""
    epochs = raw(cfg, "trainer.max_epochs")
    if "trainer.max_steps" in user_keys and "trainer.max_epochs" not in user_keys:
        _set(cfg, max_epochs=-1)  # the user's step count; the recipe's epochs step aside
        return None
    if not isinstance(epochs, int) or epochs < 1 or "prompts_per_round" in cfg.data:  # rollouts: epoch = round
        return None
    records = _records(name, cfg, task, records, epochs)
    batch = int(raw(cfg, "data.batch_size"))
    per_epoch = steps_per_epoch(records, batch, world_size_of(cfg.trainer))
    if per_epoch == 0:
        _refuse(name, f"trainer.max_epochs={epochs}: the stage has no training records ({records} usable)")
    steps, was = epochs * per_epoch, raw(cfg, "trainer.max_steps")
    if "trainer.max_steps" in user_keys:  # both given: Lightning stops at the first limit reached
        steps = min(steps, was)
    _set(cfg, max_steps=steps)
    short = ", the last batch short" if records % batch else ""
    return (f"[epochs] {name}: trainer.max_epochs={epochs} × {per_epoch:,} steps per epoch ({records:,} records "
            f"/ data.batch_size={batch}{short}) → trainer.max_steps={steps:,}"
            + (f" (was {was:,})" if was != steps else "") + "; the schedule decays over them")


def _records(name: str, cfg: DictConfig, task: Task, records: int | None, epochs: int) -> int:
    """The stage's training records per epoch: demonstrations counted here, preference data's given."""
    if raw(cfg, "data._target_") == DEMONSTRATIONS:
        return len(demonstration_examples(task, raw(cfg, "data.max_examples")))
    if records is None:
        _refuse(name, f"trainer.max_epochs={epochs}: data={raw(cfg, 'data._target_')} does not know its training "
                      f"records before the stage runs, so epochs cannot set its length: give trainer.max_steps=N")
    return records


def _refuse(name: str, problem: str) -> None:
    raise ConfigError(f"stage {name!r}: {problem}", problems=[problem], where=f"stage {name}")


def _set(cfg: DictConfig, **values) -> None:
    with open_dict(cfg):
        for key, value in values.items():
            cfg.trainer[key] = value
