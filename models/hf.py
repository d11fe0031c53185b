"""Any Hugging Face causal LM and its tokenizer from a local path (no hub access at run time)."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from models.lora import apply_lora


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def finish_model(model: PreTrainedModel, dtype: str, activation_checkpointing: bool,
                 lora: dict | None) -> PreTrainedModel:
    """The policy as configured: weights in `dtype`, activation (gradient) checkpointing of the decoder
    layers (recomputed in backward: less memory, ~30% more compute), an optional LoRA adapter."""
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype={dtype!r}: choose one of {sorted(DTYPES)}")
    model = model.to(DTYPES[dtype])
    if activation_checkpointing:
        if not model.supports_gradient_checkpointing:
            raise ValueError(f"model.activation_checkpointing=true: {type(model).__name__} does not support it")
        if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.2x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return apply_lora(model, lora)


def load_hf(
    name_or_path: str, dtype: str, trust_remote_code: bool, activation_checkpointing: bool,
    lora: dict | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM + tokenizer from a local directory.

    A missing pad token gets a dedicated new `<pad>` token (the embedding is resized) instead of
    reusing eos, so that padding never masks the real end of a sequence. Prompts are left-padded for
    batched generation. `dtype`, `activation_checkpointing`, `lora`: see `finish_model`.
    """
    path = Path(name_or_path)
    if not path.exists():
        raise FileNotFoundError(
            f"model.name_or_path={name_or_path!r}: no such local directory (nothing is downloaded)"
        )
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype={dtype!r}: choose one of {sorted(DTYPES)}")
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=DTYPES[dtype], local_files_only=True, trust_remote_code=trust_remote_code
    )
    if tokenizer.pad_token is None:
        tokenizer.add_special_tokens({"pad_token": "<pad>"})
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "left"
    return finish_model(model, dtype, activation_checkpointing, lora), tokenizer
