"""Shared by the tests: the tiny-model overrides and small builders (no network, CPU, seconds)."""
from __future__ import annotations

TINY_MODEL = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
              "model.intermediate_size=64"]
# Everything small: a few steps, a small held-out set, no progress bar, no logger.
TINY = TINY_MODEL + ["task.num_heldout=20", "callbacks.evaluate.num_examples=20",
                     "callbacks.progress.refresh_rate=0", "logger=none"]


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
