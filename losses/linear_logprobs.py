"""Token log-probs through an LM head in chunks, with the gradient computed chunk by chunk too.

`linear_token_logprobs(hidden [N, H], weight [V, H], targets [N], temperature, chunk_rows)` returns
log softmax(hidden @ weightᵀ / temperature)[target] for every row, float32 [N], without ever holding
more than `chunk_rows` rows of logits. A custom autograd Function rather than `checkpoint` around each
chunk: one logits buffer is reused for every chunk (no allocation churn: at a 150k vocabulary each
chunk is tens of MB), and the weight's gradient accumulates in one [V, H] buffer with `addmm_`
instead of one [V, H] gradient per chunk. Backward recomputes each chunk's logits (one extra head
matmul, as checkpointing would) and uses

    d log p_t / d z_j = (1[j = t] − softmax(z / T)_j) / T.

The idea is that of Liger-Kernel's fused linear cross-entropy, here for log-probs whose upstream
gradient (a policy-gradient loss) is only known in backward.

When all the rows' logits fit in `keep_elements` (default KEEP_ELEMENTS: 64 M floats, 256 MB), forward
computes them in one piece and keeps their softmax for backward, which then skips the recompute: the
head is a third of a 32k-vocabulary model's FLOPs at this size, and its recompute a third of that.
Larger batches stay chunked, so memory stays bounded at any vocabulary size.
"""
from __future__ import annotations

import torch

KEEP_ELEMENTS = 1 << 26  # logits kept from forward to backward up to this many (256 MB in float32)


def _spans(n: int, rows: int):
    return [(lo, min(lo + rows, n)) for lo in range(0, n, rows)]


def _logits_into(buf: torch.Tensor, fbuf: torch.Tensor, h: torch.Tensor, weight: torch.Tensor,
                 temperature: float) -> torch.Tensor:
    """float32 logits / temperature of rows `h`, written into the reused buffers; returns the view."""
    n = h.shape[0]
    b, f = buf[:n], fbuf[:n]
    torch.mm(h, weight.t(), out=b)
    if f.data_ptr() != b.data_ptr():
        f.copy_(b)
    if temperature != 1.0:
        f.div_(temperature)
    return f


class _LinearLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, chunk_rows: int, keep_elements: int):
        n, vocab = hidden.shape[0], weight.shape[0]
        whole = n * vocab <= keep_elements  # one piece; its softmax kept when a gradient will be asked
        keep = whole and (ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        rows = max(n, 1) if whole else min(chunk_rows, max(n, 1))
        buf = hidden.new_empty((rows, vocab))
        fbuf = buf if buf.dtype == torch.float32 else buf.new_empty((rows, vocab), dtype=torch.float32)
        out = hidden.new_empty(n, dtype=torch.float32)
        lse = hidden.new_empty(n, dtype=torch.float32)
        for lo, hi in _spans(n, rows):
            z = _logits_into(buf, fbuf, hidden[lo:hi], weight, temperature)
            target_logit = z.gather(1, targets[lo:hi, None]).squeeze(1)
            top = z.amax(1, keepdim=True)
            total = z.sub_(top).exp_().sum(1, keepdim=True)
            lse[lo:hi] = top.squeeze(1) + total.squeeze(1).log()
            out[lo:hi] = target_logit - lse[lo:hi]
            if keep:
                z.div_(total)  # the softmax, for backward
        ctx.save_for_backward(hidden, weight, targets, lse, fbuf[:n] if keep else None)
        ctx.temperature, ctx.rows = temperature, rows
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, targets, lse, probs = ctx.saved_tensors
        temperature, rows = ctx.temperature, ctx.rows
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        buf = hidden.new_empty((rows, weight.shape[0])) if probs is None or probs.dtype != hidden.dtype else None
        fbuf = None
        if probs is None:
            fbuf = buf if buf.dtype == torch.float32 else buf.new_empty(buf.shape, dtype=torch.float32)
        for lo, hi in _spans(hidden.shape[0], rows):
            g = (grad_out[lo:hi].float() / temperature)[:, None]
            if probs is None:  # recompute this chunk's softmax
                z = _logits_into(buf, fbuf, hidden[lo:hi], weight, temperature).sub_(lse[lo:hi, None]).exp_()
            else:              # kept from forward (one backward per forward: it is overwritten here)
                z = probs[lo:hi]
            z.mul_(-g)                                          # −g·softmax / T
            z.scatter_add_(1, targets[lo:hi, None], g)          # + g·onehot / T
            gz = z if z.dtype == hidden.dtype else buf[: hi - lo].copy_(z)
            if want_h:
                torch.mm(gz, weight, out=grad_h[lo:hi])
            if want_w:
                grad_w.addmm_(z.t(), hidden[lo:hi].float())
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None


def linear_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          temperature: float, chunk_rows: int, keep_elements: int = KEEP_ELEMENTS) -> torch.Tensor:
    """log softmax(hidden @ weightᵀ / temperature)[targets], float32 [N]; hidden [N, H], weight [V, H].
    Chunks of `chunk_rows` rows, or one piece kept for backward when N × V ≤ `keep_elements`."""
    return _LinearLogprobs.apply(hidden, weight, targets, float(temperature), max(1, int(chunk_rows)),
                                 int(keep_elements))
