"""Checks of single values, before anything is built: counts must be integers (a
`trainer.max_steps=2.5` would otherwise run 3 steps), limits must be positive (`data.max_examples=-5`
would train on all but 5), `seed` an integer, rates and timeouts positive, the evaluation schedule
well-formed. Every message names the key and what it must be."""
from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf

POSITIVE_INTS = ("generator.batch_size", "checkpoint_every_n_rounds", "algorithm.max_nonfinite",
                 "reward.workers", "callbacks.regenerate.max_dropped_rounds",
                 "callbacks.guards.patience_rounds", "callbacks.guards.patience_steps")
OPTIONAL_POSITIVE_INTS = {"data.max_examples": "null for all", "callbacks.evaluate.num_examples": "null for all",
                          "algorithm.annotate_batch_size": "null (= data.micro_batch_size)",
                          "algorithm.ref_update_every": "null for never"}
NON_NEGATIVE_INTS = ("callbacks.evaluate.every_n_steps", "task.num_heldout",
                     "algorithm.scheduler.num_warmup_steps")
POSITIVE_NUMBERS = ("algorithm.optimizer.lr", "reward.timeout_s", "reward.per_test_seconds",
                    "reward.per_sample_timeout_s")
OPTIONAL_POSITIVE_NUMBERS = {"algorithm.max_grad_norm": "null for no clipping"}
NON_NEGATIVE_NUMBERS = ("algorithm.optimizer.weight_decay",)
SEED_LIMIT = 2**32  # numpy's seeds, which Lightning's seed_everything sets too


def raw(cfg: DictConfig, key: str):
    return OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_values(cfg: DictConfig, errors: list[str]) -> None:
    """Integers, limits, seed, rates and timeouts: one message per bad key."""
    rules = [(POSITIVE_INTS, lambda v: is_int(v) and v > 0, "a positive integer"),
             (OPTIONAL_POSITIVE_INTS, lambda v: is_int(v) and v > 0, "a positive integer"),
             (NON_NEGATIVE_INTS, lambda v: is_int(v) and v >= 0, "an integer ≥ 0"),
             (POSITIVE_NUMBERS, lambda v: is_number(v) and v > 0, "a positive number"),
             (OPTIONAL_POSITIVE_NUMBERS, lambda v: is_number(v) and v > 0, "a positive number"),
             (NON_NEGATIVE_NUMBERS, lambda v: is_number(v) and v >= 0, "a number ≥ 0")]
    for keys, ok, what in rules:  # a dict's values say what null means for that key
        for key in keys:
            value = raw(cfg, key)
            if value is not None and not ok(value):
                alternative = f", or {keys[key]}" if isinstance(keys, dict) else ""
                errors.append(f"{key}={value!r} must be {what}{alternative}")
    _check_seed_and_epochs(cfg, errors)
    _check_schedule_length(cfg, errors)
    _check_eval_schedule(cfg, errors)
    _check_sandbox_budget(cfg, errors)
    _check_correction(cfg, errors)


def _check_seed_and_epochs(cfg: DictConfig, errors: list[str]) -> None:
    seed = raw(cfg, "seed")
    if not (is_int(seed) and 0 <= seed < SEED_LIMIT):
        errors.append(f"seed={seed!r} must be an integer in [0, 2**32)")
    epochs = raw(cfg, "trainer.max_epochs")
    if epochs is not None and not (is_int(epochs) and (epochs > 0 or epochs == -1)):
        errors.append(f"trainer.max_epochs={epochs!r} must be a positive integer, or -1 for no limit (then "
                      f"trainer.max_steps ends the stage)")


def _check_schedule_length(cfg: DictConfig, errors: list[str]) -> None:
    """scheduler=linear|cosine: the decay's length (by default ${trainer.max_steps}, reported under that
    key when it is the bad one) must be a positive integer."""
    length = raw(cfg, "algorithm.scheduler.num_training_steps")
    if length is not None and length != raw(cfg, "trainer.max_steps") and not (is_int(length) and length > 0):
        errors.append(f"algorithm.scheduler.num_training_steps={length!r} must be a positive integer (the "
                      f"optimizer steps the learning rate decays over; default: trainer.max_steps)")


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


CORRECTION_BOUNDS = {  # the `correction` group's numbers: (key, test, what it must be)
    "losses.correction.ppo_clip": (
        ("clip_low", lambda v: 0 <= v < 1, "in [0, 1): ρ is clipped below at 1 - clip_low"),
        ("clip_high", lambda v: v > 0, "> 0: ρ is clipped above at 1 + clip_high")),
    "losses.correction.truncated_is": (
        ("cap", lambda v: v >= 1, "≥ 1: on-policy tokens (ρ = 1) keep their weight"),),
    "losses.correction.masked_is": (
        ("low", lambda v: 0 <= v <= 1, "in [0, 1]: on-policy tokens (ρ = 1) are kept"),
        ("high", lambda v: v >= 1, "≥ 1: on-policy tokens (ρ = 1) are kept")),
}


def _check_correction(cfg: DictConfig, errors: list[str]) -> None:
    """The off-policy correction's bounds leave on-policy tokens (importance ratio 1) trained as they are:
    `correction.clip_low=1.5` would clip below at -0.5, `masked_is` with `low > 1` would mask every one."""
    for key, ok, what in CORRECTION_BOUNDS.get(raw(cfg, "correction._target_"), ()):
        value = raw(cfg, f"correction.{key}")
        if not (is_number(value) and ok(value)):
            errors.append(f"correction.{key}={value!r} must be a number {what}")
