"""models/packing.py: the packed layout by hand (first-fit decreasing, positions, the block-diagonal mask),
and packed against padded log-probs, hidden states and gradients on random lengths, for the default tiny
Llama (lean forward), a Qwen2 with grouped-query attention (lean forward), and architectures that run
transformers' own packed path (Gemma, OLMo, GPT-2), which a probe checks before trusting."""
from __future__ import annotations

import pytest
import torch
import transformers

from models import packing
from models.forward import sequence_token_logprobs
from models.tiny import build_tiny


def test_layout_by_hand():
    """Lengths 3, 1, 2 in a width-3 batch: row 0 fills pack 0; row 2 (2 tokens) then row 1 (1 token) share
    pack 1, positions 0 1 | 0, rows kept apart by the mask."""
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])
    lay = packing.layout(mask)
    assert (lay.packs, lay.width) == (2, 3)
    assert lay.position_ids.tolist() == [[0, 1, 2], [0, 1, 0]]
    assert lay.segments.tolist() == [[0, 0, 0], [2, 2, 1]]
    ids = torch.tensor([[5, 6, 7], [8, 0, 0], [9, 10, 0]])
    assert lay.pack(ids).tolist() == [[5, 6, 7], [9, 10, 8]]
    assert torch.equal(lay.unpack(lay.pack(ids)), ids)
    allowed = lay.attention_bias(torch.float32)[1, 0] == 0  # pack 1: 9 10 | 8
    assert allowed.tolist() == [[True, False, False], [True, True, False], [False, False, True]]
    assert (lay.attention_bias(torch.float32)[0, 0] == 0).tolist() == [[True, False, False],
                                                                      [True, True, False], [True, True, True]]


def test_tail_is_its_own_segment_and_no_row_split():
    mask = torch.tensor([[1] * 5, [1, 1, 0, 0, 0], [1, 1, 0, 0, 0]])  # 2 + 2 in a width-5 pack: 1 tail slot
    lay = packing.layout(mask)
    assert lay.position_ids.tolist()[1] == [0, 1, 0, 1, 0] and lay.segments.tolist()[1] == [1, 1, 2, 2, 4]
    assert packing.first_fit_decreasing([4, 3, 2, 1, 2], 4) == [[0], [1, 3], [2, 4]]


def test_no_layout_when_packing_saves_nothing_or_left_padded():
    assert packing.layout(torch.ones(4, 6, dtype=torch.long)) is None  # uniform lengths: one row a pack
    assert packing.layout(torch.tensor([[0, 1, 1], [1, 1, 1], [0, 0, 1]])) is None  # left-padded
    nine_full = [[1, 1, 1, 1]] * 9
    saves_little = torch.tensor(nine_full + [[1, 1, 0, 0]] * 2)  # 11 rows → 10 packs: 40 of 44 positions
    assert packing.layout(saves_little) is None
    assert packing.layout(torch.tensor(nine_full[:7] + [[1, 1, 0, 0]] * 2)).packs == 8  # 32 of 36: packed


def random_batch(vocab: int, rows: int = 9, width: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, width + 1, (rows,), generator=g)
    lengths[0] = width
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    return torch.randint(3, vocab, (rows, width), generator=g) * mask, mask


def packed_vs_padded(model, first_target: int = 0, with_hidden: bool = False):
    """(padded, packed) log-probs (and hidden states), and the gradients of a masked sum of each."""
    ids, mask = random_batch(model.config.vocab_size)
    assert packing.layout(mask).packs < len(ids)  # the batch does pack
    params = [p for p in model.parameters() if p.requires_grad]
    out = []
    for on in (False, True):
        packing.enable(model, on)
        res = sequence_token_logprobs(model, ids, mask, 0.7, with_hidden=with_hidden, first_target=first_target)
        lp, hidden = res if with_hidden else (res, None)
        loss = (lp * mask[:, 1:] * torch.linspace(0.5, 1.5, lp.shape[1])).sum()
        if hidden is not None:
            loss = loss + (hidden.sum(-1) * mask).sum() * 0.01
        out.append((lp, hidden, torch.autograd.grad(loss, params)))
    valid = mask[:, 1:].bool()
    valid[:, :first_target] = False
    return (*out, valid, mask.bool())


def assert_equal_paths(model, **kw):
    (a, ha, ga), (b, hb, gb), valid, tokens = packed_vs_padded(model, **kw)
    assert torch.allclose(a[valid], b[valid], atol=1e-5), (a - b)[valid].abs().max()
    if ha is not None:
        assert torch.allclose(ha[tokens], hb[tokens], atol=1e-5)
    assert all(torch.allclose(x, y, atol=1e-5, rtol=1e-4) for x, y in zip(ga, gb))
    assert any(x.abs().sum() > 0 for x in gb)


def test_tiny_llama_packed_equals_padded():
    model, _ = build_tiny(32, 2, 2, 64, 64, seed=0)
    assert_equal_paths(model)
    assert_equal_paths(model, first_target=5, with_hidden=True)


def test_qwen2_gqa_packed_equals_padded():
    cfg = transformers.Qwen2Config(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64)
    torch.manual_seed(0)
    assert_equal_paths(transformers.Qwen2ForCausalLM(cfg), first_target=3, with_hidden=True)


@pytest.mark.parametrize("arch", ["gemma", "olmo", "gpt2"])
def test_transformers_packed_path_equals_padded(arch):
    """Architectures the lean forward does not cover run their own forward on packs (position ids, no
    mask): transformers builds the block-diagonal mask; GPT-2's absolute positions come from the ids."""
    torch.manual_seed(0)
    common = dict(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, max_position_embeddings=64, num_key_value_heads=4, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2)
    model = {"gemma": lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(head_dim=16, **common)),
             "olmo": lambda: transformers.OlmoForCausalLM(transformers.OlmoConfig(**common)),
             "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
                 vocab_size=120, n_embd=64, n_layer=2, n_head=4, attn_pdrop=0.0, resid_pdrop=0.0,
                 embd_pdrop=0.0, bos_token_id=1, eos_token_id=2))}[arch]()
    decoder = model.get_decoder()
    assert not packing.lean_llama.supports(decoder) and packing._hf_packs_supported(decoder)
    assert_equal_paths(model, first_target=2, with_hidden=True)


def test_probe_refuses_a_decoder_that_lets_rows_see_each_other(monkeypatch):
    """A decoder that ignores the packed positions (here: transformers' packed-sequence detection
    switched off, so the packs get one causal mask) fails the probe and keeps the padded forward."""
    model, _ = build_tiny(32, 1, 2, 64, 64, seed=0)
    decoder = model.get_decoder()
    monkeypatch.setattr(transformers.masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
    assert packing._hf_probe(decoder) is False
    monkeypatch.undo()
    assert packing._hf_probe(decoder) is True


def test_enabled_follows_the_model_config_through_a_peft_wrapper():
    model, _ = build_tiny(32, 1, 2, 64, 64, seed=0, packing=True,
                          lora={"r": 4, "lora_alpha": 8, "target_modules": "all-linear"})
    assert packing.enabled(model) and packing.enabled(model.get_base_model().get_decoder())
    plain, _ = build_tiny(32, 1, 2, 64, 64, seed=0)
    assert not packing.enabled(plain)
