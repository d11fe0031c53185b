"""The `trainer` node (conf/train.yaml's trainer and the `hardware` group, `# @package trainer`): passed
to lightning.Trainer, so it is open (any Trainer argument may be added; a misspelled one is refused on
the command line by run/overrides.py). The choices of accelerator, strategy and precision are
Lightning's own registries, read here: what Lightning would refuse after the model is built is refused
at plan time."""
from __future__ import annotations

import typing
from typing import Annotated, Any, Literal

from pydantic import Field

from run.validation.schemas.base import Bool, Mapping, Must, NonNegativeInt, OpenNode, PositiveInt, Targeted, must


def _precisions() -> tuple:
    from lightning.fabric.connector import _PRECISION_INPUT
    return tuple(v for part in typing.get_args(_PRECISION_INPUT) for v in typing.get_args(part))


def _accelerators() -> tuple[str, ...]:
    from lightning.pytorch.accelerators import AcceleratorRegistry
    return ("auto", "gpu", *sorted(AcceleratorRegistry.available_accelerators()))


def _strategies() -> tuple[str, ...]:
    from lightning.pytorch.strategies import StrategyRegistry
    return ("auto", *StrategyRegistry.available_strategies())


PRECISIONS, ACCELERATORS, STRATEGIES = _precisions(), _accelerators(), _strategies()
SHOWN_STRATEGIES = "auto, ddp, ddp_spawn, fsdp, deepspeed, single_device, …"


class DeepSpeed(OpenNode):
    """lightning's DeepSpeedStrategy (hardware=deepspeed_*): `config` is DeepSpeed's own JSON config (its
    gradient clipping: run/validation/hardware.py)."""
    config: Mapping = None


class ModelParallel(OpenNode):
    """lightning's ModelParallelStrategy (hardware=fsdp: FSDP2)."""
    data_parallel_size: must(Annotated[int, Field(gt=0)] | Literal["auto"], "a positive integer or auto") = None
    tensor_parallel_size: PositiveInt = None
    save_distributed_checkpoint: Bool = None


STRATEGY_NODES = {"lightning.pytorch.strategies.DeepSpeedStrategy": DeepSpeed,
                  "lightning.pytorch.strategies.ModelParallelStrategy": ModelParallel}


class Trainer(OpenNode):
    """lightning.Trainer's arguments that the project sets."""
    accelerator: must(Literal[ACCELERATORS], "one of " + ", ".join(ACCELERATORS)) = None
    devices: must(Annotated[int, Field(gt=0)] | Literal[-1, "auto"] | list[int] | str,
                  "a positive integer, -1 (all), auto, or a list of device indices") = None
    num_nodes: PositiveInt = None
    strategy: Annotated[Literal[STRATEGIES] | dict[str, Any], Must(f"a Lightning strategy ({SHOWN_STRATEGIES}) or a "
                                                                   f"node with its _target_"),
                        Targeted(STRATEGY_NODES, OpenNode, each=False)] = None
    precision: must(Literal[PRECISIONS], "one of " + ", ".join(str(p) for p in PRECISIONS if isinstance(p, str)
                                                               and "-" in p)) = None
    max_steps: PositiveInt = None
    max_epochs: must(Annotated[int, Field(ge=1)] | Literal[-1], "a positive integer, or -1 for no limit (then "
                     "trainer.max_steps ends the stage)") = None
    reload_dataloaders_every_n_epochs: must(Literal[1], "1 (one epoch is one round of experience)") = None
    log_every_n_steps: PositiveInt = None
    enable_checkpointing: Bool = None
    num_sanity_val_steps: NonNegativeInt = None
    enable_model_summary: Bool = None


SCHEMAS = {}
FALLBACK = Trainer
