"""One W&B run per job that tells the whole story of its stages (docs/wandb.md).

`StageWandbLogger` (conf/logger/wandb.yaml) is Lightning's WandbLogger with:
- every key prefixed with its stage (`sft/train/loss`, `grpo/rollout/reward_mean`), logged with the
  stage's own step (`<stage>/step`: its trainer's global_step, the default x-axis of its metrics) and
  `run_step`, a run-level step that never falls back: the steps of the stages before (summary.json's
  `train/steps`, so it survives a resume) + this stage's global_step;
- the run config: every stage's resolved config nested under its name, with its batch arithmetic
  (from config.yaml when train.py wrote one, the live stage's own from `set_stage_config`);
- the finished stages' summary.json entries in `run.summary`, prefixed (`sft/val/accuracy_after`);
- one run for all stages: a stage's logger reuses the job's live run (same id, `resume: allow`);
- two more axes in every row beside the steps (AXES): `<stage>/cost/generated_tokens`, the stage's generated
  tokens so far (the latest value a round logged, carried into every later row), and
  `<stage>/train/policy_version`, the run-wide version of the weights being trained (records' provenance
  `policy_version`). Rows are logged without an explicit W&B step, so none lands on a committed step and is
  dropped: any metric can be drawn against any axis.

`WandbSamples` (conf/callbacks/default.yaml `samples`) adds, when such a logger is active, on rank 0:
a samples table per round and, at the stage's end, its summary values in `run.summary`.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import lightning as L
from lightning.fabric.utilities.logger import _convert_params
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf


def finished_stages(output_dir) -> dict[str, dict]:
    """summary.json's entries: the stages finished so far, in order ({} before the first ends)."""
    try:
        stages = json.loads((Path(output_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in stages.items() if isinstance(v, dict)}


def earlier_steps(output_dir, stage: str) -> int:
    """Optimizer steps of the stages that finished before `stage`: where its `run_step` starts."""
    total = 0
    for name, metrics in finished_stages(output_dir).items():
        if name == stage:
            break
        total += int(metrics.get("train/steps") or 0)
    return total


def recorded_stage_configs(output_dir) -> dict[str, dict]:
    """Every stage's resolved config as train.py recorded it (config.yaml, then the newest
    config.resume-N.yaml over it); {} outside a train.py run folder."""
    folder = Path(output_dir)
    resumes = sorted(folder.glob("config.resume-*.yaml"),
                     key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
    configs: dict[str, dict] = {}
    for path in [folder / "config.yaml", *resumes[-1:]]:
        if path.is_file():
            configs |= OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return configs


TIME, DATE = re.compile(r"\d\d-\d\d-\d\d"), re.compile(r"\d{4}-\d\d-\d\d")  # Hydra's default dir names


def readable_names(output_dir, group: str | None, name: str | None) -> tuple[str | None, str | None]:
    """(group, name) a person can tell apart, from train.py's (folder names, which under Hydra's
    default dirs are the time of day alone). A sweep job: group `<experiment>-<date>-<time>` (a sweep
    dir named by hand is kept), name `<job num>:<overrides>` as given. A single run: group
    `<experiment>-<date>`, name `<date> <time>` + its command-line overrides."""
    out = Path(output_dir)
    experiment = _recorded(out / ".hydra" / "hydra.yaml", "hydra.runtime.choices.experiment") or "run"
    if group and TIME.fullmatch(group) and out.parent.name == group:  # multirun/<date>/<time>/<job>
        date = out.parent.parent.name
        return f"{experiment}-{date}-{group}" if DATE.fullmatch(date) else f"{experiment}-{group}", name
    if group and group == name == out.name and TIME.fullmatch(group) and DATE.fullmatch(out.parent.name):
        overrides = [o for o in _recorded(out / ".hydra" / "overrides.yaml") or []
                     if not str(o).lstrip("+~").startswith(("hydra.", "resume"))]
        label = f"{out.parent.name} {group.replace('-', ':')}" + (f" {','.join(overrides)}" if overrides else "")
        return f"{experiment}-{out.parent.name}", label[:128]
    return group, name


def _recorded(path: Path, key: str | None = None):
    """A value of a YAML file train.py recorded (the whole file without `key`); None if absent."""
    try:
        node = OmegaConf.load(path)
    except (OSError, ValueError):
        return None
    value = OmegaConf.select(node, key, default=None) if key else node
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _with_arithmetic(config: dict, describe_batch) -> dict:
    """`config` with its batch arithmetic (`describe_batch(cfg)`, given by the spine), when it has one."""
    if describe_batch is None:
        return config
    try:
        return config | {"batch_arithmetic": describe_batch(OmegaConf.create(config))}
    except Exception:  # a config without data/trainer (not a training stage): its keys alone
        return config


class StageWandbLogger(WandbLogger):
    """WandbLogger whose keys carry the stage name and whose steps run on across stages."""

    def __init__(self, stage: str, step_offset: int | None = None, **kwargs):
        kwargs.pop("anonymous", None)
        kwargs["group"], kwargs["name"] = readable_names(kwargs.get("save_dir") or ".", kwargs.get("group"),
                                                         kwargs.get("name"))
        super().__init__(**kwargs)
        self._wandb_init.pop("anonymous", None)  # wandb ≥ 0.19 warns that any value has no effect
        self.stage = stage
        self.step_offset = earlier_steps(self._save_dir or ".", stage) if step_offset is None else int(step_offset)
        self._stage_config: dict | None = None
        self._describe_batch = None
        self._described = False
        self._axes: dict[str, float] = {}  # the latest value of each AXES key, carried into every row

    AXES = ("cost/generated_tokens",)  # carried forward from the row that logged them (+ train/policy_version)

    def set_stage_config(self, cfg: DictConfig, describe_batch=None) -> None:
        """The live stage's config (run/stages.build_loggers): logged resolved, under its name, each
        stage's with `describe_batch(stage_cfg)` (one line of batch arithmetic) when given."""
        self._stage_config = OmegaConf.to_container(cfg, resolve=True)
        self._describe_batch = describe_batch

    @property
    @rank_zero_experiment
    def experiment(self):
        """The job's W&B run: the live one when an earlier stage started it (no 'reuse' warning: that is
        the design), else a new or resumed one (same id). Described once per stage."""
        import wandb
        if self._experiment is None:
            if self._offline:
                os.environ["WANDB_MODE"] = "dryrun"
            if wandb.run is not None:
                self._experiment = wandb.run
            elif getattr(self, "_attach_id", None) is not None and hasattr(wandb, "_attach"):
                self._experiment = wandb._attach(self._attach_id)  # a spawned rank 0 (see WandbLogger)
            else:
                self._experiment = wandb.init(**self._wandb_init)
        if not self._described and hasattr(self._experiment, "define_metric"):
            self._described = True
            self._describe(self._experiment)
        return self._experiment

    def _describe(self, run) -> None:
        run.define_metric("run_step")
        run.define_metric(f"{self.stage}/step")
        run.define_metric(f"{self.stage}/*", step_metric=f"{self.stage}/step")
        for axis in (*self.AXES, "train/policy_version"):  # x-axes beside the step: their last value summarised
            run.define_metric(f"{self.stage}/{axis}", step_metric=f"{self.stage}/step", summary="max")
        configs = recorded_stage_configs(self._save_dir or ".")
        if self._stage_config is not None:
            configs[self.stage] = self._stage_config
        config = {name: _with_arithmetic(c, self._describe_batch) for name, c in configs.items() if isinstance(c, dict)}
        config["stages"] = list(configs)
        run.config.update(config, allow_val_change=True)
        for name, metrics in finished_stages(self._save_dir or ".").items():
            if name != self.stage:
                self.set_summary(metrics, name)

    @rank_zero_only
    def log_metrics(self, metrics, step: int | None = None) -> None:
        step = int(step or 0)
        self._axes |= {k: metrics[k] for k in self.AXES if k in metrics}
        row = {f"{self.stage}/{k}": v for k, v in (self._axes | metrics).items()}
        row[f"{self.stage}/train/policy_version"] = self.step_offset + step  # = the module's policy_version
        self.experiment.log(row | {f"{self.stage}/step": step, "run_step": self.step_offset + step})

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        """A module's save_hyperparameters, if any, under the stage (the resolved config holds them)."""
        params = _convert_params(params)
        if params:
            self.experiment.config.update({self.stage: {"hparams": params}}, allow_val_change=True)
        else:
            self.experiment  # noqa: B018 — start (or join) the run and describe the stage

    @rank_zero_only
    def set_summary(self, metrics: dict, stage: str | None = None) -> None:
        """A stage's summary values (summary.json's entry) in run.summary, prefixed with the stage."""
        stage = stage or self.stage
        self.experiment.summary.update({f"{stage}/{k}": v for k, v in metrics.items()})


def stage_logger(trainer: L.Trainer) -> StageWandbLogger | None:
    return next((lg for lg in trainer.loggers if isinstance(lg, StageWandbLogger)), None)


class WandbSamples(L.Callback):
    """With `logger=wandb`, on rank 0: a `wandb.Table` of `rows_per_round` samples of what each round
    serves (`<stage>/rollout/samples`, every `every_n_rounds` rounds; an offline data module's
    records once, at the stage's first epoch), and at train end the stage's summary values (as
    run/stages.run_stage gathers them: train/steps, every callback's summary(), the last
    train/* values) in run.summary. Rows are picked evenly over the round (fresh groups, then
    replayed ones); no random number is drawn, so a run's course is the same with or without it."""

    def __init__(self, rows_per_round: int = 16, every_n_rounds: int = 1):
        self.rows_per_round, self.every_n_rounds = int(rows_per_round), max(int(every_n_rounds), 1)

    def on_train_epoch_start(self, trainer, pl_module):
        logger = stage_logger(trainer)
        dm = trainer.datamodule
        if logger is None or not trainer.is_global_zero or self.rows_per_round <= 0 or dm is None:
            return
        online = getattr(dm, "online", False)
        epoch = trainer.current_epoch
        if (online and epoch % self.every_n_rounds) or (not online and epoch > 0):
            return
        records = dm.epoch_records() if hasattr(dm, "epoch_records") else []
        if not records:
            return
        n = min(self.rows_per_round, len(records))
        picked = [records[i * len(records) // n] for i in range(n)]
        columns, rows = sample_rows(picked, epoch + 1, trainer.global_step, pl_module.policy_version
                                    if hasattr(pl_module, "policy_version") else trainer.global_step, online)
        import wandb
        logger.log_metrics({"samples": wandb.Table(columns=columns, data=rows)}, step=trainer.global_step)

    def on_train_end(self, trainer, pl_module):
        logger = stage_logger(trainer)
        if logger is None or not trainer.is_global_zero:
            return
        metrics = {"train/steps": trainer.global_step}
        for cb in trainer.callbacks:
            if cb is not self and hasattr(cb, "summary"):
                metrics |= cb.summary()
        metrics |= {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")}
        logger.set_summary(metrics)


def sample_rows(records: list, round_: int, step: int, version: int, online: bool) -> tuple[list[str], list[list]]:
    """(columns, rows) of the samples table: one row per record (a preference pair: its chosen and
    rejected completions in one cell, the chosen one's reward)."""
    sources = sorted({name for r in records for name in (getattr(r, "rewards", None) or {})})
    columns = ["round", "step", "source", "prompt", "completion", "answer", "reward",
               *[f"reward/{s}" for s in sources], "advantage", "policy_version", "staleness"]
    rows = []
    for r in records:
        made = r.provenance.policy_version
        if hasattr(r, "completion_text"):
            completion, reward = r.completion_text, r.reward
        else:  # PreferenceRecord
            completion, reward = f"chosen: {r.chosen_text}\nrejected: {r.rejected_text}", r.chosen_reward
        per_source = getattr(r, "rewards", None) or {}
        rows.append([round_, step, getattr(r, "served_as", "fresh") if online else "dataset",
                     r.prompt_text, completion, r.answer, _num(reward),
                     *[_num(per_source.get(s)) for s in sources], _num(getattr(r, "advantage", None)),
                     made, None if made is None else version - made])
    return columns, rows


def _num(x):
    return None if x is None else float(x)
