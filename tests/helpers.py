"""Shared by the tests: the tiny-model overrides and small builders (no network, CPU, seconds)."""
from __future__ import annotations

import os
import sys

TINY_MODEL = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
              "model.intermediate_size=64"]
# Everything small: a few steps, a small held-out set, no progress bar, no logger.
TINY = TINY_MODEL + ["task.num_heldout=20", "callbacks.evaluate.num_examples=20",
                     "callbacks.progress.refresh_rate=0", "logger=none"]


def end_rank_process() -> None:
    """End a rank script's process (tests/hardware/*.py under torchrun) once its results are written and its
    process group destroyed, skipping interpreter finalization: there gloo/FSDP's C++ threads now and then
    abort a rank that finished ("terminate called without an active exception", SIGABRT: two CI runs, one
    with destroy_process_group already called; not reproduced in 13 local runs), and torchrun then fails it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# Multi-turn tool episodes, small (experiment=tool_use with the tiny model): a short SFT on teacher episodes,
# so that the policy opens calls (a random policy almost never does; about a tenth of these GRPO episodes get an
# observation turn), then GRPO with replay, 16 rounds of 8 prompts × 4 episodes (2 steps each; rounds short of a
# tenth of a second would let tests/test_resume_exact.py's kill land after the last one), scored by a reward
# that varies.
TOOL_EPISODES = ["experiment=tool_use", "task.tool_rate=1.0", "generator.max_new_tokens=24",
                 "stages.0.overrides=['algorithm=sft','data=episode_demonstrations','data.max_examples=128',"
                 "'trainer.max_steps=150']",
                 "stages.1.overrides=['algorithm=grpo','data=replay_mix','data.prompts_per_round=8',"
                 "'algorithm.group_size=4','data.batch_size=16','trainer.max_steps=32']",
                 "reward=function", "reward.fn._target_=tests.helpers.char_sum_scores"]


def tiny_model(seed: int = 0):
    """(policy, tokenizer): the default Llama architecture at its smallest."""
    from models.tiny import build_tiny
    return build_tiny(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                      max_position_embeddings=64, seed=seed)


class LengthReward:
    """A reward that varies inside every group even for an untrained model (the exact verifier scores
    a random model 0 everywhere, so no gradient would flow): fraction of 8 tokens' worth of text."""

    version = "test"

    def __init__(self, name: str, **_ignored):  # stands in for any reward node, whatever its keys
        self.name = name

    def score(self, prompts, completions, examples):
        return [min(len(c), 8) / 8 for c in completions]


def char_sum_scores(prompts, completions, examples):
    """A reward function (reward=function) that varies between samples of any model, untrained ones
    included: the completion's character codes summed, mod 10, over 10."""
    return [(sum(map(ord, c)) % 10) / 10 for c in completions]


CHAT_MODEL = dict(hidden_size=64, num_layers=1, num_heads=2, intermediate_size=128, max_position_embeddings=128)


def chat_model(path, seed: int = 0):
    """(policy, tokenizer) of models.synthetic's BPE chat model (head_dim 32: vLLM's CPU attention has a
    kernel for it), written to `path` and loaded through models.hf like any real folder."""
    from models.hf import load_hf
    from models.synthetic import write_qwen_like
    write_qwen_like(path, seed=seed, tokenizer="bpe", **CHAT_MODEL)
    return load_hf(str(path), dtype="float32", trust_remote_code=False, activation_checkpointing=False)


def force_stop_after(model, trigger: int, stop: int, dim: int = 0, a: float = 20.0, b: float = 4.0) -> None:
    """Edit a Llama/Qwen2-shaped policy with tied embeddings in place so that `stop` follows `trigger` with
    probability ≈ 1 (and `trigger` never follows itself), in every engine that runs these weights (vLLM
    included, which a logits hook cannot reach).

    Hidden dimension `dim` carries the signal: only `trigger` (+a) and `stop` (-b) have an embedding entry
    there, no layer writes to it (its rows of every o_proj and down_proj are zeroed) and the final norm's
    weight there is -1. So the residual on `dim` is the current token's entry: after `trigger` it holds
    `a`, which dominates the RMS (a ≫ the rest), the normalised state is ≈ -√H on `dim` and ≈ 0 elsewhere,
    and the tied head scores `stop` ≈ b·√H (32 for H = 64), every other token ≈ 0 and `trigger` ≈ -a·√H.
    After any other token the residual on `dim` is 0 and the logits are the random model's."""
    import torch
    decoder = model.get_decoder()
    with torch.no_grad():
        embed = decoder.embed_tokens.weight  # [V, H], tied to the LM head
        embed[:, dim] = 0.0
        embed[trigger, dim], embed[stop, dim] = a, -b
        for layer in decoder.layers:
            layer.self_attn.o_proj.weight[dim] = 0.0
            layer.mlp.down_proj.weight[dim] = 0.0
        decoder.norm.weight[dim] = -1.0
