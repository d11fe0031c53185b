"""The generator seam (`generator=hf|vllm`): what every engine returns. An engine is built from the
`generator` config group and called as `engine.sample(model, tokenizer, prompts, ...)`; it returns, per
prompt, the sampled token ids and the log-probs of the distribution it actually sampled from, never a
[batch, tokens, vocab] tensor. Engines: generators/hf.py (a KV-cached loop), generators/vllm.py."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class GenerationOutput:
    """completions[i]: generated ids for prompt i (eos included if produced); logprobs[i]: same length."""

    completions: list[list[int]]
    logprobs: list[list[float]]
    seconds: float
