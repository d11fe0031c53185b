"""Any Hugging Face causal LM and its tokenizer from a local path (no hub access at run time)."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from models.lora import apply_lora


def load_hf(
    name_or_path: str, dtype: str, trust_remote_code: bool, lora: dict | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM + tokenizer from a local directory.

    A missing pad token gets a dedicated new `<pad>` token (the embedding is resized) instead of
    reusing eos, so that padding never masks the real end of a sequence. Prompts are left-padded for
    batched generation. `lora` (LoraConfig fields) wraps the model in a LoRA adapter.
    """
    path = Path(name_or_path)
    if not path.exists():
        raise FileNotFoundError(
            f"model.name_or_path={name_or_path!r}: no such local directory (nothing is downloaded)"
        )
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype), local_files_only=True, trust_remote_code=trust_remote_code
    )
    if tokenizer.pad_token is None:
        tokenizer.add_special_tokens({"pad_token": "<pad>"})
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "left"
    return apply_lora(model, lora), tokenizer
