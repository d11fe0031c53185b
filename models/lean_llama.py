"""A lean functional forward of Llama-family decoders (Llama, Qwen2, Qwen3, Mistral): the same maths as
Hugging Face's forward, minus its wrappers (mask building, cache objects, output capture, per-layer
keyword plumbing), which cost about a third of a small model's forward.

It calls the decoder's own submodules (embeddings, norms, q/k/v/o projections, MLP, rotary embedding),
so peft LoRA layers, which replace `q_proj` and friends, and forward hooks keep working.

- `train_hidden`: last hidden states of a RIGHT-padded batch (positions 0..L-1, causal attention and
  no mask: under a causal mask a right pad never reaches a valid position).
- `prefill` / `step`: decoding from LEFT-padded prompts with a preallocated static KV cache; `prefill`
  can run each distinct prompt once and expand its cache rows to the repeated rows (`rows`).

`supports(decoder)` says when these are exact; callers keep Hugging Face's forward otherwise.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hardware.sharding import is_sharded

MODEL_TYPES = {"llama", "qwen2", "qwen3", "mistral"}
LAYER_CLASSES = {"LlamaDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer", "MistralDecoderLayer"}
ATTENTION_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")
MLP_PARTS = ("gate_proj", "up_proj", "down_proj", "act_fn")
_structure_ok: "weakref.WeakKeyDictionary[torch.nn.Module, bool]" = weakref.WeakKeyDictionary()


def _structure(decoder: torch.nn.Module) -> bool:
    """True when `decoder` is built like a Llama/Qwen2/Qwen3/Mistral decoder with full causal attention
    in every layer (no sliding window, no other layer types)."""
    config = getattr(decoder, "config", None)
    if config is None or getattr(config, "model_type", None) not in MODEL_TYPES:
        return False
    if getattr(config, "sliding_window", None) is not None or getattr(config, "use_sliding_window", False):
        return False
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        return False
    if not all(hasattr(decoder, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    layers = decoder.layers
    if len(layers) != config.num_hidden_layers:
        return False
    for layer in layers:
        if type(layer).__name__ not in LAYER_CLASSES:
            return False
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if not (hasattr(layer, "input_layernorm") and hasattr(layer, "post_attention_layernorm")):
            return False
        if attn is None or not all(hasattr(attn, name) for name in ATTENTION_PARTS):
            return False
        if hasattr(attn, "q_norm") != hasattr(attn, "k_norm"):
            return False
        if mlp is None or not all(hasattr(mlp, name) for name in MLP_PARTS):
            return False
    return True


def supports(decoder: torch.nn.Module) -> bool:
    """Whether the lean passes equal `decoder`'s own forward. The structure is checked once per decoder;
    per call: not FSDP-sharded, and while training no gradient checkpointing and no attention dropout
    (in eval mode Hugging Face applies neither, so the lean passes stay exact there)."""
    try:
        ok = _structure_ok[decoder]
    except KeyError:
        ok = _structure_ok[decoder] = _structure(decoder)
    except TypeError:  # not weak-referenceable
        ok = _structure(decoder)
    if not ok or is_sharded(decoder):
        return False
    if decoder.training:
        if getattr(decoder, "gradient_checkpointing", False):
            return False
        if float(getattr(decoder.config, "attention_dropout", 0.0) or 0.0) > 0.0:
            return False
    return True


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [B, heads, L, D] with cos/sin [B, 1, L, D] (Hugging Face's rotate_half)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _qkv(attn, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Queries [B, heads, L, D] and keys, values [B, kv_heads, L, D] of normed hidden states h [B, L, H],
    rotary applied (and Qwen3's per-head q_norm/k_norm before it)."""
    B, L, _ = h.shape
    shape = (B, L, -1, attn.head_dim)
    q, k, v = attn.q_proj(h).view(shape), attn.k_proj(h).view(shape), attn.v_proj(h).view(shape)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    return _rotate(q, cos, sin), _rotate(k, cos, sin), v


def _attend(attn, q, k, v, mask=None, causal=False) -> torch.Tensor:
    """sdpa with the layer's scale; grouped-query attention when there are fewer kv heads."""
    gqa = k.shape[1] != q.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=attn.scaling,
                                          enable_gqa=gqa)


def _finish_layer(layer, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """Residual adds around the output projection of attention output o [B, heads, L, D] and the MLP."""
    B, L, _ = x.shape
    x = x + layer.self_attn.o_proj(o.transpose(1, 2).reshape(B, L, -1))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def _rotary(decoder, x: torch.Tensor, positions: torch.Tensor):
    """cos, sin [B or 1, 1, L, D] for positions [B or 1, L] (the decoder's own rope, scaling included)."""
    cos, sin = decoder.rotary_emb(x, positions)
    return cos.unsqueeze(1), sin.unsqueeze(1)


def train_hidden(decoder: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Last hidden states [B, L, H] of a right-padded batch; equal to
    `decoder(input_ids, attention_mask).last_hidden_state` at the valid positions."""
    x = decoder.embed_tokens(input_ids)
    cos, sin = _rotary(decoder, x, torch.arange(input_ids.shape[1], device=x.device).unsqueeze(0))
    for layer in decoder.layers:
        q, k, v = _qkv(layer.self_attn, layer.input_layernorm(x), cos, sin)
        x = _finish_layer(layer, x, _attend(layer.self_attn, q, k, v, causal=True))
    return decoder.norm(x)


@dataclass
class DecodeState:
    """Static KV cache of a decode: keys/values [B, kv_heads, P + N, D] per layer, key_bias [B, P + N]
    (0: attend, -inf: a pad key; the generated part is all 0; additive masks run faster than boolean
    ones in CPU sdpa), filled: columns written so far, positions [B, 1]: the next token's position id."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_bias: torch.Tensor
    filled: int
    positions: torch.Tensor


def _logits(decoder, head, x: torch.Tensor) -> torch.Tensor:
    """float32 logits [B, V] of the last position, the head seeing [B, 1, H] as in the model's own call."""
    return head(decoder.norm(x[:, -1:]))[:, -1].float()


def prefill(decoder, head, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
            rows: torch.Tensor | None = None) -> tuple[torch.Tensor, DecodeState]:
    """Run left-padded prompts [U, P] and return (logits [B, V] of their last position, the cache).
    `rows` [B] (optional) maps each output row to its prompt row, so a prompt repeated for a group is
    computed once; without it B = U. Every query row also sees itself, so pad rows stay finite."""
    U, P = input_ids.shape
    rows = torch.arange(U, device=input_ids.device) if rows is None else rows
    keep = attention_mask.bool()
    positions = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    eye = torch.eye(P, dtype=torch.bool, device=keep.device)
    mask = (torch.ones(P, P, dtype=torch.bool, device=keep.device).tril() & keep[:, None, :]) | eye
    mask = mask.unsqueeze(1)  # [U, 1, P, P]
    x = decoder.embed_tokens(input_ids)
    cos, sin = _rotary(decoder, x, positions)
    B, size = rows.shape[0], P + max_new_tokens
    keys, values = [], []
    for layer in decoder.layers:
        q, k, v = _qkv(layer.self_attn, layer.input_layernorm(x), cos, sin)
        k_cache = k.new_empty((B, k.shape[1], size, k.shape[3]))
        v_cache = torch.empty_like(k_cache)
        k_cache[:, :, :P] = k.index_select(0, rows)
        v_cache[:, :, :P] = v.index_select(0, rows)
        keys.append(k_cache)
        values.append(v_cache)
        x = _finish_layer(layer, x, _attend(layer.self_attn, q, k, v, mask=mask))
    key_bias = x.new_zeros((B, size))
    key_bias[:, :P].masked_fill_(~keep.index_select(0, rows), float("-inf"))
    state = DecodeState(keys, values, key_bias, P, positions[:, -1:].index_select(0, rows) + 1)
    return _logits(decoder, head, x).index_select(0, rows), state


def step(decoder, head, state: DecodeState, token_ids: torch.Tensor) -> torch.Tensor:
    """Feed one token per row (token_ids [B, 1]), extend `state` in place, return logits [B, V]."""
    t = state.filled
    x = decoder.embed_tokens(token_ids)
    cos, sin = _rotary(decoder, x, state.positions)
    mask = state.key_bias[:, None, None, : t + 1]
    for layer, k_cache, v_cache in zip(decoder.layers, state.keys, state.values):
        q, k, v = _qkv(layer.self_attn, layer.input_layernorm(x), cos, sin)
        k_cache[:, :, t] = k[:, :, 0]
        v_cache[:, :, t] = v[:, :, 0]
        o = _attend(layer.self_attn, q, k_cache[:, :, : t + 1], v_cache[:, :, : t + 1], mask=mask)
        x = _finish_layer(layer, x, o)
    state.filled, state.positions = t + 1, state.positions + 1
    return _logits(decoder, head, x)
