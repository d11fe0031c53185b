"""Forward passes of a Hugging Face causal LM in bounded memory: the decoder's hidden states go through
the LM head chunk by chunk (losses.common.head_token_logprobs), so the [B, T, vocab] logits of a
150k-vocabulary model never exist at once, and generation steps compute logits for the last position
only. Works through peft wrappers (LoRA layers sit inside the decoder and head modules).

Models whose logits are more than `lm_head(hidden)` (Gemma-2's soft-capping, Cohere's logit scale) take
the plain `model(...).logits` path instead, still reduced chunk by chunk. Llama-family decoders on
right-padded batches run models.lean_llama's functional forward (same values, less overhead); with
`model.packing`, rows packed without padding (models/packing.py).
"""
from __future__ import annotations

import inspect
from functools import lru_cache

import torch

from hardware.sharding import is_sharded
from losses.common import head_token_logprobs, token_logprobs
from models import compiled, lean_llama, packing

POST_PROCESSED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def decoder_and_head(model) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder, LM head) of `model`, or None when its logits are not plain `head(decoder(x))`."""
    config = getattr(model, "config", None)
    if any(getattr(config, key, None) not in (None, 1, 1.0) for key in POST_PROCESSED_LOGITS):
        return None
    get_decoder, get_head = getattr(model, "get_decoder", None), getattr(model, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    decoder, head = get_decoder(), get_head()
    if decoder is None or head is None or decoder is model or not hasattr(head, "weight"):
        return None
    return decoder, head


@lru_cache(maxsize=None)
def _cache_keyword(forward_cls: type) -> str:
    """The name of the KV-cache argument (`cache` in transformers ≥ 5.2x, `past_key_values` before)."""
    params = inspect.signature(forward_cls.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def hidden_states(decoder: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  position_ids: torch.Tensor | None = None, cache=None) -> torch.Tensor:
    """Last hidden states [B, L, H] of `decoder` (with `cache`: extends it in place)."""
    kwargs = {"use_cache": cache is not None}
    if cache is not None:
        kwargs[_cache_keyword(type(decoder))] = cache
    out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
    return out.last_hidden_state


def is_right_padded(attention_mask: torch.Tensor | None) -> bool:
    """True when every row of the 0/1 mask is ones then zeros (no 0 → 1 step anywhere)."""
    return attention_mask is None or not bool((attention_mask[:, 1:] > attention_mask[:, :-1]).any())


def sequence_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                            temperature: float, with_hidden: bool = False, first_target: int = 0,
                            top_k: int = 0, top_p: float = 1.0):
    """Log-probs [B, L-1] of input_ids[:, 1:] under softmax(logits / temperature), float32 (after top-k /
    top-p when set: the sampler's processed distribution, losses/sampling.py); with
    `with_hidden`, also the last hidden states [B, L, H] (a shared value head reads them).
    `first_target`: the LM head runs on target positions from this one on only (the batch's first
    completion token: prompt positions need no log-prob), and the columns before it are 0."""
    parts = decoder_and_head(model)
    if parts is None:
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=with_hidden)
        lp = token_logprobs(out.logits[:, first_target:-1], input_ids[:, first_target + 1:], temperature,
                            top_k=top_k, top_p=top_p)
        lp = _pad_left(lp, first_target)
        return (lp, out.hidden_states[-1]) if with_hidden else lp
    decoder, head = parts
    if packing.enabled(model):  # model.packing: rows packed, no compute on padding (models/packing.py)
        out = packing.packed_token_logprobs(decoder, head, input_ids, attention_mask, temperature, with_hidden,
                                            first_target, top_k, top_p)
        if out is not None:
            return out
    if is_sharded(model):
        hidden = hidden_states_through_root(model, decoder, input_ids, attention_mask)
    elif lean_llama.supports(decoder) and is_right_padded(attention_mask):
        hidden = compiled.train_hidden(decoder, input_ids)  # lean_llama's, compiled under model.compile
    else:
        hidden = hidden_states(decoder, input_ids, attention_mask)
    lp = head_token_logprobs(hidden[:, first_target:-1], head, input_ids[:, first_target + 1:], temperature,
                             top_k=top_k, top_p=top_p)
    lp = _pad_left(lp, first_target)
    return (lp, hidden) if with_hidden else lp


def _pad_left(lp: torch.Tensor, columns: int) -> torch.Tensor:
    return torch.cat([lp.new_zeros((lp.shape[0], columns)), lp], dim=1) if columns else lp


def hidden_states_through_root(model, decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden states from a call of the model's own forward (logits of one position
    only), caught by a forward hook. An FSDP2-sharded model must be called through its root: that call
    gathers the root's weights (embeddings, norm, head), which FSDP keeps gathered after a root's
    forward, and schedules the reduce-scatter of their gradients (hardware/sharding.py)."""
    caught = {}

    def catch(module, args, out) -> None:  # returning None keeps the output as it is
        caught["hidden"] = out.last_hidden_state

    handle = decoder.register_forward_hook(catch)
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=1)
    finally:
        handle.remove()
    return caught["hidden"]


def last_position_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, cache) -> torch.Tensor:
    """float32 logits [B, V] of the last position only, extending the KV `cache` in place (an FSDP-sharded
    model through its root's forward, as FSDP requires)."""
    parts = decoder_and_head(model)
    if parts is None or is_sharded(model):
        kwargs = {_cache_keyword(type(model)): cache}
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                    use_cache=True, logits_to_keep=1, **kwargs)
        return out.logits[:, -1].float()
    decoder, head = parts
    hidden = hidden_states(decoder, input_ids, attention_mask, position_ids, cache)
    return head(hidden[:, -1:])[:, -1].float()  # [B, 1, V] as the model's own head call would see
