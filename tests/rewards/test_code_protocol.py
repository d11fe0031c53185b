"""The trusted parser of the harness protocol: whatever bytes the model's code writes on the channel, it
never raises, never takes long, and a malformed line fails only the test it names (or nothing)."""
from __future__ import annotations

import time

import pytest

from rewards.code_protocol import json_depth, parse_protocol, passes, same

# name → bytes the model's code writes on the harness channel, each broke the parser (or could):
MALFORMED = {
    "deep_nesting": b"@@RESULT@@ 0 " + b"[" * 20000 + b"]" * 20000 + b"\n",  # RecursionError in json
    "huge_index": b"@@RESULT@@ " + b"9" * 5000 + b" 0.5\n",  # ValueError: int() past 4300 digits
    "huge_int_value": b"@@RESULT@@ 0 " + b"1" * 5000 + b"\n",  # ValueError in json
    "int_overflows_float": b"@@RESULT@@ 0 1" + b"0" * 400 + b"\n",  # OverflowError comparing with 0.5
    "bad_utf8": b'@@RESULT@@ 0 "\xff\xfe"\n@@ERROR@@ 1 \xff\xfe' + b"E" * 5000 + b"\n",
    "escaped_quotes": b'@@RESULT@@ 0 "' + b'\\"' * 30000 + b"\n",  # quadratic for a backtracking scanner
    "nul_bytes": b"@@RESULT@@ 0 " + b"\x00" * 1000 + b"\n@@RESULT@@ \x00 1\n",
}


@pytest.mark.parametrize("kind", MALFORMED)
def test_a_malformed_line_fails_its_test_and_nothing_else(kind):
    out = b"@@READY@@\n" + MALFORMED[kind] + b"@@RESULT@@ 0 0.5\n@@RESULT@@ 1 0.25\n@@DONE@@\n"
    start = time.monotonic()
    ready, results = parse_protocol(out)
    assert time.monotonic() - start < 0.5
    assert ready and set(results) <= {0, 1}
    scores = [passes(results[i][1], want) if results.get(i, ("", 0))[0] == "ok" else False
              for i, want in enumerate([0.5, 0.25])]
    assert scores[0] is (kind == "huge_index")  # the forged line won index 0 and failed it; a bad index is junk
    assert scores[1] is (kind != "bad_utf8")  # "@@ERROR@@ 1 <junk>" claims test 1 failed: it did
    if kind == "bad_utf8":
        assert len(results[1][1]) <= 100  # error names are cut


def test_json_depth_is_linear_and_exact_on_valid_json():
    assert json_depth(b'[[1, "[[[\\"[", {"a": [2]}]]') == 4  # brackets in strings, escaped quotes: skipped
    assert json_depth(b"[" * 10**6) == 101  # stops just past the limit
    start = time.monotonic()
    json_depth(b'"' + b'\\"' * 10**5)
    json_depth(b'"\\"' * 10**5)
    assert time.monotonic() - start < 1.0


def test_passes_never_raises():
    assert not passes(10**400, 0.5) and passes(10**400, 10**400) and not passes(float("nan"), 1.0)
    deep = []
    for _ in range(5000):
        deep = [deep]
    assert not passes(deep, deep)  # too deep to compare: not a pass, and no exception
    assert same(2**80, 2**80) and not same(2**80, 2**80 + 1)  # ints compare exactly
