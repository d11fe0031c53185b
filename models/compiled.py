"""`model.compile`: the training forward's decoder pass (models.lean_llama.train_hidden) through
`torch.compile`, with dynamic shapes: the batch and length dimensions are marked dynamic, so one graph serves
every micro-batch shape instead of a recompile per length (bench/compile_step.py measures what it costs and
what it saves; docs/benchmarks.md has the figure).

Only the decoder's layers are compiled: the LM head's log-probs are a custom autograd Function
(losses/linear_logprobs.py) that already reuses one buffer per chunk.
"""
from __future__ import annotations

import torch

from models import lean_llama

ATTRIBUTE = "_policyshift_compile"  # set on a decoder by `enable`: its train forward goes through compile


def enable(model) -> None:
    """Mark `model`'s decoder (model.get_decoder(), or the model itself) for a compiled training forward."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    setattr(decoder, ATTRIBUTE, True)


def enabled(decoder) -> bool:
    return bool(getattr(decoder, ATTRIBUTE, False))


_compiled = None


def _compiled_train_hidden():
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(lean_llama.train_hidden, dynamic=True)
    return _compiled


def train_hidden(decoder: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """lean_llama.train_hidden, compiled when the decoder is marked (`enable`), eager otherwise."""
    if not enabled(decoder):
        return lean_llama.train_hidden(decoder, input_ids)
    torch._dynamo.mark_dynamic(input_ids, 0)
    torch._dynamo.mark_dynamic(input_ids, 1)
    return _compiled_train_hidden()(decoder, input_ids)
