"""The embedded default task: "a+b=" → the sum, with an exact solver (the teacher) and a held-out split."""
from __future__ import annotations

import random

from tasks.base import Example, Task


def arithmetic_task(digits: int, num_heldout: int, seed: int, operands_max: int | None = None) -> Task:
    """All pairs (a, b) with 0 ≤ a, b < 10**digits (or < operands_max), shuffled by `seed`;
    the first `num_heldout` pairs are held out and never trained on."""
    top = operands_max or 10**digits
    pairs = [(a, b) for a in range(top) for b in range(top)]
    if num_heldout >= len(pairs):
        raise ValueError(f"task.num_heldout={num_heldout} leaves no training pairs out of {len(pairs)}")
    random.Random(seed).shuffle(pairs)
    examples = [Example(prompt=f"{a}+{b}=", answer=str(a + b)) for a, b in pairs]
    return Task(name=f"arithmetic{digits}", train=examples[num_heldout:], heldout=examples[:num_heldout])
