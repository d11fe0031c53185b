"""A group's prompt computed once: token log-probs of completions that share prompts, from one forward over
the distinct prompts and one over the completions on top of their (repeated) keys and values.

GRPO samples G completions of each prompt; a padded batch recomputes the prompt in every row. Here the
distinct prompts [U, P] (left-padded, so every prompt ends at column P - 1) run once, and the completions
[B, C] (right-padded) attend to their prompt's keys/values picked by `rows` [B] (row b's prompt is
prompt row rows[b]) plus their own causal keys, at positions p_b, p_b + 1, ... The picked keys/values and
the prompt's last hidden state (which predicts the first completion token) are an `index_select` of the
prompt's tensors, not detached: its backward is an index_add, so the gradient through a prompt is the sum
over the rows that share it, exactly as the padded path's.

Two implementations of the same maths:
- Llama-family decoders (models.lean_llama.supports): a functional pass through the decoder's own modules.
- any other Hugging Face decoder: its own forward over the prompts with a KV cache, the cache's rows
  repeated (`reorder_cache`, an index_select), then its forward over the completions with that cache.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hardware.sharding import is_sharded
from losses.common import head_token_logprobs
from models import lean_llama
from models.forward import decoder_and_head, hidden_states


@dataclass
class SharedPrefixInputs:
    """A batch regrouped by prompt. prompt_ids / prompt_mask [U, P]: the distinct prompts, LEFT-padded;
    rows [B]: each row's prompt; prompt_lengths [B]; completion_ids / completion_mask [B, C]: RIGHT-padded;
    width: L of the padded batch the log-probs are laid out for (its targets are [B, L - 1])."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    rows: torch.Tensor
    prompt_lengths: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    width: int


def supports(model) -> bool:
    """Whether `model`'s logits are a plain head over a decoder that is not FSDP-sharded (a sharded model
    must be called through its root: models/forward.py)."""
    return decoder_and_head(model) is not None and not is_sharded(model)


def shared_prefix_logprobs(model, inputs: SharedPrefixInputs, temperature: float, top_k: int = 0,
                           top_p: float = 1.0, generic: bool = False) -> torch.Tensor:
    """Log-probs [B, width - 1] laid out as models.forward.sequence_token_logprobs lays out the padded batch
    (column t: the log-prob of token t + 1), at the completion tokens' columns p_b - 1 ... p_b + c_b - 2, 0
    elsewhere. `generic`: Hugging Face's forward with a cache even for a Llama-family decoder (tests)."""
    decoder, head = decoder_and_head(model)
    if not generic and lean_llama.supports(decoder):
        last, hidden = _lean_hidden(decoder, inputs)
    else:
        last, hidden = _cached_hidden(decoder, inputs)
    # The hidden state before completion token j: the prompt's last for j = 0, the completion's j - 1 after.
    before = torch.cat([last.index_select(0, inputs.rows)[:, None], hidden[:, :-1]], dim=1)  # [B, C, H]
    valid = inputs.completion_mask.bool()
    lp = head_token_logprobs(before[valid], head, inputs.completion_ids[valid], temperature,
                             top_k=top_k, top_p=top_p)  # [N] in row-major order of `valid`
    B, L = valid.shape[0], inputs.width
    columns = torch.arange(L - 1, device=valid.device)
    start = (inputs.prompt_lengths - 1)[:, None]
    targets = (columns >= start) & (columns < start + valid.sum(-1, keepdim=True))
    return lp.new_zeros((B, L - 1)).masked_scatter(targets, lp)


def _lean_hidden(decoder, inputs: SharedPrefixInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(the prompts' last hidden states [U, H], the completions' hidden states [B, C, H]), final norm
    applied, through the decoder's own modules (models/lean_llama.py's pieces)."""
    keep, rows = inputs.prompt_mask.bool(), inputs.rows
    U, P = keep.shape
    C = inputs.completion_ids.shape[1]
    device = keep.device
    eye = torch.eye(P, dtype=torch.bool, device=device)
    prompt_attn = ((torch.ones(P, P, dtype=torch.bool, device=device).tril() & keep[:, None, :]) | eye)[:, None]
    causal = torch.ones(C, C, dtype=torch.bool, device=device).tril()
    completion_attn = torch.cat([keep.index_select(0, rows)[:, None, :].expand(-1, C, -1),
                                 causal.expand(rows.shape[0], -1, -1)], dim=2)[:, None]  # [B, 1, C, P + C]
    xp = decoder.embed_tokens(inputs.prompt_ids)
    xc = decoder.embed_tokens(inputs.completion_ids)
    cos_p, sin_p = lean_llama._rotary(decoder, xp, (inputs.prompt_mask.long().cumsum(-1) - 1).clamp_min(0))
    completion_positions = inputs.prompt_lengths[:, None] + torch.arange(C, device=device)
    cos_c, sin_c = lean_llama._rotary(decoder, xc, completion_positions)
    for layer in decoder.layers:
        attn = layer.self_attn
        qp, kp, vp = lean_llama._qkv(attn, layer.input_layernorm(xp), cos_p, sin_p)
        qc, kc, vc = lean_llama._qkv(attn, layer.input_layernorm(xc), cos_c, sin_c)
        op = lean_llama._attend(attn, qp, kp, vp, mask=prompt_attn)
        k = torch.cat([kp.index_select(0, rows), kc], dim=2)
        v = torch.cat([vp.index_select(0, rows), vc], dim=2)
        oc = lean_llama._attend(attn, qc, k, v, mask=completion_attn)
        xp, xc = lean_llama._finish_layer(layer, xp, op), lean_llama._finish_layer(layer, xc, oc)
    return decoder.norm(xp[:, -1]), decoder.norm(xc)


def _cached_hidden(decoder, inputs: SharedPrefixInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The same through Hugging Face's forward: the prompts with a fresh DynamicCache, its rows repeated by
    `rows` (index_select, gradient kept), then the completions with the attention mask prompt ∥ completion."""
    from transformers import DynamicCache

    cache = DynamicCache(config=decoder.config)
    positions = (inputs.prompt_mask.long().cumsum(-1) - 1).clamp_min(0)
    prompt_hidden = hidden_states(decoder, inputs.prompt_ids, inputs.prompt_mask, positions, cache)
    cache.reorder_cache(inputs.rows)
    C = inputs.completion_ids.shape[1]
    mask = torch.cat([inputs.prompt_mask.index_select(0, inputs.rows), torch.ones_like(inputs.completion_mask)], 1)
    completion_positions = inputs.prompt_lengths[:, None] + torch.arange(C, device=mask.device)
    hidden = hidden_states(decoder, inputs.completion_ids, mask, completion_positions, cache)
    return prompt_hidden[:, -1], hidden
