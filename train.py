"""policyshift entry point: compose → validate every stage → run stages in order → summary.

    python train.py                                  # the embedded default (SFT → GRPO on arithmetic)
    python train.py algorithm=sft data=demonstrations trainer.max_steps=200
    python train.py -m seed=1,2,3                    # a sweep: one output dir and W&B run per job
    python train.py resume=true hydra.run.dir=DIR    # continue a killed run from its checkpoints
"""
from __future__ import annotations

import os

os.environ.setdefault("WANDB_MODE", "offline")  # never a login prompt; WANDB_MODE=online to stream
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from models.memory import return_large_blocks_to_os  # noqa: E402

return_large_blocks_to_os()  # before any large tensor: freed logit chunks go back to the OS

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from callbacks.summary import RunSummary  # noqa: E402
from models.lora import save_policy  # noqa: E402
from trainers.command_line import exit_on_bad_command_line  # noqa: E402
from trainers.errors import exit_with, full_traceback, user_error  # noqa: E402
from trainers.pipeline import (checkpoint_dir, load_finished_policy, plan_stages,  # noqa: E402
                               run_stage, set_run_fields)
from trainers.validation import ConfigError  # noqa: E402


def run_names(hc) -> tuple[Path, str, str]:
    """(output dir, W&B group, W&B run name) for this Hydra job."""
    out = Path(hc.runtime.output_dir)
    if hc.mode == RunMode.MULTIRUN:
        return out, Path(hc.sweep.dir).name, f"{hc.job.num}:{hc.job.override_dirname or 'job'}"
    return out, out.name, out.name


def train(cfg: DictConfig, user_overrides: list[str], out: Path, group: str, name: str) -> dict:
    stages = plan_stages(cfg, user_overrides)  # composes + validates all stages, builds no model
    finished = _finished(out, cfg.resume)
    for s in stages:
        set_run_fields(s.cfg, out, s.name, group, name)
    OmegaConf.save({s.name: OmegaConf.to_container(s.cfg, resolve=True) for s in stages}, out / "config.yaml")
    summary, policy, tokenizer = RunSummary(out / "summary.json"), None, None
    for s in stages:
        if s.name in finished:  # resume: this stage is done; take the policy it ended with
            print(f"\n=== stage {s.name}: finished in the resumed run; loading its final weights")
            policy, tokenizer = load_finished_policy(s)
            summary.add(s.name, finished[s.name])
            continue
        last = checkpoint_dir(s) / "last.ckpt"
        ckpt = last if cfg.resume and last.is_file() else None
        print(f"\n=== stage {s.name}: algorithm={s.cfg.algorithm.name} data={s.cfg.data._target_}"
              + (f" (resuming from {ckpt})" if ckpt else ""))
        policy, tokenizer, metrics = run_stage(s, policy, tokenizer, ckpt)
        summary.add(s.name, metrics)
    merged = bool(OmegaConf.select(stages[-1].cfg, "model.lora.save_merged", default=False))
    saved = save_policy(policy, tokenizer, out / "policy", save_merged=merged)
    summary.print()
    print(f"outputs: {out} (config.yaml, summary.json, {', '.join(p.name + '/' for p in saved)})")
    return summary.stages


def _finished(out: Path, resume: bool) -> dict:
    """Stages already finished in `out` (resume=true), or {} for a new run (refusing a used dir)."""
    path = out / "summary.json"
    if not path.exists():
        return {}
    if not resume:
        raise ConfigError(f"{out} already holds a run (summary.json); choose another hydra.run.dir, or "
                          f"resume=true hydra.run.dir={out} to continue it")
    return json.loads(path.read_text())


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    hc = HydraConfig.get()
    out, group, name = run_names(hc)
    try:  # the overrides as typed: resolving them here would turn '${reward}' into a node
        stages = train(cfg, OmegaConf.to_container(hc.overrides.task), out, group, name)
    except Exception as e:  # the project's own errors: one line each (the traceback: HYDRA_FULL_ERROR=1)
        if user_error(e) is None or full_traceback():
            raise
        exit_with(e)
    finally:
        _finish_wandb()
    last = list(stages.values())[-1]
    return last.get("val/accuracy_after")  # the optimized metric for sweepers


def _finish_wandb() -> None:
    import sys
    if "wandb" in sys.modules and sys.modules["wandb"].run is not None:
        sys.modules["wandb"].finish()


if __name__ == "__main__":
    exit_on_bad_command_line()  # a typo'd key or choice: one line, before Hydra's own report
    main()
