"""`generator=hf`: the KV-cached sampling loop (the seam's contract: generators/base.py).

`sample` returns, per prompt, the generated token ids (cut after the first stop id, unless `ignore_eos`:
the model's generation-config eos ids and the tokenizer's eos, generators.base.stop_ids) and the
per-token log-probs of the distribution actually sampled from: temperature applied, then top-k and top-p
if configured (losses/sampling.py: the one definition the trainers score too).

`HFGenerator` is a KV-cached sampling loop over a Hugging Face model (models/forward.py): each step
computes the logits of the last position only and keeps just the sampled token's log-prob, so memory
is [batch, vocab] for one step, never [batch, new tokens, vocab]. Llama-family models decode through
models.lean_llama (a static KV cache, each group's shared prompt prefilled once); others, and FSDP-sharded
models, through the model's own forward with a DynamicCache.
"""
from __future__ import annotations

import time
from itertools import chain

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from generators.base import GenerationOutput, stop_ids
from hardware.sharding import is_sharded
from losses.sampling import truncate
from models import lean_llama
from models.forward import decoder_and_head, last_position_logits


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad id lists to one [B, T] tensor; returns (input_ids, attention_mask)."""
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
    width = int(lengths.max())
    mask = torch.arange(width) >= (width - lengths).unsqueeze(1)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    ids[mask] = torch.tensor(list(chain.from_iterable(sequences)), dtype=torch.long)  # row-major order
    return ids, mask.long()


MULTINOMIAL_MAX_VOCAB = 4096  # up to this vocabulary: torch.multinomial (the embedded model's stream)


def sample_token(logits: torch.Tensor, temperature: float, top_p: float,
                 top_k: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of logits [B, V] from softmax(logits / temperature) after top-k and top-p
    (losses.sampling.truncate), and its log-prob (score - max - log(sum of weights): log_softmax's
    formula, for the chosen token only).

    Up to MULTINOMIAL_MAX_VOCAB entries, `torch.multinomial` on the unnormalised weights (for one
    sample it is argmax(w / Exp(1) noise): the same draws as on normalised probabilities; every seeded
    result on the embedded tiny model comes from this stream). Larger vocabularies sample by inverse
    CDF instead: one uniform per row against the float64 cumulative weights. The same distribution, but
    one random number a row instead of one per entry: 128 × 32,000 took 105 ms a step through
    multinomial on the 2-core bench machine and 4 ms this way. A zero-weight (top-p removed) token
    can never be drawn: its cumulative sum equals its predecessor's."""
    scores = truncate(logits if temperature == 1.0 else logits / temperature, top_k, top_p)
    top = scores.max(-1, keepdim=True).values
    weights = (scores - top).exp_()
    if weights.shape[-1] <= MULTINOMIAL_MAX_VOCAB:
        token = torch.multinomial(weights, 1)
        total = weights.sum(-1, keepdim=True)
    else:
        cdf = weights.double().cumsum(-1)
        total = cdf[:, -1:]
        u = torch.rand(total.shape, dtype=torch.float64, device=weights.device) * total
        token = torch.searchsorted(cdf, u, right=True).clamp_max_(weights.shape[-1] - 1)
    logp = scores.gather(-1, token) - top - total.log().to(scores.dtype)
    return token.squeeze(-1), logp.squeeze(-1)


class _HFSteps:
    """Decoding through the model's own forward with a DynamicCache (the fallback path): `logits` of
    the prompts' last position after construction, then `advance(token_ids [B, 1])` -> next logits.
    The attention mask is preallocated [B, P + N] (ones after the prompt) and sliced per step."""

    def __init__(self, model, input_ids, attention_mask, max_new_tokens: int):
        B, P = input_ids.shape
        self.model, self.cache, self.filled = model, DynamicCache(), P
        self.mask = attention_mask.new_ones((B, P + max_new_tokens))
        self.mask[:, :P] = attention_mask
        positions = (attention_mask.cumsum(-1) - 1).clamp_min(0)
        self.logits = last_position_logits(model, input_ids, attention_mask, positions, self.cache)
        self.positions = positions[:, -1:]

    def advance(self, token_ids: torch.Tensor) -> torch.Tensor:
        self.filled, self.positions = self.filled + 1, self.positions + 1
        return last_position_logits(self.model, token_ids, self.mask[:, : self.filled], self.positions,
                                    self.cache)


def shared_prompt_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """(first row of each run of identical consecutive prompts [U], run index of every row [B]), or
    None when no two consecutive rows are the same prompt."""
    same = (input_ids[1:] == input_ids[:-1]).all(-1) & (attention_mask[1:] == attention_mask[:-1]).all(-1)
    if not bool(same.any()):
        return None
    starts = torch.cat([same.new_ones(1), ~same])
    return starts.nonzero().squeeze(-1), starts.long().cumsum(0) - 1


class _LeanSteps:
    """Decoding through models.lean_llama with a static KV cache; each distinct consecutive prompt
    (a group's repeats) is prefilled once and its cache rows and logits expanded to the group."""

    def __init__(self, decoder, head, input_ids, attention_mask, max_new_tokens: int):
        self.decoder, self.head = decoder, head
        shared = shared_prompt_rows(input_ids, attention_mask)
        if shared is not None:
            firsts, rows = shared
            input_ids, attention_mask = input_ids.index_select(0, firsts), attention_mask.index_select(0, firsts)
        self.logits, self.state = lean_llama.prefill(decoder, head, input_ids, attention_mask, max_new_tokens,
                                                     None if shared is None else rows)

    def advance(self, token_ids: torch.Tensor) -> torch.Tensor:
        return lean_llama.step(self.decoder, self.head, self.state, token_ids)


def decode_steps(model, input_ids, attention_mask, max_new_tokens: int):
    """The lean decode when models.lean_llama supports the model, else the model's own forward."""
    parts = decoder_and_head(model)
    if parts is not None and not is_sharded(model) and lean_llama.supports(parts[0]):
        return _LeanSteps(*parts, input_ids, attention_mask, max_new_tokens)
    return _HFSteps(model, input_ids, attention_mask, max_new_tokens)


@torch.no_grad()
def sample_tokens(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  max_new_tokens: int, stops: torch.Tensor, pad_id: int, temperature: float = 1.0,
                  top_p: float = 1.0, greedy: bool = False, ignore_eos: bool = False, top_k: int = 0,
                  stop_sequences: list[torch.Tensor] | None = None):
    """KV-cached sampling from left-padded prompts [B, P]. Returns (tokens [B, N], log-probs [B, N] of
    each sampled token under softmax(logits / temperature) after top-k, top-p (0 for greedy), lengths [B]:
    tokens up to and including the first stop id). `stops` [S]: the stop ids, on the prompts' device.
    `stop_sequences`: id sequences that also end a row, once its generated tokens end with one (a tool
    call's close tag in an episode, envs/rollout.py), that sequence included.
    Rows that finished are fed `pad_id` until all finish."""
    B, device = input_ids.shape[0], input_ids.device
    tokens = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logps = torch.zeros((B, max_new_tokens), device=device)
    lengths = torch.full((B,), max_new_tokens, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    steps = decode_steps(model, input_ids, attention_mask, max_new_tokens)
    logits = steps.logits
    for t in range(max_new_tokens):
        if t:
            logits = steps.advance(tokens[:, t - 1 : t])
        if greedy:
            token = logits.argmax(-1)
        else:
            token, logp = sample_token(logits, temperature, top_p, top_k)
            logps[:, t] = logp.masked_fill(done, 0.0)
        tokens[:, t] = token.masked_fill(done, pad_id)
        if not ignore_eos:
            ended = torch.isin(token, stops) & ~done
            for seq in stop_sequences or ():
                if t + 1 >= len(seq):
                    ended |= (tokens[:, t + 1 - len(seq): t + 1] == seq).all(-1) & ~done
            lengths[ended] = t + 1
            done |= ended
            if bool(done.all()):
                break
    return tokens, logps, lengths


class HFGenerator:
    """Batched KV-cached sampling of a Hugging Face model with behaviour log-probs of the sampling
    distribution (exact: the policy's own forward, so `exact_logprobs`)."""

    name = "hf"
    exact_logprobs = True

    def __init__(self, max_new_tokens: int, temperature: float, top_p: float, batch_size: int,
                 ignore_eos: bool = False, top_k: int = 0):
        if temperature <= 0:
            raise ValueError(f"generator.temperature must be > 0 for sampling, got {temperature}")
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p, self.top_k = top_p, top_k
        self.batch_size = batch_size
        self.ignore_eos = ignore_eos

    @property
    def sampling(self) -> dict:
        """The sampling settings recorded in every record's provenance."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "max_new_tokens": self.max_new_tokens}

    @torch.no_grad()
    def sample(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
               prompts: list[list[int]], greedy: bool = False, stop_sequences: list[list[int]] | None = None,
               max_new_tokens: int | None = None) -> GenerationOutput:
        """Generate one completion per prompt (repeat prompts for groups). Model mode is restored.
        An episode's policy turn (envs/rollout.py) also stops at `stop_sequences` (id lists) and may take
        fewer tokens than the generator's `max_new_tokens`."""
        start, was_training = time.perf_counter(), model.training
        model.eval()
        completions, logprobs = [], []
        device = next(model.parameters()).device
        stops = torch.tensor(stop_ids(model, tokenizer), dtype=torch.long, device=device)  # [S], once a call
        sequences = [torch.tensor(s, dtype=torch.long, device=device) for s in stop_sequences or ()]
        limit = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        try:
            for lo in range(0, len(prompts), self.batch_size):
                c, lp = self._batch(model, tokenizer, prompts[lo : lo + self.batch_size], stops, greedy,
                                    sequences, limit)
                completions += c
                logprobs += lp
        finally:
            model.train(was_training)
        return GenerationOutput(completions, logprobs, time.perf_counter() - start)

    def _batch(self, model, tokenizer, prompts, stops, greedy, sequences=(), max_new_tokens=None):
        ids, mask = left_pad(prompts, tokenizer.pad_token_id)
        tokens, logps, lengths = sample_tokens(
            model, ids.to(stops.device), mask.to(stops.device), max_new_tokens or self.max_new_tokens, stops,
            tokenizer.pad_token_id, self.temperature, self.top_p, greedy, self.ignore_eos, self.top_k, sequences)
        tokens, logps, lengths = tokens.tolist(), logps.tolist(), lengths.tolist()
        return ([row[:n] for row, n in zip(tokens, lengths)], [row[:n] for row, n in zip(logps, lengths)])
