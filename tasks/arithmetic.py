"""The embedded default task: "a+b=" → the sum, with an exact solver (the teacher) and a held-out split."""
from __future__ import annotations

import random

from tasks.base import Example, Task


TEACHERS = ("exact", "no_carry_at_ten")


def teacher_answer(a: int, b: int, teacher: str) -> str:
    """The demonstration's answer. `exact`: a + b. `no_carry_at_ten`: a teacher with one systematic flaw, it
    forgets the carry when the ones digits sum to exactly 10 (37+53 → 80): 9% of pairs, a rule the student
    copies, which only a verifier's reward can correct."""
    if teacher == "no_carry_at_ten" and a % 10 + b % 10 == 10:
        return str(a + b - 10)
    return str(a + b)


def arithmetic_task(digits: int, num_heldout: int, seed: int, operands_max: int | None = None,
                    teacher: str = "exact") -> Task:
    """All pairs (a, b) with 0 ≤ a, b < 10**digits (or < operands_max), shuffled by `seed`;
    the first `num_heldout` pairs are held out and never trained on. `teacher`: who writes the
    demonstrations (`teacher_answer`); the reference answer, which rewards and evaluation use, is a + b."""
    if teacher not in TEACHERS:
        raise ValueError(f"task.teacher={teacher!r}: choose one of {', '.join(TEACHERS)}")
    top = operands_max or 10**digits
    pairs = [(a, b) for a in range(top) for b in range(top)]
    if num_heldout >= len(pairs):
        raise ValueError(f"task.num_heldout={num_heldout} leaves no training pairs out of {len(pairs)}")
    random.Random(seed).shuffle(pairs)
    examples = [Example(prompt=f"{a}+{b}=", answer=str(a + b),
                        meta={} if teacher == "exact" else {"demonstration": teacher_answer(a, b, teacher)})
                for a, b in pairs]
    return Task(name=f"arithmetic{digits}", train=examples[num_heldout:], heldout=examples[:num_heldout])
