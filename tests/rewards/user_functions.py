"""User reward functions for reward=function tests, in a module with only stdlib imports: the per-sample
worker process (rewards/worker_call.py) imports it to load them, so it starts quickly."""
from __future__ import annotations

import time


def hangs_on_five(prompts, completions, examples):
    if completions[0] == "5":
        time.sleep(5)
    return [1.0 for _ in completions]


def spins_on_five(prompts, completions, examples):
    while completions[0] == "5":
        pass
    if completions[0] == "6":
        raise ZeroDivisionError("six")
    return [1.0 for _ in completions]
