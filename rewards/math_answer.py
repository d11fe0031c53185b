"""Math-answer verifier: extract the final answer from a completion and compare it with the reference
after normalisation (numbers, fractions, \\boxed{}, thousands separators, trailing punctuation).

(Named math_answer, not math, so no script run from this folder shadows the standard library's math.)
"""
from __future__ import annotations

import re
from fractions import Fraction

from rewards.base import RewardSource
from rewards.parsing import tail
from tasks.base import Example

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
MARKER = re.compile(r"(?:final answer|answer)\s*(?:is|:|=)\s*", re.IGNORECASE)
LATEX_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
WRAPPERS = re.compile(r"\\(?:text|mathrm|mathbf)\{([^{}]*)\}")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, j = 1, i
    while j < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        j += 1
    return text[i : j - 1] if depth == 0 else None


def extract_answer(completion: str) -> str:
    """\\boxed{} if present, else the text after the last 'answer is/:', else the last number, else the
    first line; of the completion's last MAX_PARSED_CHARS characters (its final answer is at its end). Every
    pattern here is linear: no two adjacent quantifiers can take the same characters."""
    completion = tail(completion)
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    marks = list(MARKER.finditer(completion))
    if marks:
        return completion[marks[-1].end() :].strip().split("\n", 1)[0]
    numbers = NUMBER.findall(completion)
    if numbers:
        return numbers[-1]
    return completion.strip().split("\n", 1)[0]


def normalize(answer: str) -> str:
    """Canonical text: no $, spaces, \\left/\\right, \\text{}, trailing .,;!, or thousands commas."""
    s = WRAPPERS.sub(r"\1", answer.strip())
    s = LATEX_FRAC.sub(r"(\1)/(\2)", s)
    s = s.replace("$", "").replace("\\left", "").replace("\\right", "").replace("\\!", "")
    s = re.sub(r"\s+", "", s).rstrip(".,;:!")
    s = re.sub(r"\^\{(\w)\}", r"^\1", s)  # x^{2} → x^2
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "")
    return s.lower()


def as_number(text: str) -> Fraction | None:
    """'3', '-0.50', '1/2', '(1)/(2)', '50%' (= 50) → an exact Fraction; None if not a plain number."""
    s = text.replace("(", "").replace(")", "").removesuffix("\\%").removesuffix("%")
    if not re.fullmatch(r"-?(?:\d+(?:\.\d+)?|\.\d+)(?:/-?\d+(?:\.\d+)?)?", s):
        return None
    try:
        value = Fraction(s) if "/" not in s else Fraction(*map(Fraction, s.split("/")))
    except (ValueError, ZeroDivisionError):
        return None
    return value


def answers_match(completion: str, reference: str) -> bool:
    got, want = normalize(extract_answer(completion)), normalize(reference)
    a, b = as_number(got), as_number(want)
    return a == b if a is not None and b is not None else got == want


def math_answer_scores(prompts: list[str], completions: list[str], examples: list[Example]) -> list[float]:
    """The reward contract as a plain function (usable as reward=function's `fn`)."""
    return [1.0 if answers_match(c, ex.answer) else 0.0 for c, ex in zip(completions, examples)]


class MathAnswerVerifier(RewardSource):
    """1.0 if the completion's final answer equals the reference after normalisation, else 0.0."""

    version = "1"

    def __init__(self, name: str, timeout_s: float):
        self.name, self.timeout_s = name, timeout_s

    def score(self, prompts, completions, examples):
        return math_answer_scores(prompts, completions, examples)
