"""Model output is read in the trusted trainer in linear time: every parser bounds its input to
MAX_PARSED_CHARS and scans it with find/split, never a backtracking regex (rewards/parsing.py).

Inputs are 100k-character adversarial completions: whitespace-only text and newlines (which made
`^\\s*def\\s+NAME\\s*\\(` under re.M quadratic), a ``` followed by a long run of spaces (which made the fence
regex's `[ \\t]*(?:python|py)?[ \\t]*` quadratic), and runs of backticks. No timings are asserted (project
rule); the bound and the results on these inputs are. Measured before/after: docs/rewards.md and the
commit message."""
from __future__ import annotations

import random
import re

import pytest

import rewards.code_exec as code_exec
from rewards.code_exec import extract_program
from rewards.judge import parse_score
from rewards.math_answer import extract_answer
from rewards.parsing import MAX_FENCE_INFO, MAX_PARSED_CHARS, def_line, first_fence, head, tail

N = 100_000
ADVERSARIAL = {
    "spaces_and_newlines": (" " * 7 + "\n") * (N // 8),
    "newlines": "\n" * N,
    "fence_then_spaces": "``` " + " " * (N - 5) + "x",
    "backticks": "`" * N,
    "fence_openers": "```  \t" * (N // 6),
}


@pytest.mark.parametrize("name", ADVERSARIAL)
def test_extract_program_reads_at_most_the_bound_of_an_adversarial_completion(name):
    text = ADVERSARIAL[name]
    assert len(text) >= N - 8 > MAX_PARSED_CHARS
    program = extract_program(text, "def f(x):\n", "f")
    # not a fence opener anywhere (no newline within MAX_FENCE_INFO of a ```), or a fence of blanks:
    # either way only the first MAX_PARSED_CHARS characters were read, appended to the prompt's def line
    assert program.startswith("def f(x):\n")
    assert len(program) <= len("def f(x):\n") + MAX_PARSED_CHARS
    assert text.startswith(program[len("def f(x):\n"):])


def test_a_long_program_is_cut_at_the_bound():
    body = "def f(x):\n" + "    x += 1\n" * (N // 11) + "    return x\n"
    assert extract_program(body, "", "f") == body[:MAX_PARSED_CHARS]


def test_fences_as_before():
    assert first_fence("text\n```python\ncode\n```\nmore") == "code\n"
    assert first_fence("``` py \t\nx = 1") == "x = 1"  # unclosed: to the end
    assert first_fence("```js\nno\n```\nyes\n```") == "yes\n"  # the js block's closer opens one
    assert first_fence("````\nfour\n```") == "four\n"  # the ``` at offset 1 opens it
    assert first_fence("```" + " " * MAX_FENCE_INFO + "\nok") == "ok"
    assert first_fence("```" + " " * (MAX_FENCE_INFO + 1) + "\nnot a fence") is None
    assert first_fence("no fence") is None


def test_same_results_as_the_old_regexes_on_short_random_text():
    """On short text (where the old backtracking patterns were cheap) the scans agree with them."""
    fence = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S)
    defines = re.compile(r"^[ \t]*def[ \t]+f[ \t]*\(", re.M)  # within a line: what def_line reads
    rng = random.Random(0)
    alphabet = ["`", "```", " ", "\t", "\n", "py", "python", "def", "f", "(", "x", "def f("]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        m = fence.search(text)
        assert first_fence(text) == (m.group(1) if m else None), text
        d = defines.search(text)
        assert def_line(text, "f") == (d.start() if d else None), text


def test_def_line_finds_the_line_of_the_definition():
    assert def_line("# doc\n  def  f (x):\n", "f") == 6
    assert def_line("def f_g(x):\ndef f(x):", "f") == len("def f_g(x):\n")
    assert def_line("define f(x)\nx = 'def f'\n", "f") is None
    assert def_line("\n" * N + "def f(", "f") == N
    assert extract_program("    return 1\n", "# doc\n\ndef f(x):\n", "f") == "def f(x):\n    return 1\n"


def test_math_reads_the_final_answer_from_the_tail():
    assert extract_answer(" 1 \n" * (N // 4) + "so the answer is 42") == "42"
    assert extract_answer("answer: " + " " * N + "7") == "7"  # the marker is cut off: the last number
    early = "\\boxed{5}" + "\n" * N  # beyond the bound from the end: not read
    assert extract_answer(early) != "5"
    assert tail("ab" * N) == ("ab" * N)[-MAX_PARSED_CHARS:] and tail("short") == "short"


def test_judge_searches_only_the_head():
    assert parse_score("8 " + " " * N, r"(-?\d+(?:\.\d+)?)", 0, 9) == pytest.approx(8 / 9)
    assert parse_score(" " * N + "8", r"(-?\d+(?:\.\d+)?)", 0, 9) is None
    assert head("x" * N) == "x" * MAX_PARSED_CHARS


def test_code_exec_parses_completions_without_regexes():
    """The design rule, pinned: extract_program goes through rewards/parsing.py, not `re`."""
    assert not hasattr(code_exec, "re") and not hasattr(code_exec, "FENCE")
