"""Checks of the `hardware` group against this machine and the job: hardware=gpu needs the GPUs it asks
for, DeepSpeed needs its package and CUDA, and several ranks need a batch that splits over them and a
combination that is built for ranks. Every message names the key and what it must be."""
from __future__ import annotations

from omegaconf import DictConfig

from hardware.processes import strategy_name, world_size_of
from run.validation.values import is_int, is_number, raw


def check_hardware(cfg: DictConfig, errors: list[str]) -> None:
    """hardware=gpu needs a CUDA GPU visible to torch, and as many as trainer.devices asks for;
    hardware=deepspeed_* (a DeepSpeedStrategy) needs the optional deepspeed package, CUDA GPUs (Lightning's
    DeepSpeedStrategy refuses anything else) and a number as its gradient clipping norm."""
    import importlib.util
    accelerator, devices = raw(cfg, "trainer.accelerator"), raw(cfg, "trainer.devices")
    target = raw(cfg, "trainer.strategy._target_")
    deepspeed = isinstance(target, str) and target.endswith("DeepSpeedStrategy")
    if not deepspeed and accelerator not in ("gpu", "cuda"):
        return
    import torch
    cuda = torch.cuda.is_available()
    if deepspeed:
        stage = raw(cfg, "trainer.strategy.config.zero_optimization.stage")
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
        ds_config = raw(cfg, "trainer.strategy.config")
        if isinstance(ds_config, DictConfig) and "gradient_clipping" in ds_config:
            clip = raw(cfg, "trainer.strategy.config.gradient_clipping")
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
    trainer = cfg.get("trainer")
    if trainer is None or not is_int(trainer.get("devices", 1)) or not is_int(trainer.get("num_nodes", 1)):
        return
    world = world_size_of(trainer)
    if world <= 1:
        return
    batch, micro = raw(cfg, "data.batch_size"), raw(cfg, "data.micro_batch_size")
    if is_int(batch) and batch % world:
        errors.append(f"data.batch_size={batch} (records per optimizer step) must be a multiple of the {world} ranks "
                      f"(trainer.devices × trainer.num_nodes): each rank takes batch_size / {world}")
    elif is_int(batch) and is_int(micro) and 0 < micro < batch // world and (batch // world) % micro:
        errors.append(f"data.micro_batch_size={micro} must divide each rank's {batch // world} records "
                      f"(data.batch_size={batch} over {world} ranks)")
    strategy = strategy_name(trainer)
    check_engine_per_rank(cfg, world, strategy, errors)
    if strategy == "ModelParallelStrategy" and raw(cfg, "model.lora"):
        errors.append("hardware=fsdp with model.lora: FSDP2 over a peft model is not supported yet; use "
                      "hardware=ddp for LoRA")
    stage = raw(cfg, "trainer.strategy.config.zero_optimization.stage")
    if strategy == "DeepSpeedStrategy" and stage == 3 and raw(cfg, "data.prompts_per_round") is not None:
        errors.append("hardware=deepspeed_zero3 with rollouts: generating from ZeRO-3's partitioned weights is not "
                      "built yet (ranks' uneven shares would wait on each other's gathers); use hardware=fsdp or "
                      "hardware=deepspeed_zero2")


def check_engine_per_rank(cfg: DictConfig, world: int, strategy: str, errors: list[str]) -> None:
    """generator=vllm with ranks: one engine per rank (generators/vllm.py), built for DDP and FSDP2."""
    if raw(cfg, "generator._target_") != "generators.vllm.VLLMGenerator":
        return
    if not (strategy.startswith("ddp") or strategy in ("auto", "DDPStrategy", "ModelParallelStrategy")):
        errors.append(f"generator=vllm with {world} ranks under trainer.strategy={strategy}: one engine per rank "
                      f"is built for hardware=ddp and hardware=fsdp only (DeepSpeed's weights are not streamed "
                      f"into engines yet); use hardware=ddp or hardware=fsdp")
    tp = raw(cfg, "generator.tensor_parallel_size")
    if is_int(tp) and tp != 1:
        errors.append(f"generator.tensor_parallel_size={tp} with {world} ranks: each rank owns one engine on its "
                      f"own device (tensor_parallel_size=1); an engine over several devices is one process's only")
