"""The math-answer checker: extraction (\\boxed{}, 'answer is', last number) and normalisation."""
from __future__ import annotations

import pytest

from rewards.math_answer import MathAnswerVerifier, as_number, extract_answer, last_boxed, normalize
from tasks.base import Example


@pytest.mark.parametrize("completion,reference", [
    ("The answer is \\boxed{\\frac{1}{2}}.", "0.5"),
    ("\\boxed{\\dfrac{3}{6}}", "1/2"),
    ("so the total is 1,234.", "1234"),
    ("Answer: 42!", "42"),
    ("x = 3/6", "0.5"),
    ("-0.50", "-1/2"),
    ("$12$", "12"),
    ("\\boxed{x^{2}+1}", "x^2+1"),
    ("\\boxed{\\text{Paris}}", "paris"),
    ("We get 7 apples, then 8; final answer is 8.", "8"),
    ("50\\%", "50"),
    ("\\boxed{{1,2}}", "{1,2}"),
])
def test_equivalent_answers_match(completion, reference):
    assert MathAnswerVerifier("math", 60).score([""], [completion], [Example("", reference)]) == [1.0]


@pytest.mark.parametrize("completion,reference", [
    ("7", "8"), ("\\boxed{1/3}", "0.33"), ("", "1"), ("1,23", "123"), ("the answer is 12", "1"),
])
def test_different_answers_do_not(completion, reference):
    assert MathAnswerVerifier("math", 60).score([""], [completion], [Example("", reference)]) == [0.0]


def test_helpers():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{2}{3}}") == "\\frac{2}{3}"
    assert last_boxed("\\boxed{unclosed") is None
    assert extract_answer("no numbers here\nsecond line") == "no numbers here"
    assert normalize(" $1,000$. ") == "1000"
    assert as_number("(1)/(2)") == as_number("0.5") and as_number("1/0") is None and as_number("x") is None
