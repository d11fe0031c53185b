"""`algorithm.shared_prefix`: GRPO's forwards (the policy's with gradient, the reference's) compute each
distinct prompt of a micro-batch once and its G completions on top (models/shared_prefix.py), instead of
every padded row recomputing its prompt. The same log-probs, loss and gradients as the padded path (tests/
trainers/test_shared_prefix.py); it pays where prompts are long against completions (a long system or tool
prompt; docs/benchmarks.md has the measurement).
"""
from __future__ import annotations

import torch

from data_modules.experience import ExperienceBatch
from models import shared_prefix
from models.shared_prefix import SharedPrefixInputs


def regroup(batch: ExperienceBatch) -> SharedPrefixInputs | None:
    """The batch as distinct prompts + completions (models.shared_prefix.SharedPrefixInputs), or None when
    no two rows share a prompt (nothing to save). Rows share a prompt when their prompt ids are equal."""
    index: dict[tuple[int, ...], int] = {}
    rows = [index.setdefault(tuple(r.prompt_ids), len(index)) for r in batch.records]
    if len(index) == len(rows):
        return None
    device = batch.input_ids.device
    prompts = list(index)
    P = max(len(p) for p in prompts)
    prompt_ids = torch.zeros((len(prompts), P), dtype=torch.long)
    prompt_mask = torch.zeros((len(prompts), P), dtype=torch.long)
    for u, p in enumerate(prompts):  # left-padded: every prompt ends at column P - 1
        prompt_ids[u, P - len(p):] = torch.tensor(p, dtype=torch.long)
        prompt_mask[u, P - len(p):] = 1
    prompt_lengths = torch.tensor([len(r.prompt_ids) for r in batch.records], device=device)
    lengths = batch.attention_mask.sum(-1)
    completion_lengths = lengths - prompt_lengths
    C = max(int(completion_lengths.max()), 1)
    j = torch.arange(C, device=device)
    completion_mask = (j[None, :] < completion_lengths[:, None]).long()
    take = (prompt_lengths[:, None] + j).clamp_max(batch.input_ids.shape[1] - 1)
    completion_ids = batch.input_ids.gather(1, take) * completion_mask
    return SharedPrefixInputs(prompt_ids.to(device), prompt_mask.to(device), torch.tensor(rows, device=device),
                              prompt_lengths, completion_ids, completion_mask, batch.input_ids.shape[1])


def sequence_logprobs(model, batch: ExperienceBatch, temperature: float, top_k: int, top_p: float
                      ) -> torch.Tensor | None:
    """Token log-probs [B, L - 1] of `batch` under `model` with each prompt computed once, laid out as the
    padded path's (0 off the completion tokens); None when the padded path should run instead (no shared
    prompt in the batch, or a model whose logits are not a plain head over a decoder, or an FSDP-sharded one)."""
    if not shared_prefix.supports(model):
        return None
    inputs = regroup(batch)
    if inputs is None:
        return None
    return shared_prefix.shared_prefix_logprobs(model, inputs, temperature, top_k=top_k, top_p=top_p)
