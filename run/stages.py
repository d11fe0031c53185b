"""Stages: compose each stage's config, validate all of them, then build and fit one after another.

A stage's config = the base config + the stage's overrides + the user's command line (the user wins).
A user key override (`algorithm.beta=0`) goes to the stages whose config has that key, and must match
at least one. A key that exists only in a later stage's group (e.g. `data.max_examples` of the SFT
stage's demonstrations) is written `++data.max_examples=50`, since Hydra first composes the base
config. Naming `algorithm=` or `data=` without `experiment=` runs that one algorithm alone.
"""
from __future__ import annotations

import pickle
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import lightning as L
from hydra import compose
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from data_modules.state_checks import StateError
from hardware import distributed
from hardware.console import say0
from hardware.processes import launched, world_size_of
from run.checkpointing import (AtomicCheckpointIO, CheckpointReadError, ResumeState, load_checkpoint,
                               unsafe_checkpoint, use_stage_end_loop)
from run.epochs import plan_epochs
from run.errors import ConfigError
from run.overrides import has_key, takes, unmatched_problem
from run.recipe import recipe_line
from run.validation.config import validate
from run.validation.conversation_data import conversation_records
from run.validation.data import check_stage_data
from run.validation.harvest_data import check_harvest
from run.validation.preference_data import preference_records
from run.validation.schemas import stage_list_problems
from run.validation.values import budget_warning, cpu_bf16_note, warmup_warning
from tasks.jsonl import DataFileError

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
STAGE_GROUPS = ("algorithm", "data")


@dataclass
class Stage:
    name: str
    cfg: DictConfig
    task: object = None
    user_keys: frozenset = frozenset()  # the keys the command line set in this stage (run/epochs.py)


def _split(user_overrides: list[str]) -> tuple[list[str], list]:
    """(group-choice overrides, parsed key overrides) from the user's command line."""
    groups, keys = [], []
    for text, ov in zip(user_overrides, OverridesParser.create().parse_overrides(user_overrides)):
        key = ov.key_or_group
        if "." not in key and (CONF_DIR / key).is_dir():
            groups.append(text)
        else:
            keys.append((text, ov))
    return groups, keys


def _applies(cfg: DictConfig, ov) -> bool:
    """Whether key override `ov` goes to the stage whose config is `cfg` (see run/overrides.py)."""
    key = ov.key_or_group
    if ov.is_add():  # '+key': a new key, for the stages whose code takes it (or whose node has no target)
        return not has_key(cfg, key) and takes(cfg, key) is not False
    if ov.is_force_add():  # '++key': set where it exists, added where the code takes it
        return has_key(cfg, key) or takes(cfg, key) is True
    return has_key(cfg, key)


def _adds(ov) -> bool:
    return ov.is_add() or ov.is_force_add()


def _refuse_ignored_stages(single: bool, groups: list[str], keys: list) -> None:
    """`stages=[...]` with `algorithm=` (or `data=`) and no experiment would run the one algorithm alone and
    drop the stages without a word."""
    given = [text for text, ov in keys if ov.key_or_group == "stages"]
    if single and given and groups:
        chosen = " ".join(g for g in groups if g.split("=")[0].lstrip("+~") in STAGE_GROUPS)
        raise ConfigError(f"{given[0]} is not run: {chosen} without experiment= runs that one algorithm alone; "
                          f"put {chosen} in each stage's overrides, or drop the stages")


def plan_stages(cfg: DictConfig, user_overrides: list[str], config_name: str = "train") -> list[Stage]:
    """Compose and validate every stage's config (no model is built here)."""
    groups, keys = _split(user_overrides)
    chosen = {g.split("=")[0].lstrip("+~") for g in groups}
    single = not cfg.stages or (chosen & set(STAGE_GROUPS) and "experiment" not in chosen)
    _refuse_ignored_stages(single and bool(cfg.stages), groups, keys)
    bad = [] if single else stage_list_problems(cfg)
    if bad:
        raise ConfigError("; ".join(bad), problems=bad)
    if single and "data" not in chosen:  # algorithm=sft alone → its own data source
        groups.append(f"data={cfg.algorithm.default_data}")
    specs = [{"name": None, "overrides": []}] if single else list(cfg.stages)
    stages, used = [], set()
    for spec in specs:
        base = list(spec["overrides"]) + groups + (["experiment=single"] if single else [])
        probe = compose(config_name, overrides=base)
        mine = [text for text, ov in keys if not _adds(ov) and _applies(probe, ov)]
        if mine and any(_adds(ov) for _, ov in keys):  # decide added keys with the set ones in place
            probe = compose(config_name, overrides=base + mine)
        mine = [text for text, ov in keys if text in mine or (_adds(ov) and _applies(probe, ov))]
        used.update(mine)
        scfg = compose(config_name, overrides=base + mine) if mine else probe
        name = spec["name"] or scfg.algorithm.name
        validate(scfg, name)
        stages.append(Stage(name, scfg, user_keys=frozenset(ov.key_or_group.lstrip("+~") for text, ov in keys
                                                            if text in mine)))
    unused = [unmatched_problem(text, ov, [(s.name, s.cfg) for s in stages]) for text, ov in keys if text not in used]
    if unused:
        raise ConfigError("; ".join(unused), problems=unused)
    for stage in stages:  # cheap, and catches missing/malformed task files before any model
        try:
            stage.task = instantiate(stage.cfg.task)
        except InstantiationException as e:  # show the file:line message, not Hydra's wrapper
            cause = e.__cause__ or e
            named = isinstance(cause, DataFileError)  # already names the file and line
            raise ConfigError(str(cause) if named else f"task ({stage.cfg.task._target_}): {cause}") from e.__cause__
    tokenizers: dict = {}  # the data against each stage's model context and reward (no weights loaded)
    for stage in stages:
        check_stage_data(stage.name, stage.cfg, stage.task, tokenizers)
        check_harvest(stage.name, stage.cfg, tokenizers)  # a store's ids, lengths, finite numbers; no model
    for stage in stages:  # every stage's preference and conversation files, before the first stage trains
        records = preference_records(stage.name, stage.cfg, stage.task)
        if records is None:
            records = conversation_records(stage.name, stage.cfg, tokenizers)
        note = plan_epochs(stage.name, stage.cfg, stage.task, records, stage.user_keys)
        if note:
            say0(note)
    _warn(stages)
    return stages


def _warn(stages: list[Stage]) -> None:
    """One line on stderr (rank 0) for each stage setting that is allowed but likely not meant."""
    for stage in stages:
        for note in (warmup_warning(stage.cfg), budget_warning(stage.cfg), cpu_bf16_note(stage.cfg)):
            if note and distributed.is_zero():
                print(f"warning: stage {stage.name}: {note}", file=sys.stderr, flush=True)


def set_run_fields(cfg: DictConfig, output_dir: Path, stage: str, group: str, name: str,
                   wandb_id: str | None = None) -> None:
    """cfg.run: where the stage writes, and its W&B group/name/id (None: W&B picks one)."""
    with open_dict(cfg):
        cfg.run = {"output_dir": str(output_dir), "stage": stage, "group": group, "name": name,
                   "wandb_id": wandb_id}


def batch_arithmetic(cfg: DictConfig) -> str:
    """One line: how a stage's records reach an optimizer step, over `world` ranks. An algorithm that keeps
    only some of a round's samples (online DPO's one pair per prompt: trainers/base.py kept_per_group) is
    counted in what it keeps, at most; a round's last, partial batch is a step too."""
    data, world = cfg.data, world_size_of(cfg.trainer)
    batch = int(data.batch_size)
    prompts, group = int(data.get("prompts_per_round", 0)), int(data.get("group_size", 0))
    kept = _kept_per_group(cfg.algorithm) if prompts else None
    unit = kept[1] if kept else "records"
    micro = min(int(data.get("micro_batch_size") or batch), batch // world) or 1
    accumulation = max(batch // world // micro, 1)
    step = f"micro-batch {micro} × accumulation {accumulation} × {world} rank(s) = {batch} {unit} per optimizer step"
    if not prompts:
        return step
    records, passes = prompts * group, int(data.get("epochs_per_round", 1))
    line = f"{prompts} prompts per round × {group} samples = {records} records per round, {records / world:g} per rank"
    if kept is None:
        return f"{line}; {step}; {passes * records // batch} optimizer steps per round"
    most = prompts * kept[0]
    return (f"{line}; at most {most} {unit} kept ({kept[0]} per prompt); {step}; at most "
            f"{-(-passes * most // batch)} optimizer steps per round ({passes} passes)")


def _kept_per_group(algorithm: DictConfig) -> tuple[int, str] | None:
    """The algorithm class's `kept_per_group` (trainers/base.py), from its config node's `_target_`."""
    try:
        cls = get_class(algorithm._target_)
    except Exception:  # an unimportable target is reported by validation, not by this line
        return None
    return getattr(cls, "kept_per_group", lambda node: None)(algorithm)


def print_batch_arithmetic(stages: list[Stage]) -> None:
    """Each stage's batch arithmetic, and the values it takes from the model's recipe (run/recipe.py)."""
    for stage in stages:
        say0(f"[batch] {stage.name}: {batch_arithmetic(stage.cfg)}")
        line = recipe_line(stage.name, stage.cfg)
        if line:
            say0(line)


def build(node: DictConfig, **runtime):
    """Instantiate `node` with live objects (models, tasks) passed as-is: Hydra would otherwise copy
    keyword arguments into its config tree, converting dataclasses and lists element by element."""
    return instantiate(node, _partial_=True)(**runtime)


def build_env(cfg: DictConfig):
    """The stage's environment factory (env=calculator, ...), or None for env=none (one turn)."""
    node = cfg.get("env")
    return instantiate(node) if node else None


def build_callbacks(cfg: DictConfig, generator, reward, task, env=None) -> list[L.Callback]:
    runtime = {"regenerate": {"generator": generator, "reward": reward, "env": env},
               "evaluate": {"generator": generator, "task": task, "reward": reward, "env": env}}
    return [build(node, **runtime.get(key, {})) for key, node in cfg.callbacks.items() if node is not None]


def build_loggers(cfg: DictConfig) -> list:
    """The stage's loggers; one that logs the stage's config (callbacks/wandb_run.py) is given it, and
    how to describe a stage's batch arithmetic (a callback may not import the spine)."""
    loggers = [instantiate(node) for node in cfg.logger.values() if node is not None]
    for logger in loggers:
        getattr(logger, "set_stage_config", lambda stage_cfg, describe: None)(cfg, batch_arithmetic)
    return loggers


def trainer_arguments(trainer: DictConfig) -> dict:
    """L.Trainer's keyword arguments from `trainer` (conf/hardware): a strategy given as a node with a
    `_target_` (FSDP2, DeepSpeed) is built here. The data modules shard by rank themselves
    (data_modules/base.py), so Lightning's DistributedSampler stays out."""
    kwargs = OmegaConf.to_container(trainer, resolve=True)
    strategy = kwargs.get("strategy")
    if isinstance(strategy, dict):
        if strategy.get("data_parallel_size") == "auto":  # ModelParallelStrategy's "auto" = num_nodes
            strategy["data_parallel_size"] = world_size_of(trainer) // int(strategy.get("tensor_parallel_size") or 1)
        kwargs["strategy"] = instantiate(strategy)
    return kwargs | {"use_distributed_sampler": False}


class SameSettingsOnRanks(L.Callback):
    """Every rank checks, once the process group is up, that all ranks run this stage with the same
    settings (a hash of the config as composed, interpolations unresolved, `run.*` aside: rank 0 alone
    holds the W&B id): a launcher that gave ranks different overrides fails here, before a step."""

    def __init__(self, cfg: DictConfig):
        settings = {k: v for k, v in OmegaConf.to_container(cfg, resolve=False).items() if k != "run"}
        self.text = OmegaConf.to_yaml(OmegaConf.create(settings))

    def setup(self, trainer, pl_module, stage: str) -> None:
        distributed.check_same_config(self.text, "stage setting")


def checkpoint_dir(stage: Stage) -> Path:
    return Path(stage.cfg.run.output_dir) / "checkpoints" / stage.name


def load_finished_policy(stage: Stage):
    """(policy, tokenizer) as a finished stage left them: its final.ckpt's policy weights (for resume;
    a weights-only checkpoint, run/checkpointing.py)."""
    path = checkpoint_dir(stage) / "final.ckpt"
    if not path.is_file():
        raise ConfigError(f"resume: stage {stage.name!r} is in summary.json but {path} is missing")
    checkpoint = load_checkpoint(path)  # the safe loader: a pickled object in a run folder never runs
    if not isinstance(checkpoint.get("state_dict"), dict):
        raise CheckpointReadError(f"resume: {path} has no state_dict (not a checkpoint this project wrote)")
    state = checkpoint["state_dict"]
    policy, tokenizer = instantiate(stage.cfg.model)
    policy.load_state_dict({k.removeprefix("policy."): v for k, v in state.items() if k.startswith("policy.")})
    return policy, tokenizer


class FirstStep(L.Callback):
    """Calls `fn` once, after the first optimizer step this fit takes (first among the callbacks: before
    a signal's checkpoint at that step, so the run's record is there before any checkpoint)."""

    def __init__(self, fn):
        self.fn, self.start = fn, 0

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = trainer.global_step  # a resumed fit starts at its checkpoint's step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.fn is not None and trainer.global_step > self.start:
            fn, self.fn = self.fn, None
            fn()


def model_name(node: DictConfig) -> str:
    """What records name as their model: model.name_or_path, or for a model built in code its builder
    and settings (`models.tiny.build_tiny(hidden_size=128, ..., seed=0)`: they fix its starting weights)."""
    if node.get("name_or_path"):
        return str(node.name_or_path)
    plain = {k: v for k, v in OmegaConf.to_container(node, resolve=True).items()
             if k != "_target_" and v is not None and not isinstance(v, (dict, list))}
    return f"{node._target_}({', '.join(f'{k}={v}' for k, v in plain.items())})"


def run_stage(stage: Stage, policy=None, tokenizer=None, ckpt_path: Path | None = None, on_first_step=None,
              version_offset: int = 0):
    """Build everything for one stage and fit it (from `ckpt_path` when resuming: weights, optimizer,
    scheduler, data position, buffer, callback state, RNG states); returns (policy, tokenizer, summary
    metrics). The final weights go to checkpoints/<stage>/final.ckpt, so a resumed run can skip this
    stage. SIGTERM/SIGINT during training write checkpoints/<stage>/last.ckpt and raise RunInterrupted.
    `on_first_step`: called once after the fit's first optimizer step (train.py records the run there).
    `version_offset`: the optimizer steps of the run's earlier stages (policy versions count across stages)."""
    cfg, start = stage.cfg, time.perf_counter()
    if world_size_of(cfg.trainer) > 1 and not launched():  # never Lightning's own launcher (sys.argv replay)
        raise RuntimeError("several ranks asked for in a process that no launcher started: train.py starts "
                           "them (run/launch.py); call run_stage from each rank")
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    if policy is None:
        policy, tokenizer = instantiate(cfg.model)
    generator = instantiate(cfg.generator)
    reward = instantiate(cfg.reward)
    datamodule = build(cfg.data, task=stage.task, tokenizer=tokenizer)
    module = build(cfg.algorithm, policy=policy, tokenizer=tokenizer)
    module.set_identity(model_name(cfg.model), cfg.run.get("wandb_id"), version_offset)  # records' provenance
    callbacks = [FirstStep(on_first_step)] if on_first_step else []
    callbacks += build_callbacks(cfg, generator, reward, stage.task, build_env(cfg))
    callbacks += [ResumeState(checkpoint_dir(stage) / "last.ckpt"), SameSettingsOnRanks(cfg)]
    trainer = L.Trainer(**trainer_arguments(cfg.trainer), callbacks=callbacks, logger=build_loggers(cfg) or False,
                        default_root_dir=cfg.run.output_dir, plugins=[AtomicCheckpointIO()])
    use_stage_end_loop(trainer)  # a resume from the stage's last checkpoint still runs the stage's end
    if ckpt_path is None:  # the stage from its beginning: its metrics file too (a checkpoint says how many rows stay)
        for logger in trainer.loggers:
            getattr(logger, "keep_rows", lambda rows: None)(0)
    try:  # the safe loader (tensors and plain types), whatever TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD says
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except pickle.UnpicklingError as e:  # only a checkpoint is unpickled in fit: the resumed one
        raise CheckpointReadError(unsafe_checkpoint(ckpt_path, e)) from None
    except StateError as e:  # a component refused the state the checkpoint handed it, before any step
        raise CheckpointReadError(f"resume: {ckpt_path}: {e.key}: {e.problem}; not a state this run wrote "
                                  f"(tampered or corrupt): nothing was trained from it") from None
    if trainer.checkpoint_callback is not None:
        trainer.save_checkpoint(checkpoint_dir(stage) / "final.ckpt", weights_only=True)  # no optimizer
    metrics = {"train/steps": trainer.global_step, "wall_seconds": time.perf_counter() - start}
    for cb in callbacks:
        if hasattr(cb, "summary"):  # ResumeState's: the train/* values a resumed fit started with
            metrics |= cb.summary()
    metrics |= getattr(datamodule, "summary", dict)()  # data=adaptive: its decisions (mix/*)
    metrics |= {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")}
    for logger in trainer.loggers:  # the W&B run's summary gets the stage's final figures
        getattr(logger, "set_summary", lambda m: None)(metrics)
    return policy, tokenizer, metrics
