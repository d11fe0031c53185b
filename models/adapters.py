"""A LoRA run's `policy/` (peft's adapter_config.json + adapter weights + tokenizer, no full weights) as
`model.name_or_path`: the base model its `base_model_name_or_path` names (a local folder) is loaded, then
the adapter, as `model.adapter` says:

  continue  the adapter is loaded trainable (`PeftModel.from_pretrained(..., is_trainable=True)`): the
            same LoRA run, continued from its weights. The reference of the next run (trainers/base.py)
            is the base with the adapter disabled: the ORIGINAL base, not the previous run's policy (as
            in TRL, whose reference for a PEFT model is the base with adapters disabled). `model.lora`
            is refused: one adapter trains at a time.
  merge     the adapter is merged into the base weights (`merge_and_unload`): a plain model equal to the
            previous run's policy. `model.lora` then adds a fresh adapter, else the whole model trains.
            The reference is the previous run's policy: a frozen copy of the merged model, or with
            `model.lora` the merged model with the new adapter disabled.

A base that is itself an adapter folder (what a run started with `merge` + `model.lora` saves: its new
adapter's base is the earlier adapter folder, since the merged weights exist nowhere else) is loaded
merged, down to the first folder with full weights (models/hf_checks.py `adapter_chain`).
"""
from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel

ADAPTER_MODES = ("continue", "merge")


def check_mode(adapter: str, lora) -> None:
    """ValueError unless `adapter` is a mode, and for `continue` no second adapter (`lora`) is asked for."""
    if adapter not in ADAPTER_MODES:
        raise ValueError(f"model.adapter={adapter!r}: choose one of {', '.join(ADAPTER_MODES)}")
    if adapter == "continue" and lora:
        raise ValueError(conflict_message())


def conflict_message(path: str = "model.name_or_path") -> str:
    return (f"model.lora with model.adapter=continue: {path} is a LoRA adapter, which this run keeps training "
            f"(with its own settings); one adapter trains at a time: drop model.lora, or set "
            f"model.adapter=merge (the adapter is merged into the base, then model.lora adds a fresh one)")


def merge_adapter(model: PreTrainedModel, folder: Path) -> PreTrainedModel:
    """`model` with the adapter in `folder` merged into its weights: a plain transformers model. Its
    `name_or_path` becomes `folder`, so a fresh adapter trained on it records that folder as its base.
    Every weight trains again, as a plain model's (peft froze them to load the adapter)."""
    from peft import PeftModel
    merged = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    for p in merged.parameters():
        p.requires_grad_(True)
    merged.name_or_path = str(folder)  # what peft writes as a new adapter's base_model_name_or_path
    return merged


def continue_adapter(model: PreTrainedModel, folder: Path) -> PreTrainedModel:
    """`model` wrapped in the adapter saved in `folder`, trainable (only the adapter's weights)."""
    from peft import PeftModel
    return PeftModel.from_pretrained(model, str(folder), is_trainable=True)


def apply_chain(model: PreTrainedModel, chain: list[Path], adapter: str) -> PreTrainedModel:
    """`model` (loaded from `chain[-1]`, the full folder) with the adapters of `chain` applied, last to
    first: every base adapter merged; `chain[0]`'s merged too (`merge`) or left out for
    `continue_adapter` (after the rest of the model is finished). [folder]: `model` as is."""
    for folder in reversed(chain[1:-1]):
        model = merge_adapter(model, folder)
    if len(chain) > 1 and adapter == "merge":
        model = merge_adapter(model, chain[0])
    return model
