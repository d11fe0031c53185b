"""Code tasks: a prompt asks for a Python function; the reference answer is a solution (the SFT teacher);
unit tests travel in Example.meta for reward=code_exec.

One JSON object a line: {"prompt": str, "answer": str (reference solution), "entry_point": str,
"tests": [{"args": [...], "expected": <JSON value>}, ...]}. The shipped set (code_tasks.jsonl, 26):
reverse_string, two_sum, longest_increasing_subsequence, is_palindrome, fizzbuzz, max_subarray,
count_vowels, fibonacci, gcd, binary_search, run_length_encode, flatten, is_anagram, second_largest,
sum_digits, is_prime, factorial, capitalize_words, remove_duplicates, merge_sorted, count_words,
max_profit, valid_parentheses, roman_to_int, transpose, rotate_list.
"""
from __future__ import annotations

import keyword
from pathlib import Path

from tasks.base import Task
from tasks.jsonl import DataFileError, read_examples

SHIPPED = Path(__file__).resolve().parent / "code_tasks.jsonl"


def check_tests(meta: dict, where: str) -> None:
    """Raise DataFileError naming file:line unless meta has an identifier entry_point and tests."""
    entry, tests = meta.get("entry_point"), meta.get("tests")
    if not isinstance(entry, str) or not entry.isidentifier() or keyword.iskeyword(entry):
        kind = "a Python keyword, not a function name" if isinstance(entry, str) and keyword.iskeyword(entry) \
            else "not a Python identifier"
        raise DataFileError(f"{where}: 'entry_point' must name a function; {entry!r} is {kind}")
    if not isinstance(tests, list) or not tests:
        raise DataFileError(f"{where}: 'tests' must be a non-empty list of {{args, expected}}")
    for i, t in enumerate(tests):
        if not isinstance(t, dict) or set(t) != {"args", "expected"} or not isinstance(t["args"], list):
            raise DataFileError(f"{where}: tests[{i}] must be {{\"args\": [...], \"expected\": ...}}, got {t!r}")


def code_task(path: str | None, num_heldout: int) -> Task:
    """Train on all but the last `num_heldout` tasks of `path` (null: the shipped set); hold those out."""
    file = str(path or SHIPPED)
    examples = read_examples(file)
    for ex in examples:
        check_tests(ex.meta, f"{Path(file).parent}/{ex.meta['origin']}")
    if not 1 <= num_heldout < len(examples):
        raise DataFileError(f"{file}: task.num_heldout={num_heldout} must be in [1, {len(examples)})")
    cut = len(examples) - num_heldout
    return Task(name=Path(file).stem, train=examples[:cut], heldout=examples[cut:])
