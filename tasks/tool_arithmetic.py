"""A tool task (`task=tool_arithmetic`): "a*b=" → the product of an `a_digits`-digit and a `b_digits`-digit
number: beyond the embedded tiny model alone, within its reach with a calculator (env=calculator). Each
example's meta holds the teacher's tool call ([[tool, "a*b"]]), played by data=episode_demonstrations."""
from __future__ import annotations

import random

from tasks.base import Example, Task


def tool_arithmetic_task(a_digits: int, b_digits: int, num_heldout: int, tool: str, seed: int) -> Task:
    """All pairs (a, b) of an a_digits-digit a and a b_digits-digit b, shuffled by `seed` (fixed across
    run seeds so accuracies compare); the first `num_heldout` are held out and never trained on."""
    for key, value in (("a_digits", a_digits), ("b_digits", b_digits)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"task.{key} must be an integer >= 1, got {value!r}")
    pairs = [(a, b) for a in range(10 ** (a_digits - 1), 10**a_digits)
             for b in range(10 ** (b_digits - 1), 10**b_digits)]
    if not isinstance(num_heldout, int) or not 0 < num_heldout < len(pairs):
        raise ValueError(f"task.num_heldout={num_heldout!r} must be in [1, {len(pairs)})")
    random.Random(seed).shuffle(pairs)
    examples = [Example(prompt=f"{a}*{b}=", answer=str(a * b), meta={"calls": [[tool, f"{a}*{b}"]]})
                for a, b in pairs]
    return Task(name=f"tool_arithmetic{a_digits}x{b_digits}", train=examples[num_heldout:],
                heldout=examples[:num_heldout])
