"""Real-shaped models with random weights, written as a local Hugging Face folder (config, weights,
tokenizer), so `model=hf model.name_or_path=<dir>` runs the real loading path with nothing downloaded.

    python -m models.synthetic /tmp/qwen-like                      # Qwen2 shape, vocabulary 151,936
    python -m models.synthetic /tmp/small --vocab-size 1000 --hidden-size 64 --num-layers 1
    python -m models.synthetic /tmp/chat --tokenizer bpe --hidden-size 64 --num-layers 1   # a chat model

Two tokenizers (`--tokenizer`):
  char  the project's character tokenizer padded with `<extra_i>` tokens to the model's vocabulary size
        (models/tokenizer.py): prompts encode as characters, every id is a real embedding row; one end
        token, <eos>.
  bpe   a byte-level BPE tokenizer trained in code, with ChatML special tokens and chat template
        (models/bpe.py), eos `<|endoftext|>`; the model's generation_config.eos_token_id is the list
        [<|im_end|>, <|endoftext|>] (as Qwen2.5-Instruct's), so a turn ends at a token that is not
        the tokenizer's eos. Its vocabulary is the tokenizer's 500 tokens unless `--vocab-size` asks
        for spare embedding rows (as real checkpoints have).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from models.bpe import build_bpe_tokenizer, chat_stop_ids
from models.tokenizer import build_char_tokenizer

CHAR_VOCAB_SIZE = 151_936  # Qwen2's embedding rows: the char tokenizer's default padded size


def char_tokenizer(vocab_size: int | None) -> tuple[PreTrainedTokenizerFast, int, int | list[int]]:
    """(tokenizer, embedding rows, generation eos ids) for the character tokenizer."""
    tok = build_char_tokenizer(vocab_size or CHAR_VOCAB_SIZE)
    return tok, len(tok), tok.eos_token_id


def bpe_tokenizer(vocab_size: int | None) -> tuple[PreTrainedTokenizerFast, int, int | list[int]]:
    """(tokenizer, embedding rows, generation eos ids) for the ChatML BPE tokenizer."""
    tok = build_bpe_tokenizer()
    if vocab_size is not None and vocab_size < len(tok):
        raise ValueError(f"vocab_size={vocab_size} is smaller than the BPE tokenizer's {len(tok)} tokens")
    return tok, vocab_size or len(tok), chat_stop_ids(tok)


TOKENIZERS = {"char": char_tokenizer, "bpe": bpe_tokenizer}


def write_qwen_like(out: str | Path, vocab_size: int | None = None, hidden_size: int = 256, num_layers: int = 2,
                    num_heads: int = 4, intermediate_size: int = 1024, max_position_embeddings: int = 512,
                    seed: int = 0, tokenizer: str = "char") -> Path:
    """Save a randomly initialised Qwen2ForCausalLM (tied embeddings) and a tokenizer (`tokenizer`: a
    key of TOKENIZERS, see the module docstring) into `out`; returns the folder. `vocab_size`: the
    embedding rows (None: 151,936 for char, the tokenizer's size for bpe)."""
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer={tokenizer!r}: choose one of {sorted(TOKENIZERS)}")
    out = Path(out)
    tok, rows, eos_ids = TOKENIZERS[tokenizer](vocab_size)
    config = Qwen2Config(vocab_size=rows, hidden_size=hidden_size, num_hidden_layers=num_layers,
                         num_attention_heads=num_heads, num_key_value_heads=num_heads,
                         intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings,
                         tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = eos_ids
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--vocab-size", type=int, default=None,
                   help=f"embedding rows (default: {CHAR_VOCAB_SIZE:,} for char, the tokenizer's for bpe)")
    for name, default in (("hidden-size", 256), ("num-layers", 2), ("num-heads", 4),
                          ("intermediate-size", 1024), ("max-position-embeddings", 512), ("seed", 0)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--tokenizer", choices=sorted(TOKENIZERS), default="char",
                   help="char: padded character tokenizer; bpe: ChatML byte-level BPE chat tokenizer")
    a = p.parse_args()
    path = write_qwen_like(a.out, a.vocab_size, a.hidden_size, a.num_layers, a.num_heads, a.intermediate_size,
                           a.max_position_embeddings, a.seed, a.tokenizer)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
