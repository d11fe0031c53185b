"""A character-level tokenizer built in code (no hub download), wrapped as a PreTrainedTokenizerFast.

Vocabulary: four special tokens, then every printable ASCII character. Deterministic: the same
characters always get the same ids, so a saved policy and a rebuilt tokenizer agree.
"""
from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
CHARACTERS = [c for c in string.printable if c not in "\t\n\r\x0b\x0c"] + ["\n"]


def build_char_tokenizer(vocab_size: int | None = None) -> PreTrainedTokenizerFast:
    """Return a fast character tokenizer: pad=0, bos=1, eos=2, unk=3, then one id per character.

    Encoding a prompt prepends <bos>; completions are encoded with add_special_tokens=False and the
    caller appends <eos>. pad and eos are distinct, so padding never masks the real end of a sequence.
    `vocab_size` pads the vocabulary with `<extra_i>` tokens up to that size (a real model's
    vocabulary size, e.g. Qwen2's 151,936, for memory work; text still encodes one id per character).
    """
    tokens = SPECIAL_TOKENS + CHARACTERS
    if vocab_size is not None:
        if vocab_size < len(tokens):
            raise ValueError(f"vocab_size={vocab_size} is smaller than the {len(tokens)} base tokens")
        tokens = tokens + [f"<extra_{i}>" for i in range(vocab_size - len(tokens))]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
    )
    tok.padding_side = "left"
    tok.model_max_length = 4096
    return tok
