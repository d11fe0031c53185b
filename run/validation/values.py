"""Checks of values that a schema cannot say alone (the types, ranges and choices of single values are
the schemas': run/validation/schemas/): the evaluation schedule's grammar, a code_exec batch's time
limit against one sandbox run, and a warmup longer than the stage (a warning). And the helpers the
checks share."""
from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf


def raw(cfg: DictConfig, key: str):
    return OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_values(cfg: DictConfig, errors: list[str]) -> None:
    _check_eval_schedule(cfg, errors)
    _check_sandbox_budget(cfg, errors)


def _check_eval_schedule(cfg: DictConfig, errors: list[str]) -> None:
    """callbacks.evaluate.schedule: null, a list of steps or 'EVERY:UNTIL,...,EVERY' (callbacks/evaluate.py)."""
    value = raw(cfg, "callbacks.evaluate.schedule")
    if value is None:
        return
    from callbacks.evaluate import SCHEDULE_FORMS, parse_schedule
    try:
        parse_schedule(value)
    except ValueError as e:
        shown = OmegaConf.to_container(value) if isinstance(value, DictConfig | ListConfig) else value
        errors.append(f"callbacks.evaluate.schedule={shown!r} must be {SCHEDULE_FORMS}: {e}")


def _check_sandbox_budget(cfg: DictConfig, errors: list[str]) -> None:
    """reward=code_exec: a batch's time limit must fit one sandbox run (checked again when it is built)."""
    if raw(cfg, "reward._target_") != "rewards.code_exec.CodeExecReward":
        return
    timeout, wall = raw(cfg, "reward.timeout_s"), raw(cfg, "reward.sandbox.wall_seconds")
    if is_number(timeout) and timeout > 0 and is_number(wall) and timeout < wall + 2:
        errors.append(f"reward.timeout_s={timeout} must exceed reward.sandbox.wall_seconds + 2 = {wall + 2}: a "
                      f"batch must fit at least one run")


def budget_warning(cfg: DictConfig) -> str | None:
    """A budget (budget.*) with a schedule that decays over trainer.max_steps: the budget may end the stage
    before the learning rate has decayed (callbacks/budget.py; docs/experience.md)."""
    generates = raw(cfg, "data.prompts_per_round") is not None  # an SFT stage never spends a token budget
    budgets = [f"budget.{k}={raw(cfg, f'budget.{k}')}" for k in ("generated_tokens", "usd")
               if raw(cfg, f"budget.{k}") is not None and (k == "usd" or generates)]
    decays = raw(cfg, "algorithm.scheduler.num_training_steps") is not None
    if budgets and decays:
        return (f"{' and '.join(budgets)} with a schedule that decays over trainer.max_steps="
                f"{raw(cfg, 'trainer.max_steps')}: if the budget ends the stage first, the learning rate is cut "
                f"where it is; use scheduler=constant, or set trainer.max_steps to the steps the budget buys")
    return None


def warmup_warning(cfg: DictConfig) -> str | None:
    """algorithm.scheduler.num_warmup_steps > trainer.max_steps: the learning rate never reaches
    algorithm.optimizer.lr (a warning, not an error: a smoke test of a few steps is such a run)."""
    warmup, steps = raw(cfg, "algorithm.scheduler.num_warmup_steps"), raw(cfg, "trainer.max_steps")
    if is_int(warmup) and is_int(steps) and warmup > steps:
        lr = raw(cfg, "algorithm.optimizer.lr")
        return (f"algorithm.scheduler.num_warmup_steps={warmup} is longer than trainer.max_steps={steps}: the "
                f"learning rate never reaches algorithm.optimizer.lr={lr} (at most {steps / warmup:.0%} of it); "
                f"lower the warmup or raise max_steps")
    return None


def cpu_bf16_note(cfg: DictConfig) -> str | None:
    """trainer.precision=bf16-mixed on a CPU: correct, but CPU autocast is slow (a note, not an error: it is
    how a GPU config is checked on a laptop)."""
    if str(raw(cfg, "trainer.precision")) != "bf16-mixed" or raw(cfg, "trainer.accelerator") not in ("cpu", "auto"):
        return None
    import torch
    if raw(cfg, "trainer.accelerator") == "auto" and torch.cuda.is_available():
        return None
    return ("trainer.precision=bf16-mixed on a CPU: right, but CPU autocast makes each step several times slower "
            "than 32-true (7× on a 2-core machine); use it to check a GPU config, not for speed")
