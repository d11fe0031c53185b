"""Real-shaped models with random weights, written as a local Hugging Face folder (config, weights,
tokenizer), so `model=hf model.name_or_path=<dir>` runs the real loading path with nothing downloaded.

    python -m models.synthetic /tmp/qwen-like                      # Qwen2 shape, vocabulary 151,936
    python -m models.synthetic /tmp/small --vocab-size 1000 --hidden-size 64 --num-layers 1

The tokenizer is the project's character tokenizer padded with `<extra_i>` tokens to the model's
vocabulary size (models/tokenizer.py): prompts encode as characters, every id is a real embedding row.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from models.tokenizer import build_char_tokenizer


def write_qwen_like(out: str | Path, vocab_size: int = 151_936, hidden_size: int = 256, num_layers: int = 2,
                    num_heads: int = 4, intermediate_size: int = 1024, max_position_embeddings: int = 512,
                    seed: int = 0) -> Path:
    """Save a randomly initialised Qwen2ForCausalLM (tied embeddings) and a tokenizer of the same
    vocabulary size into `out`; returns the folder."""
    out = Path(out)
    tokenizer = build_char_tokenizer(vocab_size)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=num_heads, num_key_value_heads=num_heads,
                         intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    for name, default in (("vocab-size", 151_936), ("hidden-size", 256), ("num-layers", 2), ("num-heads", 4),
                          ("intermediate-size", 1024), ("max-position-embeddings", 512), ("seed", 0)):
        p.add_argument(f"--{name}", type=int, default=default)
    a = p.parse_args()
    path = write_qwen_like(a.out, a.vocab_size, a.hidden_size, a.num_layers, a.num_heads, a.intermediate_size,
                           a.max_position_embeddings, a.seed)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
