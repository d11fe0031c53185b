"""The embedded default policy: a small Llama-architecture model built in code with the char tokenizer."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from models.hf import finish_model
from models.tokenizer import build_char_tokenizer


def tiny_config(hidden_size: int, num_layers: int, num_heads: int, intermediate_size: int,
                max_position_embeddings: int, tokenizer: PreTrainedTokenizerBase | None = None) -> LlamaConfig:
    """The tiny model's architecture (its skeleton on the meta device: `LlamaForCausalLM(tiny_config(...))`)."""
    tokenizer = tokenizer or build_char_tokenizer()
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )


def build_tiny(
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    seed: int,
    lora: dict | None = None,
    dtype: str = "float32",
    activation_checkpointing: bool = False,
    packing: bool = False,
    compile: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Build a randomly initialised LlamaForCausalLM and its tokenizer, deterministic from `seed`.

    The result saves with `save_pretrained` and loads back with `AutoModelForCausalLM` and
    `AutoTokenizer` alone, no project code needed. `dtype`, `activation_checkpointing`, `lora`
    (LoraConfig fields), `packing` and `compile`: see models.hf.finish_model.
    """
    tokenizer = build_char_tokenizer()
    config = tiny_config(hidden_size, num_layers, num_heads, intermediate_size, max_position_embeddings, tokenizer)
    devices = []  # fork the RNG so building the model does not shift the run's global random stream
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return finish_model(model, dtype, activation_checkpointing, lora, packing, compile), tokenizer
