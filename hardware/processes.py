"""How many processes a job's `trainer` node (conf/hardware) asks for, which strategy it names, and
whether this process is one rank of a launched job (torchrun, or SLURM with a task per rank). Pure
functions of the config and the environment: run/launch.py starts the ranks, run/validation checks them.
"""
from __future__ import annotations

import os

from omegaconf import DictConfig

LAUNCHED_ENV = ("TORCHELASTIC_RUN_ID", "LOCAL_RANK")  # set for every rank by torchrun / a launched job


def processes_per_node(trainer: DictConfig) -> int:
    """How many processes `trainer.devices` means on one node (1 for a single device)."""
    devices, accelerator = trainer.get("devices", 1), str(trainer.get("accelerator", "cpu"))
    if isinstance(devices, int) and devices > 0:
        return devices
    if isinstance(devices, str) and devices.strip().isdigit():
        return int(devices)
    if isinstance(devices, str) and "," in devices:
        return len([d for d in devices.split(",") if d.strip()])
    if not isinstance(devices, (int, str)):  # a list of device indices
        return len(devices)
    if accelerator in ("gpu", "cuda", "auto"):  # "auto" / -1: every visible GPU
        import torch
        return max(torch.cuda.device_count(), 1)
    return 1


def world_size_of(trainer: DictConfig) -> int:
    return processes_per_node(trainer) * int(trainer.get("num_nodes", 1))


def strategy_name(trainer: DictConfig) -> str:
    strategy = trainer.get("strategy", "auto")
    return str(strategy.get("_target_", "")).rsplit(".", 1)[-1] if isinstance(strategy, DictConfig) else str(strategy)


def launched() -> bool:
    """Whether this process is one rank of a launched job (torchrun, or a SLURM task per rank)."""
    slurm_task = "SLURM_PROCID" in os.environ and "SLURM_NTASKS" in os.environ
    return slurm_task or any(k in os.environ for k in LAUNCHED_ENV)
