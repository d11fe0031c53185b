"""A tool task (`task=tool_arithmetic`): "a*b=" → the product of an `a_digits`-digit and a `b_digits`-digit
number: beyond the embedded tiny model alone, within its reach with a calculator (env=calculator). Each
example's meta holds the teacher's tool calls, played by data=episode_demonstrations: [[tool, "a*b"]] on a
`tool_rate` share of the training examples, none on the rest (the teacher then answers at once: a demonstration
set from a teacher that does not always reach for the tool, so that when to call it is left to learn)."""
from __future__ import annotations

import random

from tasks.base import Example, Task


def tool_arithmetic_task(a_digits: int, b_digits: int, num_heldout: int, tool: str, tool_rate: float,
                         seed: int) -> Task:
    """All pairs (a, b) of an a_digits-digit a and a b_digits-digit b, shuffled by `seed` (fixed across
    run seeds so accuracies compare); the first `num_heldout` are held out and never trained on. Which
    training examples the teacher calls the tool on is drawn with `seed` too."""
    for key, value in (("a_digits", a_digits), ("b_digits", b_digits)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"task.{key} must be an integer >= 1, got {value!r}")
    pairs = [(a, b) for a in range(10 ** (a_digits - 1), 10**a_digits)
             for b in range(10 ** (b_digits - 1), 10**b_digits)]
    if not isinstance(num_heldout, int) or not 0 < num_heldout < len(pairs):
        raise ValueError(f"task.num_heldout={num_heldout!r} must be in [1, {len(pairs)})")
    if not isinstance(tool_rate, (int, float)) or not 0 <= tool_rate <= 1:
        raise ValueError(f"task.tool_rate must be in [0, 1], got {tool_rate!r}")
    rng = random.Random(seed)
    rng.shuffle(pairs)
    examples = [Example(prompt=f"{a}*{b}=", answer=str(a * b),
                        meta={"calls": [[tool, f"{a}*{b}"]] if i < num_heldout or rng.random() < tool_rate else []})
                for i, (a, b) in enumerate(pairs)]
    return Task(name=f"tool_arithmetic{a_digits}x{b_digits}", train=examples[num_heldout:],
                heldout=examples[:num_heldout])
