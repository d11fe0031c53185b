"""Checks of the `model` group's settings that depend on the architecture, made on a skeleton of the
model on the meta device (modules and shapes: no weights read or allocated, no factory called): a LoRA
adapter's fields and target modules (`model.lora`), and `model.adapter` (how a LoRA run's adapter folder
given as model.name_or_path is loaded), are refused here, before anything is written, rather than after
the model is built. And the precision of what trains (`check_precision`): the trainable weights and the
optimizer's state stay float32; 16 bits is for the compute (`trainer.precision=bf16-mixed`) and for a
LoRA adapter's frozen base."""
from __future__ import annotations

import torch
from omegaconf import DictConfig

from run.validation.values import raw


def check_lora(cfg: DictConfig, errors: list[str]) -> None:
    lora = raw(cfg, "model.lora")
    if check_adapter(cfg, errors) or not lora:
        return
    from models.lora import lora_problems
    model = _skeleton(cfg.model)
    if model is not None:  # another factory's model is checked when it is built
        errors.extend(lora_problems(model, lora))


def check_adapter(cfg: DictConfig, errors: list[str]) -> bool:
    """With model.adapter=continue (model=hf) and an adapter folder as model.name_or_path, model.lora (a
    second adapter) is refused. Whether an error was added."""
    if raw(cfg, "model._target_") != "models.hf.load_hf":
        return False
    from models.adapters import conflict_message
    from models.hf_checks import is_adapter_folder
    mode, path = raw(cfg, "model.adapter") or "continue", raw(cfg, "model.name_or_path")  # its choices: the schema
    if mode == "continue" and raw(cfg, "model.lora") and isinstance(path, str) and is_adapter_folder(path):
        errors.append(conflict_message(path))
        return True
    return False


def check_model_shape(cfg: DictConfig, errors: list[str]) -> None:
    """model=tiny: attention splits model.hidden_size over model.num_heads (each a positive integer: the
    schema); a remainder fails when the model is built."""
    if raw(cfg, "model._target_") != "models.tiny.build_tiny":
        return
    hidden, heads = raw(cfg, "model.hidden_size"), raw(cfg, "model.num_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 and hidden % heads:
        errors.append(f"model.hidden_size={hidden} must be a multiple of model.num_heads={heads} (each head "
                      f"takes hidden_size / num_heads dimensions)")


MIXED = "model.dtype=float32 trainer.precision=bf16-mixed"
LOW_PRECISION_WEIGHTS = ("bfloat16", "float16")
TRUE_LOW_PRECISION = ("bf16-true", "16-true")
FP16_MIXED = ("16-mixed", "16")


def check_precision(cfg: DictConfig, errors: list[str]) -> None:
    """Refuse 16-bit trainable weights: AdamW on bfloat16 weights has no float32 master copy, and an update
    below a weight's 16-bit resolution (lr 1e-6 on weights near 0.02) rounds away, silently. A 16-bit frozen
    base under a LoRA adapter is fine (models/lora.py keeps the adapter float32). hardware=fsdp
    (ModelParallelStrategy) takes 32-true or bf16-mixed only."""
    dtype, precision = raw(cfg, "model.dtype"), raw(cfg, "trainer.precision")
    if dtype in LOW_PRECISION_WEIGHTS and not raw(cfg, "model.lora"):
        errors.append(f"model.dtype={dtype} trains {dtype} weights with no float32 master copy (small updates "
                      f"round away): use {MIXED} (float32 weights and optimizer state, bf16 compute), or a "
                      f"LoRA adapter (model.lora) over the {dtype} base")
    if str(precision) in TRUE_LOW_PRECISION:
        errors.append(f"trainer.precision={precision} casts the trainable weights to 16 bits (small updates round "
                      f"away): use {MIXED}")
    if str(precision) in FP16_MIXED and _on_cpu(raw(cfg, "trainer.accelerator")):
        errors.append(f"trainer.precision={precision} on a CPU: fp16 autocast with loss scaling runs on CUDA GPUs "
                      f"only (Lightning refuses it once the model is built); use trainer.precision=bf16-mixed "
                      f"(bf16 CPU autocast) or 32-true")
    target = raw(cfg, "trainer.strategy._target_")
    fsdp = isinstance(target, str) and target.endswith("ModelParallelStrategy")
    if fsdp and str(precision) in ("16-mixed", "16"):
        errors.append(f"hardware=fsdp with trainer.precision={precision}: Lightning's ModelParallelStrategy has no "
                      f"fp16 loss scaling; use trainer.precision=bf16-mixed")


def _on_cpu(accelerator) -> bool:
    """Whether the stage trains on the CPU: accelerator=cpu, or auto with no CUDA GPU visible."""
    return accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())


def _skeleton(node: DictConfig):
    """The stage's model (no adapter) on the meta device for the project's factories, else None. A
    missing or broken folder gives None too: the folder checks report it."""
    target = raw(node, "_target_")
    try:
        if target == "models.hf.load_hf":
            from models.hf import skeleton
            return skeleton(str(node.name_or_path), bool(node.trust_remote_code))
        if target == "models.tiny.build_tiny":
            from transformers import LlamaForCausalLM

            from models.tiny import tiny_config
            with torch.device("meta"):
                return LlamaForCausalLM(tiny_config(node.hidden_size, node.num_layers, node.num_heads,
                                                    node.intermediate_size, node.max_position_embeddings))
    except Exception:  # noqa: BLE001 - see the docstring
        return None
    return None
