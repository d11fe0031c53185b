"""The generator seam (`generator=hf|vllm`): what every engine returns. An engine is built from the
`generator` config group and called as `engine.sample(model, tokenizer, prompts, ...)`; it returns, per
prompt, the sampled token ids and the log-probs of the distribution it actually sampled from, never a
[batch, tokens, vocab] tensor.

Every engine stops a completion at the first of the model's stop ids (`stop_ids`), that token included,
unless `ignore_eos`; and everything that asks whether a completion finished (rollout metrics, rewards'
text) asks with the same ids. Engines: generators/hf.py (a KV-cached loop), generators/vllm.py, generators/vllm_server.py
(vLLM servers in their own processes)."""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass


@dataclass
class GenerationOutput:
    """completions[i]: generated ids for prompt i (its stop id included if produced); logprobs[i]: same
    length. policy_version: the weights version every completion was sampled with, from an engine that
    holds its own numbered copy (generator=vllm_server inside `at_version`); None: the caller's policy."""

    completions: list[list[int]]
    logprobs: list[list[float]]
    seconds: float
    policy_version: int | None = None


def stop_ids(model, tokenizer) -> list[int]:
    """The ids that end a completion: `model.generation_config.eos_token_id` (an int, a list, or absent)
    then `tokenizer.eos_token_id`, each once, in that order.

    A chat model ends its turn with a token that is often not the tokenizer's eos, and lists it in its
    generation config: Qwen2.5-Instruct's <|im_end|>, Llama-3-Instruct's <|eot_id|>, Gemma's
    <end_of_turn>. Stopping at the tokenizer's eos alone runs past the end of the turn, and the policy is
    then trained on what it wrote after it."""
    config = getattr(model, "generation_config", None)
    ids = getattr(config, "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    ids.append(getattr(tokenizer, "eos_token_id", None))
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


def finished(completion: list[int], stops: list[int] | set[int]) -> bool:
    """Whether a completion ended at a stop id (and not at the token limit)."""
    return bool(completion) and completion[-1] in stops


def completion_texts(tokenizer, completions: list[list[int]], stops: list[int]) -> list[str]:
    """Completions as the text that rewards and logs see: a final stop id dropped (even one the tokenizer
    does not count as special), other special tokens skipped."""
    stop_set = set(stops)
    return tokenizer.batch_decode([c[:-1] if finished(c, stop_set) else c for c in completions],
                                  skip_special_tokens=True)


def sampling_precision(generator, precision):
    """The block a round samples in: `precision` (the trainer's forward context, e.g. bf16-mixed's
    autocast) for an engine that samples with the policy's own forward (`exact_logprobs`: generator=hf),
    so that its behaviour log-probs are those of the forward the trainer scores with (in float32 they
    were not: fresh data showed ratio_max 1.0047 under bf16-mixed, and a GPU decoded in float32); nothing
    for an engine with its own weights and dtype (generator=vllm: model.dtype, its mismatch is logged)."""
    return precision if getattr(generator, "exact_logprobs", False) else nullcontext()


@contextmanager
def weights_loaded(generator, model, tokenizer):
    """A block over which the policy's weights do not change (a round, an evaluation), the engine's copy
    loaded at its start: generator=vllm syncs here, on every rank together (under FSDP one gathered
    parameter at a time), outside the block's uneven per-rank passes, and its `sample` calls inside
    sync no more. Nothing for an engine that samples with the policy itself (generator=hf)."""
    load = getattr(generator, "load_weights", None)
    if load is None:
        yield
        return
    with weights_held(generator):
        load(model, tokenizer)
        yield

def at_version(generator, model, tokenizer, version: int | None, exact: bool = False):
    """A block that samples `model` as of the trainer's policy `version`, yielding the version the samples
    are made with. An engine with its own numbered copy of the weights (generator=vllm_server) pushes them
    on entry when due (every `sync_every` versions; `exact`, held-out evaluation: whenever they differ) and
    yields the version it holds; every other engine samples the policy itself: `version`."""
    at = getattr(generator, "at_version", None)
    return at(model, tokenizer, version, exact) if at is not None and version is not None else nullcontext(version)


def weights_held(generator):
    """A block in which the caller promises the policy's weights do not change (an episode round samples
    once per turn): the engine's `weights_held()` where it has one (generator=vllm then syncs the weights
    once, not every turn), else nothing."""
    held = getattr(generator, "weights_held", None)
    return held() if held is not None else nullcontext()
