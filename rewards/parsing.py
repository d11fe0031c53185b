"""Linear-time reading of model output in the trusted trainer process.

A completion is untrusted input to code that holds the GIL: a regex that backtracks (adjacent quantifiers
over the same characters, `^\\s*` under re.M on whitespace-only text) costs seconds on a 100k-character
completion and stalls every thread of the run. So every parser of model output here (code_exec, math,
judge) first bounds its input to MAX_PARSED_CHARS, then reads it with str.find / str.split scans or with
regexes whose quantifiers never overlap (each character is examined a bounded number of times).

- `head` / `tail`: the first / last MAX_PARSED_CHARS characters (a program is read from its start, a
  final answer from the end).
- `first_fence`: the body of the first ``` fence whose info string is empty, `python` or `py`.
- `def_line`: the offset of the first line `def NAME(` (indented or not).
"""
from __future__ import annotations

MAX_PARSED_CHARS = 65_536  # characters of a completion any parser in the trainer reads
MAX_FENCE_INFO = 32  # characters between ``` and the end of its line: longer is not a fence opener
FENCE_LANGS = ("", "python", "py")


def head(text: str) -> str:
    """The first MAX_PARSED_CHARS characters of `text`."""
    return text[:MAX_PARSED_CHARS]


def tail(text: str) -> str:
    """The last MAX_PARSED_CHARS characters of `text`."""
    return text[-MAX_PARSED_CHARS:] if len(text) > MAX_PARSED_CHARS else text


def first_fence(text: str) -> str | None:
    """The body of the first ``` block opened by a line "```", "```python" or "```py" (spaces and tabs
    around the word allowed), up to the next ``` or the end; None if there is no such opener. Linear: each
    ``` costs at most MAX_FENCE_INFO characters of look-ahead, the body one find."""
    pos = text.find("```")
    while pos >= 0:
        info_at = pos + 3
        newline = text.find("\n", info_at, info_at + MAX_FENCE_INFO + 1)
        if newline >= 0 and text[info_at:newline].strip(" \t") in FENCE_LANGS:
            end = text.find("```", newline + 1)
            return text[newline + 1 :] if end < 0 else text[newline + 1 : end]
        pos = text.find("```", pos + 1)
    return None


def def_line(text: str, name: str) -> int | None:
    """Offset of the start of the first line that defines `name` (`def name(`, whitespace allowed before,
    between and after), else None. One pass over the lines."""
    offset = 0
    for line in text.split("\n"):
        if defines(line.lstrip(), name):
            return offset
        offset += len(line) + 1
    return None


def defines(stripped: str, name: str) -> bool:
    if not (stripped.startswith("def") and stripped[3:4].isspace()):
        return False
    rest = stripped[3:].lstrip()
    return rest.startswith(name) and rest[len(name) :].lstrip().startswith("(")
