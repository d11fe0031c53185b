"""LoRA adapters via peft (`model.lora`): with one, only the adapter trains, and preference losses use
the base model with the adapter disabled as their reference (no copy of the weights).

    python train.py algorithm=dpo 'model.lora={r: 8, lora_alpha: 16, target_modules: all-linear}'

Any `peft.LoraConfig` field may be given; task_type is CAUSAL_LM. train.py saves a LoRA policy as peft
does (adapter_config.json + adapter weights), loadable with peft on top of the base model.
"""
from __future__ import annotations

from collections.abc import Mapping

from transformers import PreTrainedModel


def apply_lora(model: PreTrainedModel, lora: Mapping | None) -> PreTrainedModel:
    """`model` wrapped in a peft LoRA adapter built from `lora` (LoraConfig fields), or as is if None."""
    if not lora:
        return model
    from omegaconf import DictConfig, OmegaConf
    from peft import LoraConfig, TaskType, get_peft_model

    fields = OmegaConf.to_container(lora, resolve=True) if isinstance(lora, DictConfig) else dict(lora)
    try:
        config = LoraConfig(task_type=TaskType.CAUSAL_LM, **fields)
    except TypeError as e:
        raise ValueError(f"model.lora={fields}: not a peft LoraConfig ({e})") from None
    return get_peft_model(model, config)
