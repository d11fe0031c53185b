"""policyshift entry point: compose → validate every stage → run stages in order → summary.

    python train.py                                  # the embedded default (SFT → GRPO on arithmetic)
    python train.py algorithm=sft data=demonstrations trainer.max_steps=200
    python train.py -m seed=1,2,3                    # a sweep: one output dir and W&B run per job
    python train.py resume=true hydra.run.dir=DIR    # continue a killed run from its checkpoints
    python train.py hardware=ddp trainer.devices=2   # 2 ranks (started under torchrun: run/launch.py)
    python train.py print_config=true                # every stage's resolved config; runs and writes nothing
"""
from __future__ import annotations

import logging
import os
import sys
import time

PROCESS_START = time.time()  # before Hydra makes the run folder and its log: run/run_folder.py

if not os.environ.get("WANDB_MODE"):  # unset or empty: never a login prompt; WANDB_MODE=online to stream
    os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

if __name__ == "__main__":
    from run.command_line import check_command_line  # Hydra alone: a typo answers before torch loads
    check_command_line()

from hardware.memory import return_large_blocks_to_os  # noqa: E402

return_large_blocks_to_os()  # before any large tensor: freed logit chunks go back to the OS

from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from hydra import compose  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from callbacks.summary import RunSummary  # noqa: E402
from hardware import distributed  # noqa: E402
from hardware.console import say0  # noqa: E402
from models.lora import save_policy  # noqa: E402
from run.checkpointing import RunInterrupted, resume_checkpoint  # noqa: E402
from run.errors import exit_with, full_traceback, resume_line, user_error  # noqa: E402
from run.launch import check_environment, needs_launch, run_ranks, sweep_names  # noqa: E402
from run.model_card import write_model_card  # noqa: E402
from run.push_to_hub import push_final_policy  # noqa: E402
from run.run_folder import owned  # noqa: E402
from run.run_record import RunPlan, plan_run, write_record  # noqa: E402
from run.stages import (batch_arithmetic, checkpoint_dir, load_finished_policy, plan_stages,  # noqa: E402
                        print_batch_arithmetic, run_stage, set_run_fields)


CONF_PATH = str(Path(__file__).resolve().parent / "conf")  # absolute: the `policyshift` script's Hydra finds it too


def run_names(hc) -> tuple[Path, str, str]:
    """(output dir, W&B group, W&B run name) for this Hydra job (a launched rank: its job's names)."""
    out = Path(hc.runtime.output_dir)
    if sweep_names() is not None:
        return out, *sweep_names()
    if hc.mode == RunMode.MULTIRUN:
        return out, Path(hc.sweep.dir).name, f"{hc.job.num}:{hc.job.override_dirname or 'job'}"
    return out, out.name, out.name


def train(cfg: DictConfig, user_overrides: list[str], out: Path, group: str, name: str) -> dict:
    """Plan and validate every stage, check the folder, then run its stages in order; the run's record
    is written at its first optimizer step (a run that fails before it leaves no record: run/run_folder.py)."""
    plan, cfg, stages = _plan(cfg, user_overrides, out)
    zero = distributed.is_zero()  # rank 0 alone writes files and prints (every rank with one process)
    for s in stages:
        set_run_fields(s.cfg, out, s.name, group, name, wandb_id=plan.wandb_id)
    recorded = []

    def record() -> None:  # once: at this process's first optimizer step (or the end, if none ran)
        if zero and not recorded:
            write_record(out, plan, cfg, _hydra_config(), user_overrides)
            _save_stage_configs(out, stages, plan)
        recorded.append(True)
    if zero:
        print_batch_arithmetic(stages)
    summary, policy, tokenizer = RunSummary(out / "summary.json", write=zero), None, None
    version = 0  # the run-wide policy version: optimizer steps of the stages before this one
    for s in stages:
        if s.name in plan.finished:  # resume: this stage is done; take the policy it ended with
            say0(f"\n=== stage {s.name}: finished in the resumed run; loading its final weights")
            policy, tokenizer = load_finished_policy(s)
            summary.add(s.name, plan.finished[s.name])
            version += int(plan.finished[s.name].get("train/steps", 0))
            continue
        policy, tokenizer, metrics = _run_stage(s, policy, tokenizer, plan.resume, out, record, version)
        summary.add(s.name, metrics)
        version += int(metrics.get("train/steps", 0))
    record()
    merged = bool(OmegaConf.select(stages[-1].cfg, "model.lora.save_merged", default=False))
    saved = save_policy(policy, tokenizer, out / "policy", save_merged=merged)  # collective under FSDP
    if zero:
        for folder in saved:  # policy/ (with LoRA: the adapter) and policy_merged/ when written
            write_model_card(folder, out, {s.name: s.cfg for s in stages}, summary.stages)
        push_final_policy(stages[-1].cfg, saved)  # push_to_hub.repo_id set: the folder, its card included
        summary.print()
        say0(f"outputs: {out} (config.yaml, summary.json, {', '.join(p.name + '/' for p in saved)})")
        say_wandb_run()
    return summary.stages


def say_wandb_run() -> None:
    """The last console line says where the W&B run is and how to look at it (nothing without W&B)."""
    run = sys.modules["wandb"].run if "wandb" in sys.modules else None
    if run is None or getattr(run.settings, "mode", "") == "disabled":  # WANDB_MODE=disabled: no run to see
        return
    if getattr(run, "offline", False) or getattr(run.settings, "mode", "") == "offline":
        folder = Path(run.dir).parent  # <run>/wandb/offline-run-<date>-<id>/files → the run's folder
        say0(f"W&B (offline): {folder}; view it here with `wandb leet {folder}`, upload it with "
             f"`wandb sync {folder}`")
    else:
        say0(f"W&B: {run.url}")


def print_stages(cfg: DictConfig, user_overrides: list[str], out: Path, group: str, name: str) -> dict:
    """print_config=true: plan and validate every stage as `train` would (a resume: the run's recorded
    settings), print each stage's resolved config with its batch arithmetic, and stop: no model is built,
    nothing is trained, no file is written (main removes the log file Hydra opened in the run dir)."""
    overrides = [o for o in user_overrides if o.split("=")[0].lstrip("+~") != "print_config"]  # not a run setting
    plan, _, stages = _plan(cfg, overrides, out)
    for i, s in enumerate(stages, 1):
        set_run_fields(s.cfg, out, s.name, group, name, wandb_id=plan.wandb_id)
        done = " (finished in the resumed run: skipped)" if s.name in plan.finished else ""
        print(f"# ===== stage {i}/{len(stages)}: {s.name}{done}\n# [batch] {batch_arithmetic(s.cfg)}")
        print(OmegaConf.to_yaml({s.name: OmegaConf.to_container(s.cfg, resolve=True)}), flush=True)
    print(f"# print_config=true: {len(stages)} stage(s) planned and validated; nothing was trained or written "
          f"(drop print_config to run them)")
    return {}


def launch_ranks(cfg: DictConfig, user_overrides: list[str], out: Path, group: str, name: str) -> dict:
    """A multi-process job started here: validate every stage and check the folder (writing nothing),
    then run the job's ranks under torchrun (run/launch.py); their summary."""
    _, cfg, _ = _plan(cfg, user_overrides, out)  # a resume: the run's recorded config
    return run_ranks(cfg.trainer, user_overrides, out, group, name)


def _plan(cfg: DictConfig, user_overrides: list[str], out: Path):
    """(run plan, base config, validated stages); raises before anything is written. A new run: a bad
    config is reported first, then a folder that already holds a run. A resume: the run's own settings
    (its record), not today's defaults, with any command-line change refused unless allowed."""
    if not cfg.resume:
        stages = plan_stages(cfg, user_overrides)  # composes + validates all stages, builds no model
        if not distributed.is_zero():  # rank 0 checked the folder (and may have written to it since)
            return RunPlan(list(user_overrides)), cfg, stages
        return plan_run(out, user_overrides, resume=False, allow_changes=False), cfg, stages
    plan = plan_run(out, user_overrides, resume=True, allow_changes=bool(cfg.get("resume_allow_changes")))
    cfg = compose("train", overrides=plan.overrides)
    say0(f"resuming {out} (resume {plan.resume}) with its recorded overrides: {plan.overrides}")
    return plan, cfg, plan_stages(cfg, plan.overrides)


def _run_trainer(cfg: DictConfig, user_overrides: list[str], out: Path) -> DictConfig:
    """The `trainer` node the job runs with: a resumed run's comes from its recorded overrides."""
    if not cfg.resume:
        return cfg.trainer
    plan = plan_run(out, user_overrides, resume=True, allow_changes=bool(cfg.get("resume_allow_changes")))
    return compose("train", overrides=plan.overrides).trainer


def _run_stage(s, policy, tokenizer, resume: int, out: Path, on_first_step=None, version_offset: int = 0):
    """One stage, from its last checkpoint when resuming; a signal ends the process (128 + signum)
    after the stage's checkpoint is written. `on_first_step`: called after its first optimizer step;
    `version_offset`: the earlier stages' optimizer steps (the run-wide policy version it starts at)."""
    ckpt = resume_checkpoint(checkpoint_dir(s)) if resume else None
    say0(f"\n=== stage {s.name}: algorithm={s.cfg.algorithm.name} data={s.cfg.data._target_}"
          + (f" (resuming from {ckpt})" if ckpt else " (no checkpoint yet: from its start)" if resume else ""))
    try:
        return run_stage(s, policy, tokenizer, ckpt, on_first_step=on_first_step, version_offset=version_offset)
    except RunInterrupted as e:
        say0(f"\n[checkpoint] stage {s.name}: {e}; continue with: python train.py resume=true "
              f"hydra.run.dir={out}")
        raise SystemExit(128 + e.signum) from None


def _save_stage_configs(out: Path, stages, plan) -> None:
    """config.yaml: every stage's resolved config as the run started; a resume that changed settings
    writes config.resume-N.yaml beside it."""
    if plan.resume and not plan.changes:
        return
    path = out / (f"config.resume-{plan.resume}.yaml" if plan.resume else "config.yaml")
    OmegaConf.save({s.name: OmegaConf.to_container(s.cfg, resolve=True) for s in stages}, path)


def _hydra_config() -> DictConfig | None:
    """The Hydra job's config (for .hydra/hydra.yaml), or None outside a Hydra job."""
    return HydraConfig.instance().cfg if HydraConfig.initialized() else None


@hydra.main(version_base="1.3", config_path=CONF_PATH, config_name="train")
def main(cfg: DictConfig) -> float | None:
    hc = HydraConfig.get()
    out, group, name = run_names(hc)
    if not distributed.is_zero():
        _no_log_file()
    overrides = OmegaConf.to_container(hc.overrides.task)  # as typed: resolving would turn '${reward}' into a node
    printing = bool(cfg.get("print_config"))
    log_files = _no_log_file() if printing else []  # print_config=true leaves the run dir as it found it
    try:
        if printing:
            stages = print_stages(cfg, overrides, out, group, name)
        else:
            stages = run_job(cfg, overrides, out, group, name)
    except Exception as e:  # the project's own errors: one line each (the traceback: HYDRA_FULL_ERROR=1)
        if user_error(e) is None or full_traceback():
            raise
        exit_with(e, resume_line(e, out))
    finally:
        finish_wandb()
        distributed.close()  # a rank's process group, before exit (gloo can abort at interpreter exit)
        _remove_if_empty(log_files, out)
    if not stages:  # print_config=true
        return None
    last = list(stages.values())[-1]
    return last.get("val/accuracy_after")  # the optimized metric for sweepers


def run_job(cfg: DictConfig, overrides: list[str], out: Path, group: str, name: str) -> dict:
    """Own the run folder (one live process per folder), then train, or launch the job's ranks; a job that
    fails before its first optimizer step leaves the folder as it found it (run/run_folder.py)."""
    logs = [Path(h.baseFilename) for h in logging.root.handlers if isinstance(h, logging.FileHandler)]
    with owned(out, logs, PROCESS_START, distributed.is_zero()):
        try:
            trainer = _run_trainer(cfg, overrides, out)  # a resume: the run's own hardware
            check_environment(trainer)  # leaked SLURM variables, a self-launching strategy, nodes
            run = launch_ranks if needs_launch(trainer) else train
            return run(cfg, overrides, out, group, name)
        finally:
            finish_wandb()  # before the folder is put back: W&B writes into it until it finishes


def _no_log_file() -> list[Path]:
    """A rank > 0 logs to the console only: Hydra's job log file in the run folder is rank 0's (and
    print_config=true writes none). The files those handlers had opened."""
    files = []
    for handler in list(logging.root.handlers):
        if isinstance(handler, logging.FileHandler):
            logging.root.removeHandler(handler)
            handler.close()
            files.append(Path(handler.baseFilename))
    return files


def _remove_if_empty(files: list[Path], out: Path) -> None:
    """The empty log files given, then the run dir if nothing else is in it (Hydra made both before main)."""
    for f in files:
        if f.is_file() and f.stat().st_size == 0:
            f.unlink()
    if files and out.is_dir() and not any(out.iterdir()):
        out.rmdir()


def finish_wandb() -> None:
    if "wandb" in sys.modules and sys.modules["wandb"].run is not None:
        sys.modules["wandb"].finish()


def cli() -> None:
    """`python train.py ARGS`, and the `policyshift` console script (pyproject.toml)."""
    from run.command_line import check_command_line
    check_command_line()
    main()


if __name__ == "__main__":
    cli()
