"""LoRA adapters via peft (`model.lora`): with one, only the adapter trains, and preference losses use
the base model with the adapter disabled as their reference (no copy of the weights).

    python train.py algorithm=dpo 'model.lora={r: 8, lora_alpha: 16, target_modules: all-linear}'

Any `peft.LoraConfig` field may be given; task_type is CAUSAL_LM. The adapter's weights are float32 even
over a bfloat16/float16 base (`model.dtype`): the frozen base may be 16-bit, what trains is not.

train.py saves a LoRA policy as peft does (adapter_config.json + adapter weights, float32), loadable with
peft on top of the base model and by the next run as `model.name_or_path` (continued or merged:
`model.adapter`, models/adapters.py); with `save_merged: true` (not a LoraConfig field) it also saves the
merged model (in the base's dtype) in `policy_merged/`, a plain transformers folder that the next run can
load with `model=hf model.name_or_path=<run>/policy_merged`.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import PreTrainedModel


def apply_lora(model: PreTrainedModel, lora: Mapping | None) -> PreTrainedModel:
    """`model` wrapped in a peft LoRA adapter built from `lora` (LoraConfig fields), or as is if None."""
    if not lora:
        return model
    from omegaconf import DictConfig, OmegaConf
    from peft import LoraConfig, TaskType, get_peft_model

    fields = OmegaConf.to_container(lora, resolve=True) if isinstance(lora, DictConfig) else dict(lora)
    fields.pop("save_merged", None)  # read by train.py when it saves the policy
    try:
        config = LoraConfig(task_type=TaskType.CAUSAL_LM, **fields)
    except TypeError as e:
        raise ValueError(f"model.lora={fields}: not a peft LoraConfig ({e})") from None
    return float32_adapter(get_peft_model(model, config, autocast_adapter_dtype=True))


def float32_adapter(model: PreTrainedModel) -> PreTrainedModel:
    """`model` with its LoRA weights (the trainable `lora_` parameters) in float32 whatever the base's dtype:
    over a bfloat16/float16 base they are the master weights, and a small update would round away in 16
    bits (peft casts its adapter layers' inputs to the adapter's dtype and the result back)."""
    for name, param in model.named_parameters():
        if "lora_" in name and param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()
    return model


def lora_problems(model: PreTrainedModel, lora: Mapping) -> list[str]:
    """What is wrong with the LoRA settings `lora` for `model` (a skeleton on the meta device will do: no
    weights are needed), as messages naming model.lora: the fields peft refuses (r=0, an unknown field),
    and every name of a `target_modules` list that matches no module (peft only refuses a list none of
    whose names match; one typo among several would silently train fewer layers). `model` is changed."""
    from omegaconf import DictConfig, OmegaConf
    fields = OmegaConf.to_container(lora, resolve=True) if isinstance(lora, DictConfig) else dict(lora)
    linear = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                     if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] not in ("lm_head", "score")})
    try:
        wrapped = apply_lora(model, fields)
    except Exception as e:  # noqa: BLE001 - peft's own refusals, whatever their type
        return [f"model.lora={fields}: {type(e).__name__}: {str(e).strip().splitlines()[0]}"]
    targets = fields.get("target_modules")
    if not isinstance(targets, (list, tuple)):  # "all-linear" or a regular expression: peft checked it
        return []
    found = list(getattr(wrapped, "targeted_module_names", []))
    missing = [t for t in targets if not any(name == t or name.endswith(f".{t}") for name in found)]
    if not missing:
        return []
    return [f"model.lora.target_modules: {missing} match no module of {type(model).__name__} (its linear "
            f"layers: {', '.join(linear)}; or target_modules: all-linear)"]


def save_policy(policy: PreTrainedModel, tokenizer, out: Path, save_merged: bool) -> list[Path]:
    """`save_pretrained` the policy and tokenizer into `out`; a LoRA policy with `save_merged` also
    into `out`_merged, merged into a copy of its base weights. Returns the folders written. With
    ranks, rank 0 writes; an FSDP-sharded policy is first gathered (on every rank: a collective) into
    one full state dict on rank 0's CPU."""
    from hardware import distributed
    from hardware.sharding import full_state_dict, is_sharded
    state = full_state_dict(policy) if is_sharded(policy) else None
    if not distributed.is_zero():
        return [out]
    policy.save_pretrained(out, state_dict=state)
    if state is not None:  # FSDP2 renamed the class (FSDPLlamaForCausalLM): record the real one
        _fix_architectures(out / "config.json")
    tokenizer.save_pretrained(out)
    written = [out]
    if save_merged and hasattr(policy, "merge_and_unload"):
        merged_dir = out.with_name(out.name + "_merged")
        merged = copy.deepcopy(policy).merge_and_unload()
        merged.save_pretrained(merged_dir)
        tokenizer.save_pretrained(merged_dir)
        written.append(merged_dir)
    return written


def _fix_architectures(path: Path) -> None:
    import json
    config = json.loads(path.read_text())
    config["architectures"] = [a.removeprefix("FSDP") for a in config.get("architectures") or []]
    path.write_text(json.dumps(config, indent=2) + "\n")
