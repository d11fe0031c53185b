"""The bad inputs of docs/bad_inputs.md, by theme: each case is a command line (with the files it names,
written into DIR), when it is caught, and the exact line the user sees. tests/test_bad_inputs.py runs
every case; the doc's table is generated from this list by tests/bad_inputs_doc.py:

    python -m tests.bad_inputs_doc            # rewrite the table in docs/bad_inputs.md
    python -m tests.bad_inputs_doc --observe  # print what each case shows now (to write a new case)

A message ending in "…" is compared up to there (the rest is a library's own text, or a long list).
"""
from __future__ import annotations

from tests.bad_inputs import command_line, engines, files, json_limits, nodes, schemas, stores, values
from tests.bad_inputs.case import ROOT, WHEN, Case, matches, observe

CASES: list[Case] = (command_line.CASES + values.CASES + files.CASES + schemas.CASES + json_limits.CASES + stores.CASES
                     + nodes.CASES + engines.CASES)

__all__ = ["CASES", "ROOT", "WHEN", "Case", "matches", "observe"]
