"""Log-probs of targets and the one masked reduction every loss goes through."""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from losses.linear_logprobs import KEEP_ELEMENTS, linear_token_logprobs
from losses.sampling import processed_logprobs, truncates


CHUNK_ELEMENTS = 1 << 23  # logits per chunk (32 MB in float32): bounds memory at any vocabulary size


def _chunk_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, top_k: int = 0,
                    top_p: float = 1.0) -> torch.Tensor:
    """log softmax(logits / temperature)[target] for rows [N, V], targets [N], in float32; with top-k /
    top-p, of the truncated distribution the sampler draws from (losses/sampling.py)."""
    return processed_logprobs(logits.float() / temperature, targets, top_k, top_p)


def _chunks(n_rows: int, vocab: int, chunk_elements: int):
    step = max(1, chunk_elements // max(vocab, 1))
    return [(lo, min(lo + step, n_rows)) for lo in range(0, n_rows, step)]


def _plain_linear(head) -> bool:
    """A bias-free nn.Linear with plain (not sharded, not adapter-wrapped) weights."""
    return (type(head) is torch.nn.Linear and head.bias is None
            and type(head.weight.data) is torch.Tensor and not head.weight.is_meta)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                   chunk_elements: int = CHUNK_ELEMENTS, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Log-prob of each target token under softmax(logits / temperature), after top-k / top-p when set
    (the sampler's processed distribution, losses/sampling.py).

    logits [B, T, V], targets [B, T] (already shifted: targets[:, t] is predicted by logits[:, t]).
    Returns [B, T] in float32, as logit[target] - logsumexp(logits), `chunk_elements` logits at a time:
    no float32 copy of the whole [B, T, V] exists (under autograd each chunk is recomputed in backward).
    """
    return head_token_logprobs(logits, None, targets, temperature, chunk_elements, top_k=top_k, top_p=top_p)


def head_token_logprobs(hidden: torch.Tensor, head, targets: torch.Tensor, temperature: float = 1.0,
                        chunk_elements: int = CHUNK_ELEMENTS, keep_elements: int = KEEP_ELEMENTS,
                        top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Like `token_logprobs`, from hidden states [B, T, H] through `head` (the LM head, H → V), chunk by
    chunk: the [B, T, V] logits never exist at once (head=None: `hidden` already holds the logits).
    A plain linear head computes up to `keep_elements` logits in one piece and keeps their softmax
    for backward instead of recomputing it (losses/linear_logprobs.py); with top-k / top-p the chunks
    go through `processed_logprobs` instead (the fused path knows the full softmax only)."""
    shape = targets.shape
    flat, tgt = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    vocab = head.weight.shape[0] if head is not None else flat.shape[-1]
    if _plain_linear(head) and flat.dtype != head.weight.dtype:  # e.g. a norm's float32 output before
        flat = flat.to(head.weight.dtype)                        # a 16-bit head
    if _plain_linear(head) and not truncates(top_k, top_p):  # the fused path: one reused logits buffer
        rows = max(1, chunk_elements // vocab)                 # and one weight-gradient buffer
        return linear_token_logprobs(flat, head.weight, tgt, temperature, rows, keep_elements).view(shape)
    fn = (lambda h, t: _chunk_logprobs(head(h), t, temperature, top_k, top_p)) if head is not None else (
        lambda h, t: _chunk_logprobs(h, t, temperature, top_k, top_p))
    spans = _chunks(flat.shape[0], vocab, chunk_elements)
    recompute = torch.is_grad_enabled() and len(spans) > 1
    out = [checkpoint(fn, flat[lo:hi], tgt[lo:hi], use_reentrant=False) if recompute else fn(flat[lo:hi], tgt[lo:hi])
           for lo, hi in spans]
    return (torch.cat(out) if out else flat.new_zeros(0, dtype=torch.float32)).view(shape)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` over positions where mask == 1 (0 if the mask is empty)."""
    return (values * mask).sum() / mask.sum().clamp_min(1.0)


def weighted_share(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ values·weights / Σ weights (0 when the weights sum to 0): e.g. the |advantage|-weighted share of tokens
    clipped. Unlike masked_mean, weights below one are not clamped."""
    total = weights.sum()
    return torch.where(total > 0, (values * weights).sum() / torch.where(total > 0, total, 1.0), 0.0 * total)


def _token_mean(values, mask, max_len):
    return masked_mean(values, mask)


def _sequence_mean(values, mask, max_len):
    per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
    return per_seq.mean()


def _sequence_sum_norm(values, mask, max_len):
    # Dr.GRPO: sum over tokens divided by a constant (max generation length), mean over sequences,
    # so that long and short answers are not weighted by their own length.
    return ((values * mask).sum(-1) / max_len).mean()


AGGREGATIONS = {
    "token_mean": _token_mean,
    "seq_mean_token_mean": _sequence_mean,
    "seq_mean_token_sum_norm": _sequence_sum_norm,
}


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean",
              max_len: int | None = None) -> torch.Tensor:
    """Reduce a per-token quantity [B, T] under `mask` [B, T] to a scalar.

    token_mean:               sum(v·m) / sum(m)                 (every token weighs the same)
    seq_mean_token_mean:      mean_b[ sum_t(v·m) / sum_t(m) ]   (every sequence weighs the same)
    seq_mean_token_sum_norm:  mean_b[ sum_t(v·m) / max_len ]    (Dr.GRPO; max_len defaults to T)
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation mode {mode!r}; choose one of {sorted(AGGREGATIONS)}")
    return AGGREGATIONS[mode](values, mask, max_len or values.shape[-1])


def aggregation_weight(mask: torch.Tensor, mode: str) -> float:
    """How much a micro-batch weighs when `aggregate`d losses of micro-batches are combined into the
    loss of their whole batch: its mask's tokens for token_mean, its sequences for the per-sequence
    modes. Σ_i loss_i · w_i / Σ_i w_i is then exactly the whole batch's aggregate."""
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation mode {mode!r}; choose one of {sorted(AGGREGATIONS)}")
    return float(mask.sum()) if mode == "token_mean" else float(mask.shape[0])
