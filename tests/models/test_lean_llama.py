"""models.lean_llama: the functional forward and the static-cache decode equal Hugging Face's forward
(hidden states, gradients, sampled tokens and log-probs) for Llama, Qwen2, Qwen3 and Mistral, LoRA
included; `supports` refuses what it cannot reproduce exactly."""
from __future__ import annotations

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

from generators.hf import sample_token, sample_tokens
from generators import hf as generation
from losses.sampling import truncate
from models import lean_llama
from models.forward import is_right_padded, sequence_token_logprobs

VOCAB, EOS, PAD = 24, 2, 0
SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, max_position_embeddings=64, eos_token_id=EOS, pad_token_id=PAD)
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SMALL, num_key_value_heads=4),
    "llama_gqa_rope_scaled": lambda: transformers.LlamaConfig(
        **SMALL, num_key_value_heads=2, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                         "rope_theta": 10000.0}),
    "qwen2_bias": lambda: transformers.Qwen2Config(**SMALL, num_key_value_heads=2),
    "qwen3_qk_norm": lambda: transformers.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=8),
    "mistral_no_window": lambda: transformers.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=None),
}


def build(name: str, seed: int = 0):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(CONFIGS[name]())
    with torch.no_grad():  # Qwen3's norms start at ones: perturb them so q_norm/k_norm matter
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def right_padded(B: int = 5, L: int = 9, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, L), generator=g)
    lengths = torch.randint(2, L + 1, (B,), generator=g)
    lengths[0] = L
    mask = (torch.arange(L) < lengths[:, None]).long()
    return ids.masked_fill(mask == 0, PAD), mask


def prompts(seed: int = 0, n: int = 4, group: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = [torch.randint(3, VOCAB, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()
           for _ in range(n)]
    return [p for p in out for _ in range(group)]


def grads_of(model, loss) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_hidden_and_grads(model):
    decoder = model.get_decoder()
    ids, mask = right_padded()
    weight = torch.randn(*ids.shape, decoder.config.hidden_size) * mask[..., None]  # valid positions only
    ref = decoder(input_ids=ids, attention_mask=mask).last_hidden_state
    ref_grads = grads_of(model, (ref * weight).sum())
    lean = lean_llama.train_hidden(decoder, ids)
    lean_grads = grads_of(model, (lean * weight).sum())
    valid = mask.bool()
    assert torch.allclose(lean[valid], ref[valid], atol=1e-5)
    assert ref_grads.keys() == lean_grads.keys() and ref_grads
    for n in ref_grads:  # to 1e-5 of each gradient's scale (they reach ~300: float32 rounding is ~3e-5)
        scale = ref_grads[n].abs().max().clamp_min(1.0)
        assert (lean_grads[n] - ref_grads[n]).abs().max() <= 1e-5 * scale, n


@pytest.mark.parametrize("name", list(CONFIGS))
def test_train_hidden_and_gradients_equal_hf(name):
    model = build(name)
    assert lean_llama.supports(model.get_decoder())
    model.train()  # no dropout configured: training mode is exact too
    assert lean_llama.supports(model.get_decoder())
    assert_same_hidden_and_grads(model)


def test_sequence_token_logprobs_lean_path_equals_hf_path(monkeypatch):
    model = build("qwen2_bias")
    ids, mask = right_padded(seed=1)
    assert is_right_padded(mask) and not is_right_padded(mask.flip(-1))
    calls = []
    real = lean_llama.train_hidden
    monkeypatch.setattr(lean_llama, "train_hidden", lambda d, i: calls.append(1) or real(d, i))
    lean = sequence_token_logprobs(model, ids, mask, 0.7)
    assert calls == [1]
    sequence_token_logprobs(model, ids.flip(-1), mask.flip(-1), 0.7)  # left-padded: HF's forward
    assert calls == [1]
    monkeypatch.setattr(lean_llama, "supports", lambda d: False)
    ref = sequence_token_logprobs(model, ids, mask, 0.7)
    valid = mask[:, 1:].bool()
    assert torch.allclose(lean[valid], ref[valid], atol=1e-5)


def run_sampler(model, batch, seed, lean: bool, monkeypatch, share: bool = True, **kw):
    ids, mask = generation.left_pad(batch, PAD)
    with monkeypatch.context() as m:
        if not lean:
            m.setattr(lean_llama, "supports", lambda d: False)
        if not share:
            m.setattr(generation, "shared_prompt_rows", lambda i, a: None)
        torch.manual_seed(seed)
        return sample_tokens(model, ids, mask, kw.pop("n", 8), EOS, PAD, **kw)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("mode", ["sample", "greedy", "top_p_ignore_eos"])
def test_lean_decode_equals_hf_loop(name, mode, monkeypatch):
    """Same tokens, log-probs and eos lengths as the HF loop under one seed, from left-padded prompts of
    different lengths, repeated in groups (shared prefill) or not."""
    model = build(name, seed=1)
    kw = {"sample": dict(temperature=0.9), "greedy": dict(greedy=True),
          "top_p_ignore_eos": dict(temperature=1.3, top_p=0.8, ignore_eos=True)}[mode]
    for group in (1, 3):
        batch = prompts(seed=2, n=5, group=group)
        ref = run_sampler(model, batch, 7, False, monkeypatch, **kw)
        got = run_sampler(model, batch, 7, True, monkeypatch, **kw)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[2], ref[2])
        assert torch.allclose(got[1], ref[1], atol=1e-5)
        if mode == "sample" and group == 3:
            assert (ref[2] < 8).any()  # some rows ended on eos (small vocabulary)


def test_shared_prefill_runs_each_prompt_once_and_changes_nothing(monkeypatch):
    model = build("llama", seed=2)
    batch = prompts(seed=3, n=4, group=4) + prompts(seed=4, n=1)  # a trailing single row too
    shapes = []
    handle = model.get_decoder().embed_tokens.register_forward_hook(lambda m, i, o: shapes.append(o.shape[0]))
    try:
        shared = run_sampler(model, batch, 11, True, monkeypatch, temperature=1.0)
    finally:
        handle.remove()
    assert shapes[0] == 5 and set(shapes[1:]) == {17}
    unshared = run_sampler(model, batch, 11, True, monkeypatch, share=False, temperature=1.0)
    assert torch.equal(shared[0], unshared[0]) and torch.equal(shared[2], unshared[2])
    assert torch.allclose(shared[1], unshared[1], atol=1e-6)


def test_lora_equals_hf(monkeypatch):
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(build("llama_gqa_rope_scaled", seed=3),
                           LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # lora_B starts at zero: make the adapters matter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    assert lean_llama.supports(model.get_decoder())
    assert_same_hidden_and_grads(model)
    batch = prompts(seed=5, n=3, group=2)
    ref = run_sampler(model, batch, 3, False, monkeypatch, temperature=1.0)
    got = run_sampler(model, batch, 3, True, monkeypatch, temperature=1.0)
    assert torch.equal(got[0], ref[0]) and torch.allclose(got[1], ref[1], atol=1e-5)


def test_supports_refuses_what_it_cannot_reproduce():
    mistral = AutoModelForCausalLM.from_config(transformers.MistralConfig(**SMALL, num_key_value_heads=2))
    assert mistral.config.sliding_window is not None and not lean_llama.supports(mistral.get_decoder())
    windowed = AutoModelForCausalLM.from_config(
        transformers.Qwen2Config(**SMALL, use_sliding_window=True, sliding_window=4, max_window_layers=1))
    assert not lean_llama.supports(windowed.get_decoder())
    checkpointed = build("llama")
    enable = getattr(checkpointed, "activation_checkpointing_enable", None)  # transformers ≥ 5.2x
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    checkpointed.train()
    assert not lean_llama.supports(checkpointed.get_decoder())
    checkpointed.eval()  # HF does not checkpoint in eval mode either: exact, so allowed
    assert lean_llama.supports(checkpointed.get_decoder())
    dropout = AutoModelForCausalLM.from_config(transformers.LlamaConfig(**SMALL, attention_dropout=0.1))
    assert lean_llama.supports(dropout.eval().get_decoder()) and not lean_llama.supports(dropout.train().get_decoder())
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=VOCAB))
    assert not lean_llama.supports(gpt2.get_decoder())


def test_sample_token_draws_as_log_softmax_and_multinomial():
    """The one-exp sampler picks the tokens the former log_softmax + exp + multinomial did under the same
    seed, with the same log-probs."""
    g = torch.Generator().manual_seed(0)
    for seed in range(20):
        logits = 3 * torch.randn(16, 500, generator=g)
        for top_p in (1.0, 0.7):
            torch.manual_seed(seed)
            token, logp = sample_token(logits, 0.8, top_p)
            torch.manual_seed(seed)
            scores = logits / 0.8
            if top_p < 1.0:
                scores = truncate(scores, 0, top_p)
            want = scores.log_softmax(-1)
            old = torch.multinomial(want.exp(), 1).squeeze(-1)
            assert torch.equal(token, old)
            assert torch.allclose(logp, want.gather(-1, old[:, None]).squeeze(-1), atol=1e-5)


def test_left_pad_vectorised():
    ids, mask = generation.left_pad([[5, 6, 7], [8], [9, 10]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8], [0, 9, 10]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]] and mask.dtype == torch.long
