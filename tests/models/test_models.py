"""The char tokenizer, the tiny policy, the HF loader and the HF generation engine."""
from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models as tk_models, pre_tokenizers
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM,
                          PreTrainedTokenizerFast)

from generators.hf import HFGenerator, left_pad
from losses.common import token_logprobs
from models.hf import load_hf
from models.tokenizer import build_char_tokenizer
from tests.helpers import tiny_model


# ---------------------------------------------------------------- tokenizer
def test_char_tokenizer_roundtrip_and_special_tokens():
    tok = build_char_tokenizer()
    text = "12+34= 46\nAbc!~"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one id per character
    assert tok.decode(ids) == text
    with_bos = tok(text)["input_ids"]
    assert with_bos[0] == tok.bos_token_id and with_bos[1:] == ids
    assert tok.decode(with_bos, skip_special_tokens=True) == text
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id}) == 4
    assert tok.pad_token_id != tok.eos_token_id
    assert tok(" é", add_special_tokens=False)["input_ids"][1] == tok.unk_token_id
    assert build_char_tokenizer().get_vocab() == tok.get_vocab()  # deterministic


# ---------------------------------------------------------------- tiny policy
def test_build_tiny_is_deterministic_from_seed_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a, tok = tiny_model(seed=0)
    assert torch.equal(torch.rand(3), expected_next)  # building did not consume the global stream
    b, _ = tiny_model(seed=0)
    c, _ = tiny_model(seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)
    assert a.config.vocab_size == len(tok) and a.config.hidden_size == 32
    assert a.generation_config.eos_token_id == tok.eos_token_id
    assert a.generation_config.pad_token_id == tok.pad_token_id


def test_save_pretrained_loads_with_auto_classes_alone(tmp_path):
    """No project code is needed to use a saved policy: plain Llama + a tokenizer.json, same logits."""
    model, tok = tiny_model()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "auto_map" not in cfg
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval()
    ltok = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "37+45="
    assert ltok(text)["input_ids"] == tok(text)["input_ids"]
    assert (ltok.pad_token_id, ltok.eos_token_id, ltok.bos_token_id) == (
        tok.pad_token_id, tok.eos_token_id, tok.bos_token_id)
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, loaded(ids).logits)


# ---------------------------------------------------------------- HF loader
def save_model_without_pad(path):
    """A tiny Llama whose tokenizer has no pad token and no '<pad>' in its vocabulary."""
    vocab = {t: i for i, t in enumerate(["<bos>", "<eos>", "<unk>"] + list("0123456789+="))}
    core = Tokenizer(tk_models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", eos_token="<eos>",
                                  unk_token="<unk>")
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=32, max_position_embeddings=32,
                         bos_token_id=0, eos_token_id=1, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    tok.save_pretrained(path)
    assert AutoTokenizer.from_pretrained(path).pad_token is None  # the premise of the test
    return model, len(vocab)


def test_load_hf_without_pad_adds_a_distinct_pad_and_resizes(tmp_path):
    original, n = save_model_without_pad(tmp_path)
    model, tok = load_hf(str(tmp_path), dtype="float32", trust_remote_code=False, activation_checkpointing=False)
    assert tok.pad_token == "<pad>" and tok.pad_token_id == n  # a new id, not eos
    assert tok.pad_token_id != tok.eos_token_id
    assert len(tok) == n + 1
    assert model.get_input_embeddings().weight.shape[0] == n + 1
    assert model.get_output_embeddings().weight.shape[0] == n + 1
    assert model.config.pad_token_id == model.generation_config.pad_token_id == n
    assert tok.padding_side == "left"
    ids = torch.tensor([[0, 4, 13, 5, 14]])
    with torch.no_grad():  # the old tokens' logits are unchanged by the resize
        assert torch.allclose(model(ids).logits[..., :n], original(ids).logits, atol=1e-6)


def test_load_hf_keeps_an_existing_pad_and_refuses_missing_dirs(tmp_path):
    model, tok = tiny_model()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, ltok = load_hf(str(tmp_path), dtype="float32", trust_remote_code=False, activation_checkpointing=False)
    assert ltok.pad_token_id == tok.pad_token_id and len(ltok) == len(tok)
    assert loaded.get_input_embeddings().weight.shape[0] == len(tok)
    with pytest.raises(FileNotFoundError, match="no_such_model"):
        load_hf(str(tmp_path / "no_such_model"), dtype="float32", trust_remote_code=False, activation_checkpointing=False)


# ---------------------------------------------------------------- generation
def test_left_pad():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def prompts_of(tok, texts):
    return [tok(t)["input_ids"] for t in texts]


def test_behaviour_logprobs_are_those_of_the_sampling_distribution():
    """At T=0.7, each recorded log-prob equals log_softmax(logits / 0.7) of a plain forward pass on
    prompt + completion, at the position that predicts that token (left padding must not matter)."""
    model, tok = tiny_model()
    model.train()
    gen = HFGenerator(max_new_tokens=6, temperature=0.7, top_p=1.0, batch_size=2)
    prompts = prompts_of(tok, ["1+2=", "10+99=", "7+7=", "123+4="])
    torch.manual_seed(0)
    out = gen.sample(model, tok, prompts)
    assert model.training  # mode restored
    assert len(out.completions) == 4 and out.seconds > 0
    for p, c, lp in zip(prompts, out.completions, out.logprobs):
        assert len(c) == len(lp) == 6  # an untrained model rarely says eos: full length
        ids = torch.tensor([p + c])
        with torch.no_grad():
            logits = model.eval()(ids).logits
        ref = token_logprobs(logits[:, :-1], ids[:, 1:], temperature=0.7)[0, len(p) - 1:]
        assert torch.allclose(torch.tensor(lp), ref, atol=1e-4)
        plain = token_logprobs(logits[:, :-1], ids[:, 1:], temperature=1.0)[0, len(p) - 1:]
        assert not torch.allclose(torch.tensor(lp), plain, atol=1e-3)  # the temperature is applied
    assert gen.sampling == {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "max_new_tokens": 6}


def test_completions_are_cut_after_eos():
    """Force eos as the 2nd token of row 0 only (a hook on the head): row 0 = [x, eos] with eos kept and
    nothing after it, while the other rows run to max_new_tokens."""
    model, tok = tiny_model()
    eos, calls = tok.eos_token_id, {"n": 0}

    def force_eos(module, inputs, output):
        calls["n"] += 1
        if calls["n"] > 1:  # after the prefill: the 2nd generated token on
            output = output.clone()
            output[0, -1, eos] += 100.0
            return output

    handle = model.lm_head.register_forward_hook(force_eos)
    try:
        out = HFGenerator(max_new_tokens=5, temperature=1.0, top_p=1.0, batch_size=8).sample(
            model, tok, prompts_of(tok, ["1+2=", "3+4=", "5+6="]))
    finally:
        handle.remove()
    assert len(out.completions[0]) == 2 and out.completions[0][-1] == eos
    assert len(out.logprobs[0]) == 2 and out.logprobs[0][-1] == pytest.approx(0.0, abs=1e-3)
    assert all(len(c) == 5 and eos not in c for c in out.completions[1:])


def test_greedy_is_deterministic_and_matches_argmax():
    model, tok = tiny_model()
    gen = HFGenerator(max_new_tokens=5, temperature=0.7, top_p=1.0, batch_size=8)
    prompts = prompts_of(tok, ["1+2=", "45+67="])
    torch.manual_seed(0)
    a = gen.sample(model, tok, prompts, greedy=True)
    torch.manual_seed(1)
    b = gen.sample(model, tok, prompts, greedy=True)
    assert a.completions == b.completions
    p, c = prompts[1], a.completions[1]  # the longer prompt: unpadded; check against step-wise argmax
    ids = torch.tensor([p + c])
    with torch.no_grad():
        logits = model.eval()(ids).logits[0, len(p) - 1: len(p) - 1 + len(c)]
    assert logits.argmax(-1).tolist() == c


def test_generator_refuses_zero_temperature():
    with pytest.raises(ValueError, match="temperature"):
        HFGenerator(max_new_tokens=4, temperature=0.0, top_p=1.0, batch_size=4)


def test_sampling_loop_greedy_equals_transformers_generate():
    """The KV-cached loop (left-padded batch, position ids from the mask) picks exactly the tokens of
    `model.generate(do_sample=False)` for every row, short and long prompts mixed."""
    model, tok = tiny_model(seed=3)
    prompts = prompts_of(tok, ["1+2=", "45+67=", "123+456=", "9="])
    ours = HFGenerator(max_new_tokens=7, temperature=1.0, top_p=1.0, batch_size=8).sample(
        model, tok, prompts, greedy=True)
    ids, mask = left_pad(prompts, tok.pad_token_id)
    with torch.no_grad():
        ref = model.eval().generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=7,
                                    pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    for row, got in zip(ref[:, ids.shape[1]:].tolist(), ours.completions):
        end = row.index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row)
        assert got == row[:end]


def test_generation_keeps_one_step_of_logits_and_top_p_logprobs_are_the_filtered_distribution():
    """Every head call during sampling returns [B, 1, V] (never [B, new tokens, V]); with top_p=0.5
    each sampled token lies inside the nucleus and its log-prob is log_softmax(top_p(logits / T))."""
    from losses.sampling import truncate
    model, tok = tiny_model(seed=4)
    shapes = []
    handle = model.lm_head.register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    prompts = prompts_of(tok, ["1+2=", "45+67="])
    torch.manual_seed(0)
    try:
        out = HFGenerator(max_new_tokens=6, temperature=0.8, top_p=0.5, batch_size=8).sample(model, tok, prompts)
    finally:
        handle.remove()
    assert all(s[:2] == (2, 1) for s in shapes)
    for p, c, lp in zip(prompts, out.completions, out.logprobs):
        ids = torch.tensor([p + c])
        with torch.no_grad():
            logits = model.eval()(ids).logits[0, len(p) - 1: len(p) - 1 + len(c)] / 0.8
        filtered = truncate(logits, 0, 0.5).log_softmax(-1)
        want = filtered.gather(-1, torch.tensor(c).unsqueeze(-1)).squeeze(-1)
        assert torch.isfinite(want).all() and torch.allclose(torch.tensor(lp), want, atol=1e-4)


def test_ignore_eos_gives_full_length_completions():
    model, tok = tiny_model()
    handle = model.lm_head.register_forward_hook(
        lambda m, i, o: o + 100.0 * torch.nn.functional.one_hot(torch.tensor(tok.eos_token_id), o.shape[-1]))
    try:
        out = HFGenerator(max_new_tokens=4, temperature=1.0, top_p=1.0, batch_size=8,
                          ignore_eos=True).sample(model, tok, prompts_of(tok, ["1+2=", "3+4="]))
    finally:
        handle.remove()
    assert [len(c) for c in out.completions] == [4, 4] and out.completions[0][0] == tok.eos_token_id


def test_model_dtype_and_activation_checkpointing(tmp_path):
    """model.dtype loads the weights in that dtype; activation checkpointing recomputes the decoder
    layers in backward and gives the same gradients (float32, to 1e-5)."""
    from models.forward import sequence_token_logprobs
    model, tok = tiny_model(seed=5)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    bf16, _ = load_hf(str(tmp_path), dtype="bfloat16", trust_remote_code=False, activation_checkpointing=False)
    assert bf16.dtype == torch.bfloat16
    grads = []
    for checkpointing in (False, True):
        m, _ = load_hf(str(tmp_path), dtype="float32", trust_remote_code=False,
                       activation_checkpointing=checkpointing)
        m.train()
        assert getattr(m, "is_activation_checkpointing", m.is_gradient_checkpointing) == checkpointing
        ids = torch.tensor([[1, 5, 6, 7, 8, 9]])
        sequence_token_logprobs(m, ids, torch.ones_like(ids), 1.0).sum().backward()
        grads.append(m.model.layers[0].mlp.up_proj.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-5)
    with pytest.raises(ValueError, match="model.dtype"):
        load_hf(str(tmp_path), dtype="float8", trust_remote_code=False, activation_checkpointing=False)
