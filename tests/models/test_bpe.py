"""The byte-level BPE chat tokenizer (models/bpe.py) and the chat model folder models/synthetic.py writes
with it: ChatML specials and template, a separate pad, a generation config whose eos is a list."""
from __future__ import annotations

import json
import sys

import pytest
from transformers import AutoTokenizer

from models.bpe import BPE_VOCAB_SIZE, ENDOFTEXT, IM_END, IM_START, PAD, build_bpe_tokenizer
from models.hf_checks import check_folder
from models import synthetic
from models.synthetic import write_qwen_like
from tasks.base import encode_completion, encode_prompt
from tests.helpers import CHAT_MODEL, chat_model

TEXTS = ["12+34=46", "The answer is 46.", "héllo ✓ ﬁ", "You are a helpful assistant.\n\n  x"]


def test_bpe_tokenizer_is_deterministic_byte_level_and_roundtrips():
    tok = build_bpe_tokenizer()
    assert len(tok) == BPE_VOCAB_SIZE and build_bpe_tokenizer().get_vocab() == tok.get_vocab()
    assert [tok.convert_tokens_to_ids(t) for t in (ENDOFTEXT, IM_START, IM_END, PAD)] == [0, 1, 2, 3]
    for text in TEXTS:
        ids = tok(text)["input_ids"]  # no bos, as Qwen2.5
        assert tok.decode(ids) == text  # unseen characters encode as their UTF-8 bytes
    assert len(tok("The answer is", add_special_tokens=False)["input_ids"]) == 3  # words merged
    assert tok("12", add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids(c) for c in "12"]


def test_bpe_special_tokens_pad_eos_and_chat_template():
    tok = build_bpe_tokenizer()
    assert tok.eos_token == ENDOFTEXT and tok.pad_token == PAD and tok.bos_token is None
    assert tok.pad_token_id != tok.eos_token_id  # padding never looks like an end (DESIGN §12)
    assert {IM_START, IM_END} <= set(tok.all_special_tokens) and tok.padding_side == "left"
    ids = encode_prompt(tok, "12+34=", chat=True)
    assert tok.decode(ids) == "<|im_start|>user\n12+34=<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(ids, skip_special_tokens=True) == "user\n12+34=\nassistant\n"
    full = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": "46"}], tokenize=False)
    assert full == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n" \
                   "<|im_start|>assistant\n46<|im_end|>\n"
    assert encode_completion(tok, "46")[-1] == tok.eos_token_id


def test_chat_model_folder_loads_through_models_hf_with_the_same_ids(tmp_path):
    """AutoTokenizer loads the qwen2-type folder as Qwen2Tokenizer, which rebuilds normaliser and
    pre-tokeniser from its own code: they are Qwen2's already, so every id is the built tokenizer's."""
    policy, tok = chat_model(tmp_path)
    built = build_bpe_tokenizer()
    assert check_folder(tmp_path)["vocab_size"] == len(built) == policy.config.vocab_size
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    im_end = built.convert_tokens_to_ids(IM_END)
    assert gen["eos_token_id"] == [im_end, built.eos_token_id] == policy.generation_config.eos_token_id
    assert (tok.eos_token_id, tok.pad_token_id, tok.padding_side) == (built.eos_token_id, built.pad_token_id, "left")
    assert tok.get_vocab() == built.get_vocab() and tok.chat_template == built.chat_template
    for text in TEXTS:
        for chat in (False, True):
            assert encode_prompt(tok, text, chat) == encode_prompt(built, text, chat)
    assert AutoTokenizer.from_pretrained(tmp_path).decode([im_end], skip_special_tokens=True) == ""


def test_chat_model_vocab_size_and_cli(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="smaller than the BPE tokenizer"):
        write_qwen_like(tmp_path / "small", vocab_size=100, tokenizer="bpe", **CHAT_MODEL)
    with pytest.raises(ValueError, match="choose one of"):
        write_qwen_like(tmp_path / "x", tokenizer="sentencepiece", **CHAT_MODEL)
    monkeypatch.setattr(sys, "argv", ["synthetic", str(tmp_path / "cli"), "--tokenizer", "bpe", "--vocab-size",
                                      "512", "--hidden-size", "32", "--num-layers", "1", "--num-heads", "2",
                                      "--intermediate-size", "64"])
    synthetic.main()
    config = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert config["vocab_size"] == 512 and config["pad_token_id"] == 3  # spare rows, as real checkpoints
    assert json.loads((tmp_path / "cli" / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
