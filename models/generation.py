"""Generation engines behind one seam (`generator=hf`, `generator=vllm`).

`sample` returns, per prompt, the generated token ids (cut after the first eos, unless `ignore_eos`)
and the per-token log-probs of the distribution actually sampled from: temperature applied, no hidden
top-k, top-p only if configured.

`HFGenerator` is a KV-cached sampling loop over a Hugging Face model (models/forward.py): each step
computes the logits of the last position only and keeps just the sampled token's log-prob, so memory
is [batch, vocab] for one step, never [batch, new tokens, vocab].
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from models.forward import last_position_logits


@dataclass
class GenerationOutput:
    """completions[i]: generated ids for prompt i (eos included if produced); logprobs[i]: same length."""

    completions: list[list[int]]
    logprobs: list[list[float]]
    seconds: float


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists to one [B, T] tensor; returns (input_ids, attention_mask)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        ids[i, width - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        mask[i, width - len(seq) :] = 1
    return ids, mask


def top_p_filter(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Scores [B, V] with the tokens outside the smallest set of probability ≥ top_p set to -inf
    (as transformers' TopPLogitsWarper: the most likely token is always kept)."""
    sorted_scores, order = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(-1).cumsum(-1)
    remove = cumulative <= (1 - top_p)
    remove[..., -1:] = False
    return scores.masked_fill(remove.scatter(1, order, remove), float("-inf"))


@torch.no_grad()
def sample_tokens(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  max_new_tokens: int, eos_id: int, pad_id: int, temperature: float = 1.0,
                  top_p: float = 1.0, greedy: bool = False, ignore_eos: bool = False):
    """KV-cached sampling from left-padded prompts [B, P]. Returns (tokens [B, N], log-probs [B, N] of
    each sampled token under softmax(logits / temperature) after top-p (0 for greedy), lengths [B]:
    tokens up to and including the first eos). Rows that finished are fed `pad_id` until all finish."""
    B, device = input_ids.shape[0], input_ids.device
    tokens = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logps = torch.zeros((B, max_new_tokens), device=device)
    lengths = torch.full((B,), max_new_tokens, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    cache, mask = DynamicCache(), attention_mask
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    step_ids = input_ids
    for t in range(max_new_tokens):
        logits = last_position_logits(model, step_ids, mask, positions, cache)
        if greedy:
            token = logits.argmax(-1)
        else:
            scores = logits / temperature
            if top_p < 1.0:
                scores = top_p_filter(scores, top_p)
            logp = scores.log_softmax(-1)
            token = torch.multinomial(logp.exp(), 1).squeeze(-1)
            logps[:, t] = logp.gather(-1, token.unsqueeze(-1)).squeeze(-1).masked_fill(done, 0.0)
        tokens[:, t] = token.masked_fill(done, pad_id)
        if not ignore_eos:
            ended = (token == eos_id) & ~done
            lengths[ended] = t + 1
            done |= ended
            if bool(done.all()):
                break
        step_ids = tokens[:, t : t + 1]
        mask = torch.cat([mask, mask.new_ones((B, 1))], dim=1)
        positions = positions[:, -1:] + 1
    return tokens, logps, lengths


class HFGenerator:
    """Batched KV-cached sampling of a Hugging Face model with behaviour log-probs of the sampling
    distribution (exact: the policy's own forward, so `exact_logprobs`)."""

    name = "hf"
    exact_logprobs = True

    def __init__(self, max_new_tokens: int, temperature: float, top_p: float, batch_size: int,
                 ignore_eos: bool = False):
        if temperature <= 0:
            raise ValueError(f"generator.temperature must be > 0 for sampling, got {temperature}")
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.batch_size = batch_size
        self.ignore_eos = ignore_eos

    @property
    def sampling(self) -> dict:
        """The sampling settings recorded in every record's provenance."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": 0,
                "max_new_tokens": self.max_new_tokens}

    @torch.no_grad()
    def sample(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
               prompts: list[list[int]], greedy: bool = False) -> GenerationOutput:
        """Generate one completion per prompt (repeat prompts for groups). Model mode is restored."""
        start, was_training = time.perf_counter(), model.training
        model.eval()
        completions, logprobs = [], []
        try:
            for lo in range(0, len(prompts), self.batch_size):
                c, lp = self._batch(model, tokenizer, prompts[lo : lo + self.batch_size], greedy)
                completions += c
                logprobs += lp
        finally:
            model.train(was_training)
        return GenerationOutput(completions, logprobs, time.perf_counter() - start)

    def _batch(self, model, tokenizer, prompts, greedy):
        device = next(model.parameters()).device
        ids, mask = left_pad(prompts, tokenizer.pad_token_id)
        tokens, logps, lengths = sample_tokens(
            model, ids.to(device), mask.to(device), self.max_new_tokens, tokenizer.eos_token_id,
            tokenizer.pad_token_id, self.temperature, self.top_p, greedy, self.ignore_eos)
        tokens, logps, lengths = tokens.tolist(), logps.tolist(), lengths.tolist()
        return ([row[:n] for row, n in zip(tokens, lengths)], [row[:n] for row, n in zip(logps, lengths)])
