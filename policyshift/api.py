"""`policyshift.train(overrides, output_dir, reward_fn, model, tokenizer, train_dataset)`: compose conf/train.yaml with Hydra's compose API,
check the overrides as train.py's command line is checked (run/command_line.py), then run train.py's own
job (`run_job`: the run folder's lock, the plan-time checks of every stage, the stage loop, summary.json);
returns the summary (summary.json's {stage: metrics}).

A bad override or config raises the project's error (run/errors.py: ConfigError, DataFileError, ...)
whose message is the line `python train.py` prints after `error: `; nothing calls sys.exit. Hydra-only
features stay on the command line: sweeps (`-m`), `hydra.*` overrides (the run folder is `output_dir`).
Importing policyshift sets train.py's environment defaults (W&B offline, HF_HUB_OFFLINE=1, ...) where
unset: set HF_HUB_OFFLINE=0 before importing it to let a run download Hub ids. A model object and a dataset object are written to the run folder and pointed at
(policyshift/inputs.py), as TRL's trainers take them.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

import train as train_py  # first: its environment defaults (offline W&B and Hub) before any other import
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser

from policyshift.inputs import data_overrides, model_overrides
from rewards import in_process
from run.command_line import CONF_DIR, command_line_problem, with_default_data
from run.errors import ConfigError
from run.launch import needs_launch

LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's job log file's


def main() -> None:
    """The `policyshift` console script: `python train.py` with the same arguments."""
    train_py.cli()


def train(overrides: Iterable[str] = (), output_dir: str | Path | None = None,
          reward_fn: Callable | None = None, model=None, tokenizer=None, train_dataset=None) -> dict[str, dict]:
    """Run the job `python train.py *overrides hydra.run.dir=output_dir` runs, in this process; returns
    summary.json's {stage: metrics}. `output_dir`: None makes outputs/<date>/<time> as Hydra does.
    `reward_fn`: fn(prompts, completions, examples) -> list[float | None], the reward=function source's
    `reward.fn` (reward=function is chosen when no reward= is given).
    `model`: a model folder or Hub id (model=hf model.name_or_path=model), or a transformers PreTrainedModel,
    saved with `tokenizer` (default: the tokenizer of its name_or_path folder) to <output_dir>/inputs/model
    and loaded from there: the run trains a copy, never the object itself.
    `train_dataset`: a datasets.Dataset (or a list of row dicts, or a file path) in one of TRL's formats
    (docs/datasets.md), written to <output_dir>/inputs/train.jsonl; the stage's data source reads it:
    data.path for data=conversations and data=static_preferences, else task=jsonl task.train_path. Text or
    messages rows with no data= given choose data=conversations."""
    overrides = [str(o) for o in overrides]
    if reward_fn is not None:
        overrides = with_reward_fn(overrides, reward_fn)
    _refuse_outside_one_job(overrides)
    out = Path(output_dir or Path("outputs") / time.strftime("%Y-%m-%d/%H-%M-%S")).resolve()
    with _config_dir():
        _checked(overrides)  # before anything is written
        overrides = model_overrides(model, tokenizer, overrides, out) + overrides
        overrides = _checked(data_overrides(train_dataset, overrides, out, _checked,
                                            lambda ovs: compose("train", overrides=ovs)))
        cfg = compose("train", overrides=overrides)
        if reward_fn is not None and needs_launch(cfg.trainer):
            raise ConfigError("reward_fn= lives in this process, and a job of several ranks runs each rank in a "
                              "process of its own (torchrun): name the function by import path instead, "
                              "reward=function reward.fn._target_=my_module.my_score")
        try:
            if cfg.get("print_config"):
                return train_py.print_stages(cfg, overrides, out, out.name, out.name)
            with _log_file(out):
                return train_py.run_job(cfg, overrides, out, out.name, out.name)
        finally:
            train_py.finish_wandb()


def _checked(overrides: list[str]) -> list[str]:
    """The overrides with the algorithm's default data (with_default_data), checked as train.py checks its
    command line: the first problem raises ConfigError."""
    overrides = with_default_data(overrides)
    problem = command_line_problem(overrides)
    if problem:
        raise ConfigError(problem)
    return overrides


def with_reward_fn(overrides: list[str], fn: Callable) -> list[str]:
    """`overrides` with reward=function (unless chosen) and its reward.fn pointed at `fn`, registered in
    rewards/in_process.py; any other reward group, or a reward.fn of the overrides' own, is refused."""
    target = in_process.register(fn)
    chosen = [o for o in overrides if o.split("=")[0].lstrip("+~") == "reward"]
    if chosen and chosen[-1].split("=", 1)[-1] != "function":
        raise ConfigError(f"reward_fn= is reward=function's reward.fn, but the overrides choose {chosen[-1]}: "
                          f"drop it (or write reward=function)")
    own = [o for o in overrides if o.split("=")[0].lstrip("+~").startswith("reward.fn")]
    if own:
        raise ConfigError(f"reward_fn= sets reward.fn; the overrides set it too ({own[0]}): keep one")
    return overrides + ([] if chosen else ["reward=function"]) + [f"reward.fn._target_={target}"]


def _refuse_outside_one_job(overrides: list[str]) -> None:
    """Sweeps and hydra.* settings are the command line's (Hydra's launcher and run folder)."""
    for text, ov in zip(overrides, OverridesParser.create().parse_overrides(overrides)):
        if ov.key_or_group.split(".")[0].split("/")[0] == "hydra":
            raise ConfigError(f"{text}: policyshift.train runs one job in this process with no Hydra settings; "
                              f"the run folder is output_dir= (hydra.* is for python train.py)")
        if ov.is_sweep_override():
            raise ConfigError(f"{text}: a sweep runs from the command line (python train.py -m {text}); "
                              f"policyshift.train runs one job: call it once per value")


@contextmanager
def _config_dir() -> Iterator[None]:
    """Hydra initialised on conf/ for the run (stages compose from it), the caller's Hydra put back after."""
    outer = GlobalHydra.instance().is_initialized()
    if outer:
        saved = GlobalHydra.instance().hydra
        GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONF_DIR), job_name="train", version_base="1.3"):
            yield
    finally:
        if outer:
            GlobalHydra.instance().clear()
            GlobalHydra.instance().initialize(saved)


@contextmanager
def _log_file(out: Path) -> Iterator[None]:
    """<out>/train.log as Hydra's job logging writes it for train.py (the run folder's lock then owns it:
    a run that fails before its first step leaves the folder as it found it)."""
    out.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / "train.log")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        handler.close()
