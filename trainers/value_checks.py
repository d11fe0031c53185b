"""Checks of single values and of the hardware, before anything is built: counts must be integers (a
`trainer.max_steps=2.5` would otherwise run 3 steps), limits must be positive (`data.max_examples=-5`
would train on all but 5), `seed` an integer, rates and timeouts positive, the evaluation schedule
well-formed, and hardware=gpu needs a GPU. Every message names the key and what it must be."""
from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf

POSITIVE_INTS = ("generator.batch_size", "checkpoint_every_n_rounds", "algorithm.max_nonfinite",
                 "reward.workers", "callbacks.regenerate.max_dropped_rounds",
                 "callbacks.guards.patience_rounds", "callbacks.guards.patience_steps")
OPTIONAL_POSITIVE_INTS = {"data.max_examples": "null for all", "callbacks.evaluate.num_examples": "null for all",
                          "algorithm.annotate_batch_size": "null (= data.micro_batch_size)"}
NON_NEGATIVE_INTS = ("callbacks.evaluate.every_n_steps", "task.num_heldout",
                     "algorithm.scheduler.num_warmup_steps")
POSITIVE_NUMBERS = ("algorithm.optimizer.lr", "reward.timeout_s", "reward.per_test_seconds",
                    "reward.per_sample_timeout_s")
OPTIONAL_POSITIVE_NUMBERS = {"algorithm.max_grad_norm": "null for no clipping"}
NON_NEGATIVE_NUMBERS = ("algorithm.optimizer.weight_decay",)
SEED_LIMIT = 2**32  # numpy's seeds, which Lightning's seed_everything sets too


def _raw(cfg: DictConfig, key: str):
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
            value = _raw(cfg, key)
            if value is not None and not ok(value):
                alternative = f", or {keys[key]}" if isinstance(keys, dict) else ""
                errors.append(f"{key}={value!r} must be {what}{alternative}")
    _check_seed_and_epochs(cfg, errors)
    _check_schedule_length(cfg, errors)
    _check_eval_schedule(cfg, errors)
    _check_sandbox_budget(cfg, errors)


def _check_seed_and_epochs(cfg: DictConfig, errors: list[str]) -> None:
    seed = _raw(cfg, "seed")
    if not (is_int(seed) and 0 <= seed < SEED_LIMIT):
        errors.append(f"seed={seed!r} must be an integer in [0, 2**32)")
    epochs = _raw(cfg, "trainer.max_epochs")
    if epochs is not None and not (is_int(epochs) and (epochs > 0 or epochs == -1)):
        errors.append(f"trainer.max_epochs={epochs!r} must be a positive integer, or -1 for no limit (then "
                      f"trainer.max_steps ends the stage)")


def _check_schedule_length(cfg: DictConfig, errors: list[str]) -> None:
    """scheduler=linear|cosine: the decay's length (by default ${trainer.max_steps}, reported under that
    key when it is the bad one) must be a positive integer."""
    length = _raw(cfg, "algorithm.scheduler.num_training_steps")
    if length is not None and length != _raw(cfg, "trainer.max_steps") and not (is_int(length) and length > 0):
        errors.append(f"algorithm.scheduler.num_training_steps={length!r} must be a positive integer (the "
                      f"optimizer steps the learning rate decays over; default: trainer.max_steps)")


def _check_eval_schedule(cfg: DictConfig, errors: list[str]) -> None:
    """callbacks.evaluate.schedule: null, a list of steps or 'EVERY:UNTIL,...,EVERY' (callbacks/evaluate.py)."""
    value = _raw(cfg, "callbacks.evaluate.schedule")
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
    if _raw(cfg, "reward._target_") != "rewards.code_exec.CodeExecReward":
        return
    timeout, wall = _raw(cfg, "reward.timeout_s"), _raw(cfg, "reward.sandbox.wall_seconds")
    if is_number(timeout) and timeout > 0 and is_number(wall) and timeout < wall + 2:
        errors.append(f"reward.timeout_s={timeout} must exceed reward.sandbox.wall_seconds + 2 = {wall + 2}: a "
                      f"batch must fit at least one run")


def check_hardware(cfg: DictConfig, errors: list[str]) -> None:
    """hardware=gpu needs a CUDA GPU visible to torch, and as many as trainer.devices asks for;
    hardware=deepspeed_* (a DeepSpeedStrategy) needs the optional deepspeed package, CUDA GPUs (Lightning's
    DeepSpeedStrategy refuses anything else) and a number as its gradient clipping norm."""
    import importlib.util
    accelerator, devices = _raw(cfg, "trainer.accelerator"), _raw(cfg, "trainer.devices")
    target = _raw(cfg, "trainer.strategy._target_")
    deepspeed = isinstance(target, str) and target.endswith("DeepSpeedStrategy")
    if not deepspeed and accelerator not in ("gpu", "cuda"):
        return
    import torch
    cuda = torch.cuda.is_available()
    if deepspeed:
        stage = _raw(cfg, "trainer.strategy.config.zero_optimization.stage")
        name = f"hardware=deepspeed_zero{stage}" if stage in (2, 3) else "hardware=deepspeed_*"
        if importlib.util.find_spec("deepspeed") is None:
            errors.append(f"{name} (trainer.strategy=DeepSpeedStrategy): deepspeed is not installed: "
                          f"pip install -r requirements-deepspeed.txt (deepspeed==0.19.8, torch pinned)")
        if not cuda:
            errors.append(f"{name} (trainer.strategy=DeepSpeedStrategy): DeepSpeed runs on CUDA GPUs only and torch "
                          f"sees none here: on CPUs use hardware=ddp or hardware=fsdp")
        elif accelerator not in ("gpu", "cuda", "auto"):
            errors.append(f"trainer.accelerator={accelerator}: DeepSpeed runs on CUDA GPUs only: "
                          f"trainer.accelerator=gpu")
        ds_config = _raw(cfg, "trainer.strategy.config")
        if isinstance(ds_config, DictConfig) and "gradient_clipping" in ds_config:
            clip = _raw(cfg, "trainer.strategy.config.gradient_clipping")
            if not (is_number(clip) and clip >= 0):
                errors.append(f"trainer.strategy.config.gradient_clipping={clip!r} must be a number ≥ 0 (DeepSpeed "
                              f"clips in its step; it follows algorithm.max_grad_norm): 0.0 for no clipping")
    if accelerator not in ("gpu", "cuda"):
        return
    if not cuda:
        if not deepspeed:  # said above, with the CPU alternatives
            errors.append(f"hardware=gpu (trainer.accelerator={accelerator}): torch sees no CUDA GPU here: use "
                          f"hardware=cpu, or check the driver and CUDA_VISIBLE_DEVICES")
    elif is_int(devices) and devices > torch.cuda.device_count():
        errors.append(f"trainer.devices={devices}: only {torch.cuda.device_count()} CUDA GPU(s) visible here")


def check_ranks(cfg: DictConfig, errors: list[str]) -> None:
    """Several ranks (trainer.devices × trainer.num_nodes > 1): the batch must split over them, and the
    combinations not built for ranks yet are refused rather than left to hang or to train apart."""
    from trainers.launch import strategy_name, world_size_of
    trainer = cfg.get("trainer")
    if trainer is None or not is_int(trainer.get("devices", 1)) or not is_int(trainer.get("num_nodes", 1)):
        return
    world = world_size_of(trainer)
    if world <= 1:
        return
    batch, micro = _raw(cfg, "data.batch_size"), _raw(cfg, "data.micro_batch_size")
    if is_int(batch) and batch % world:
        errors.append(f"data.batch_size={batch} (records per optimizer step) must be a multiple of the {world} ranks "
                      f"(trainer.devices × trainer.num_nodes): each rank takes batch_size / {world}")
    elif is_int(batch) and is_int(micro) and 0 < micro < batch // world and (batch // world) % micro:
        errors.append(f"data.micro_batch_size={micro} must divide each rank's {batch // world} records "
                      f"(data.batch_size={batch} over {world} ranks)")
    if _raw(cfg, "generator._target_") == "models.vllm_generator.VLLMGenerator":
        errors.append(f"generator=vllm with {world} ranks: one engine per rank is not built yet; use generator=hf "
                      f"with ranks, or vLLM in one process")
    strategy = strategy_name(trainer)
    if strategy == "ModelParallelStrategy" and _raw(cfg, "model.lora"):
        errors.append("hardware=fsdp with model.lora: FSDP2 over a peft model is not supported yet; use "
                      "hardware=ddp for LoRA")
    stage = _raw(cfg, "trainer.strategy.config.zero_optimization.stage")
    if strategy == "DeepSpeedStrategy" and stage == 3 and _raw(cfg, "data.prompts_per_round") is not None:
        errors.append("hardware=deepspeed_zero3 with rollouts: generating from ZeRO-3's partitioned weights is not "
                      "built yet (ranks' uneven shares would wait on each other's gathers); use hardware=fsdp or "
                      "hardware=deepspeed_zero2")
