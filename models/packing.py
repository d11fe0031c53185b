"""Padding-free training forward (`model.packing`): the rows of a right-padded batch are packed into
fewer, fuller sequences ("packs") so that the decoder's matmuls and attention stop running on padding.

A batch [B, L] whose rows hold lengths n_i (its attention mask: ones then zeros) is laid out by first-fit
decreasing into P packs of width C = max n_i: each pack holds whole rows back to back, each row with its
own position ids 0..n_i-1, and an attention mask that keeps rows apart (block-diagonal causal: a token
sees the earlier tokens of its own row only). A pack's unused tail is one more segment of its own,
attended by nothing else. So every valid token sees exactly the keys it sees in the padded forward, at
the same positions: the hidden states, log-probs, values and gradients are the padded path's (up to the
float summation order of the matmuls; tests/models/test_packing.py).

Two decoders run packs:
- Llama-family decoders `models.lean_llama.supports` (the default tiny model, Llama, Qwen2, Qwen3,
  Mistral): the lean functional forward with the block mask as an additive sdpa bias [P, 1, C, C];
- other Hugging Face decoders built on `transformers.masking_utils.create_causal_mask` (transformers 5):
  their own forward with `position_ids` and no attention mask, from which transformers derives the same
  block-diagonal mask (flash-attention-2 on a GPU runs it as varlen attention); a 4-token probe, once per
  decoder, checks that the model really keeps packed rows apart before any training forward uses it.
Anything else (FSDP-sharded models, remote code, a left-padded batch) keeps the padded forward, and so
does a batch where packing saves little (fewer than MIN_SAVING of its positions: rows of similar lengths).

The outputs have the padded shapes ([B, L-1] log-probs, [B, L, H] hidden states), so every loss reads
them as before; positions past a row's end hold 0 (the padded path's values there are masked anyway).
"""
from __future__ import annotations

import inspect
import sys
import weakref
from dataclasses import dataclass

import torch

from hardware.sharding import is_sharded
from losses.common import head_token_logprobs
from models import lean_llama
# lean_llama's building blocks (the same maths as its padded forward), reused for packs
from models.lean_llama import _attend, _finish_layer, _qkv, _rotary

FLAG = "_policyshift_packing"  # the attribute `enable` sets on a model and its decoder
MIN_SAVING = 0.1  # pack only when the packs hold at least 10 % fewer positions than the padded batch: below
                 # that the block mask and the layout cost about what they save (a tiny GRPO-like batch,
                 # 128 rows into 124 packs: within noise of padded)
_hf_verified: "weakref.WeakKeyDictionary[torch.nn.Module, bool]" = weakref.WeakKeyDictionary()


def enable(model, on: bool) -> None:
    """Switch the packed forward on or off for `model` (and its decoder, which a separate PPO critic
    copies): `model.packing` in the model config (models/hf.finish_model)."""
    setattr(model, FLAG, bool(on))
    try:  # transformers' get_decoder raises for the few models without a rule
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    except (AttributeError, ValueError, NotImplementedError):
        decoder = None
    if decoder is not None and decoder is not model:
        setattr(decoder, FLAG, bool(on))


def enabled(model) -> bool:
    """Whether `model` (a causal LM or its decoder) runs the packed forward."""
    return bool(getattr(model, FLAG, False)) and not is_sharded(model)


@dataclass
class PackLayout:
    """Where each valid token of a right-padded [B, L] batch sits in the packs [P, C].

    rows, cols: [N] the token's row and in-row position in the batch; slots: [N] its index in the
    flattened packs [P * C]; position_ids, segments: [P, C] (a pack's tail: its own segment)."""

    batch: int
    length: int
    packs: int
    width: int
    rows: torch.Tensor
    cols: torch.Tensor
    slots: torch.Tensor
    position_ids: torch.Tensor
    segments: torch.Tensor

    def pack(self, values: torch.Tensor, fill=0) -> torch.Tensor:
        """[B, L, ...] batch values → [P, C, ...] packs (tails: `fill`)."""
        flat = values.new_full((self.packs * self.width, *values.shape[2:]), fill)
        flat[self.slots] = values[self.rows, self.cols]
        return flat.view(self.packs, self.width, *values.shape[2:])

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """[P, C, ...] packs → [B, L, ...] (0 past each row's end), differentiable."""
        flat = packed.reshape(self.packs * self.width, *packed.shape[2:])
        out = flat.new_zeros((self.batch * self.length, *packed.shape[2:]))
        out = out.index_copy(0, self.rows * self.length + self.cols, flat[self.slots])
        return out.view(self.batch, self.length, *packed.shape[2:])

    def attention_bias(self, dtype: torch.dtype) -> torch.Tensor:
        """Additive sdpa mask [P, 1, C, C]: 0 where a query may see a key (same segment, not later), -inf else."""
        col = torch.arange(self.width, device=self.segments.device)
        same = self.segments[:, :, None] == self.segments[:, None, :]
        allowed = same & (col[None, None, :] <= col[None, :, None])
        bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return bias.masked_fill_(~allowed, float("-inf")).unsqueeze(1)


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Row indices grouped into packs of at most `capacity` tokens, longest rows first, each row into the
    first pack it fits in (rows of equal length keep their order)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    packs: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = lengths[i]
        for p, free in enumerate(room):
            if n <= free:
                packs[p].append(i)
                room[p] -= n
                break
        else:
            packs.append([i])
            room.append(capacity - n)
    return packs


def layout(attention_mask: torch.Tensor) -> PackLayout | None:
    """The packs of a right-padded batch, or None when packing saves too little (under MIN_SAVING of the
    padded positions) or the batch is not right-padded."""
    mask = attention_mask.bool()
    if bool((mask[:, 1:] & ~mask[:, :-1]).any()):  # a 0 → 1 step: not right-padded
        return None
    lengths = mask.sum(-1).tolist()
    width = max(lengths) if lengths else 0
    if width == 0:
        return None
    most = (1.0 - MIN_SAVING) * len(lengths) * width  # the positions packs may hold and still pay
    if sum(lengths) > most:  # no packing of these tokens can (rows of similar lengths): no layout work
        return None
    groups = first_fit_decreasing(lengths, width)
    if len(groups) * width > most:
        return None
    B, L, device = mask.shape[0], mask.shape[1], mask.device
    pack_of, offset, used = [0] * B, [0] * B, []
    for p, group in enumerate(groups):
        at = 0
        for i in group:
            pack_of[i], offset[i] = p, at
            at += lengths[i]
        used.append(at)
    rows, cols = mask.nonzero(as_tuple=True)
    pack_t, offset_t = torch.tensor(pack_of, device=device), torch.tensor(offset, device=device)
    slots = pack_t[rows] * width + offset_t[rows] + cols
    col = torch.arange(width, device=device)[None, :]
    used_t = torch.tensor(used, device=device)[:, None]
    tail = col >= used_t
    P = len(groups)
    position_ids = torch.where(tail, col - used_t, 0).view(-1)
    segments = torch.where(tail, B + torch.arange(P, device=device)[:, None], 0).view(-1)
    position_ids[slots], segments[slots] = cols, rows
    return PackLayout(B, L, P, width, rows, cols, slots, position_ids.view(P, width), segments.view(P, width))


def _hf_packs_supported(decoder) -> bool:
    """A transformers decoder whose mask comes from `masking_utils.create_causal_mask` (which reads packed
    rows from `position_ids` when no attention mask is given), and which a probe finds exact: once per
    decoder, three rows of 2, 1 and 1 tokens, packed against padded, in eval mode without gradients.
    Silent cross-row attention (a model that does not hand its positions to the mask) fails the probe."""
    try:
        return _hf_verified[decoder]
    except KeyError:
        ok = _hf_verified[decoder] = _hf_probe(decoder)
        return ok
    except TypeError:  # not weak-referenceable
        return _hf_probe(decoder)


def _hf_probe(decoder) -> bool:
    module = sys.modules.get(type(decoder).__module__)
    if module is None or not hasattr(module, "create_causal_mask"):
        return False
    if "position_ids" not in inspect.signature(decoder.forward).parameters:
        return False
    try:
        from transformers.masking_utils import find_packed_sequence_indices  # noqa: F401
    except ImportError:
        return False
    vocab = decoder.get_input_embeddings().num_embeddings
    device = decoder.get_input_embeddings().weight.device
    ids = (torch.tensor([[1, 2], [3, 0], [2, 0]], device=device) + 3) % vocab
    mask = torch.tensor([[1, 1], [1, 0], [1, 0]], device=device)
    lay = layout(mask)
    was_training = decoder.training
    decoder.eval()
    try:
        with torch.no_grad():
            padded = decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            out = decoder(input_ids=lay.pack(ids), attention_mask=None, position_ids=lay.position_ids,
                          use_cache=False).last_hidden_state
    except Exception:  # noqa: BLE001 - a decoder that cannot take packs keeps the padded forward
        return False
    finally:
        decoder.train(was_training)
    packed, valid = lay.unpack(out).float(), mask.bool()
    return bool(torch.allclose(packed[valid], padded.float()[valid], atol=1e-3, rtol=1e-3))


def packed_hidden(decoder, input_ids: torch.Tensor, lay: PackLayout) -> torch.Tensor | None:
    """Last hidden states [P, C, H] of the packs, or None when `decoder` cannot run them."""
    ids = lay.pack(input_ids)
    if lean_llama.supports(decoder):
        x = decoder.embed_tokens(ids)
        cos, sin = _rotary(decoder, x, lay.position_ids)
        bias = lay.attention_bias(x.dtype)
        for layer in decoder.layers:
            q, k, v = _qkv(layer.self_attn, layer.input_layernorm(x), cos, sin)
            x = _finish_layer(layer, x, _attend(layer.self_attn, q, k, v, mask=bias.to(q.dtype)))
        return decoder.norm(x)
    if _hf_packs_supported(decoder):
        out = decoder(input_ids=ids, attention_mask=None, position_ids=lay.position_ids, use_cache=False)
        return out.last_hidden_state
    return None


def decoder_hidden(decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Last hidden states [B, L, H] of a decoder (a PPO critic's backbone): packed when enabled and
    possible, else the decoder's own padded forward."""
    if enabled(decoder):
        lay = layout(attention_mask)
        hidden = packed_hidden(decoder, input_ids, lay) if lay is not None else None
        if hidden is not None:
            return lay.unpack(hidden)
    return decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def packed_token_logprobs(decoder, head, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                          temperature: float, with_hidden: bool, first_target: int, top_k: int, top_p: float):
    """`models.forward.sequence_token_logprobs` through packs: log-probs [B, L-1] (and hidden states
    [B, L, H] with `with_hidden`), or None when the batch or the decoder is not for packing. The LM head
    runs on each row's target positions from `first_target` on, only up to its end."""
    lay = layout(attention_mask)
    hidden = packed_hidden(decoder, input_ids, lay) if lay is not None else None
    if hidden is None:
        return None
    ends = attention_mask.sum(-1)[lay.rows]  # each valid token's row length
    wanted = (lay.cols >= first_target) & (lay.cols + 1 < ends)  # the token predicts one of its own row
    slots, rows, cols = lay.slots[wanted], lay.rows[wanted], lay.cols[wanted]
    flat = hidden.reshape(lay.packs * lay.width, -1)
    targets = lay.pack(input_ids).view(-1)[slots + 1]
    lp = head_token_logprobs(flat[slots].unsqueeze(0), head, targets.unsqueeze(0), temperature,
                             top_k=top_k, top_p=top_p)[0]
    out = lp.new_zeros(lay.batch * (lay.length - 1)).index_copy(0, rows * (lay.length - 1) + cols, lp)
    out = out.view(lay.batch, lay.length - 1)
    return (out, lay.unpack(hidden)) if with_hidden else out
