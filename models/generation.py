"""Generation engines behind one seam (`generator=hf`; a vLLM engine would implement the same call).

`sample` returns, per prompt, the generated token ids (cut after the first eos) and the per-token
log-probs of the distribution actually sampled from: temperature applied, no hidden top-k (transformers
applies top_k=50 by default when sampling; we pass top_k=0), top-p only if configured.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase


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


class HFGenerator:
    """Batched `model.generate` with behaviour log-probs of the sampling distribution."""

    name = "hf"

    def __init__(self, max_new_tokens: int, temperature: float, top_p: float, batch_size: int):
        if temperature <= 0:
            raise ValueError(f"generator.temperature must be > 0 for sampling, got {temperature}")
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.batch_size = batch_size

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
        kwargs = dict(do_sample=False) if greedy else dict(
            do_sample=True, temperature=self.temperature, top_k=0, top_p=self.top_p)
        out = model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device),
            max_new_tokens=self.max_new_tokens, pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id, return_dict_in_generate=True,
            output_scores=not greedy, **kwargs,
        )
        new = out.sequences[:, ids.shape[1] :].cpu()
        if greedy:
            token_lp = torch.zeros(new.shape)
        else:  # processed scores = logits after temperature/top-p: the distribution sampled from
            scores = torch.stack(out.scores, dim=1).float().log_softmax(-1).cpu()
            token_lp = scores.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        return self._cut_at_eos(new, token_lp, tokenizer.eos_token_id)

    @staticmethod
    def _cut_at_eos(new: torch.Tensor, token_lp: torch.Tensor, eos_id: int):
        completions, logprobs = [], []
        for row, lp in zip(new.tolist(), token_lp.tolist()):
            end = row.index(eos_id) + 1 if eos_id in row else len(row)
            completions.append(row[:end])
            logprobs.append(lp[:end])
        return completions, logprobs
