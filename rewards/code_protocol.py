"""The trusted side of the harness protocol (rewards/sandbox_harness.py): parse what the sandbox printed
and compare the reported values with the expected ones.

Everything on stdout may be written by the model's code (it can find the harness's channel), so each
line is parsed on its own, bounded (length, index digits, JSON nesting) and under a catch-all: a line
that cannot be parsed is junk (bad index) or a failed test (bad value), never an exception that could
cost the batch. A forged line can only claim a value the code could as well have returned.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

LINE = re.compile(rb"^@@(READY|RESULT|ERROR|DONE)@@(?: (\S+))?(?: (.*))?$", re.M)
MAX_INDEX_DIGITS = 6  # more tests than that never exist: a longer index is junk
MAX_VALUE_BYTES = 1 << 20
MAX_DEPTH = 100  # JSON nesting accepted in a reported value (json.loads recurses on it)
MAX_ERROR_NAME = 100
TOKENS = re.compile(rb'\\.|["\[\]{}]', re.S)  # escape pairs, quotes, brackets: no backtracking


def parse_protocol(stdout: bytes) -> tuple[bool, dict[int, tuple[str, Any]]]:
    """(the harness started, {test index: ("ok", value) | ("error", exception name)}). The first line
    for an index wins; unparsable values count as errors; lines with a malformed index are ignored."""
    ready, results = False, {}
    for kind, key, rest in LINE.findall(stdout):
        if kind == b"READY":
            ready = True
        elif kind in (b"RESULT", b"ERROR"):
            index = parse_index(key)
            if index is not None and index not in results:
                results[index] = parse_value(rest) if kind == b"RESULT" else ("error", error_name(rest))
    return ready, results


def parse_index(key: bytes) -> int | None:
    if not (0 < len(key) <= MAX_INDEX_DIGITS and key.isdigit()):
        return None
    return int(key)


def error_name(rest: bytes) -> str:
    return rest[:MAX_ERROR_NAME].decode(errors="replace")


def parse_value(rest: bytes) -> tuple[str, Any]:
    """("ok", the JSON value) or ("error", "UnparsableResult"); never raises."""
    try:
        if len(rest) > MAX_VALUE_BYTES or json_depth(rest) > MAX_DEPTH:
            return "error", "UnparsableResult"
        return "ok", json.loads(rest)
    except Exception:  # noqa: BLE001 - bad UTF-8, bad JSON, huge ints, recursion: the code's fault
        return "error", "UnparsableResult"


def json_depth(text: bytes, limit: int = MAX_DEPTH) -> int:
    """Nesting of [ and { outside strings, counted up to just past `limit` (one linear pass; exact for
    valid JSON, and json.loads stops at the first invalid byte anyway)."""
    depth = deepest = 0
    in_string = False
    for m in TOKENS.finditer(text):
        t = m.group()
        if t == b'"':
            in_string = not in_string
        elif in_string or len(t) == 2:  # inside a string, or an escape pair
            continue
        elif t in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        else:
            depth -= 1
    return deepest


def passes(got: Any, want: Any) -> bool:
    """same(), but False for anything it cannot compare (e.g. an int too large for a float)."""
    try:
        return same(got, want)
    except Exception:  # noqa: BLE001 - OverflowError, RecursionError on odd values: not a pass
        return False


def same(got: Any, want: Any) -> bool:
    """JSON values equal; ints exactly, floats within 1e-6 relative; bools are not numbers."""
    if isinstance(got, bool) or isinstance(want, bool):
        return type(got) is type(want) and got == want
    if isinstance(got, int) and isinstance(want, int):
        return got == want  # exact, and no float conversion (which overflows past 1e308)
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(same(a, b) for a, b in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want
