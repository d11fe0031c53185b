"""code_exec through a real sandbox, on every namespace backend that works here: one sample's output can
neither break the batch nor change another sample's score, and code that defeats the per-test alarm
(recursing at its limit, swallowing exceptions) ends well within the wall clock."""
from __future__ import annotations

import functools
import os

import pytest

from rewards.code_exec import CodeExecReward
from rewards.sandbox import Sandbox, default_python, probe
from tasks.base import Example
from tests.rewards.test_code_protocol import MALFORMED

STRONG = [b for b in ("bwrap", "unshare") if probe(b, default_python(), os.geteuid() == 0) is None]
pytestmark = pytest.mark.skipif(not STRONG, reason="no namespace sandbox on this host")
LIMITS = dict(python=None, cpu_seconds=10, memory_mb=512, max_processes=16, max_file_mb=8, tmpfs_mb=16,
              wall_seconds=10, max_output_kb=64)  # neither the CPU limit nor the wall clock ends a run early
INVERSE = Example("", "", {"entry_point": "f", "tests": [{"args": [2], "expected": 0.5},
                                                         {"args": [4], "expected": 0.25}]})
CORRECT = "def f(x):\n    return 1 / x\n"


def reward(backend: str, workers: int = 2) -> CodeExecReward:
    box = functools.partial(Sandbox, backend=backend, **LIMITS)
    return CodeExecReward("code_exec", box, False, per_test_seconds=1.0, workers=workers, timeout_s=60)


def writes_on_the_channel(line: bytes) -> str:
    """A completion that writes `line` on every descriptor the harness's channel could be, then fails."""
    return (f"import os\nfor fd in range(3, 10):\n    try:\n        os.write(fd, {line!r})\n"
            "    except OSError:\n        pass\ndef f(x):\n    return None\n")


@pytest.mark.parametrize("backend", STRONG)
@pytest.mark.parametrize("kind", MALFORMED)
def test_a_malformed_protocol_line_fails_that_sample_alone(backend, kind):
    rew = reward(backend)
    report = rew.score_report([""] * 2, [writes_on_the_channel(MALFORMED[kind]), CORRECT], [INVERSE] * 2)
    assert report.scores == [0.0, 1.0] and report.errors == 0
    assert rew.stats()["sandbox/scoring_errors"] == 0


@pytest.mark.parametrize("backend", STRONG[:1])
def test_an_error_while_scoring_one_sample_abstains_on_it_alone(backend, monkeypatch):
    rew = reward(backend)
    real_run = rew.sandbox.run

    def run(files, argv, **kw):
        if "BOOM" in files["solution.py"]:
            raise RuntimeError("scoring bug")
        return real_run(files, argv, **kw)

    monkeypatch.setattr(rew.sandbox, "run", run)
    report = rew.score_report([""] * 2, ["# BOOM\n" + CORRECT, CORRECT], [INVERSE] * 2)
    assert report.scores == [None, 1.0] and report.errors == 1
    assert "scoring failed (RuntimeError: scoring bug" in report.first_error
    assert rew.stats()["sandbox/scoring_errors"] == 1


# name → (program, tests ended by the per-test alarm). Each test has per_test_seconds=1 of CPU time (issue
# 20: CPU, not wall, so the time it takes depends on the machine's load: no timing is asserted); what
# ends each run is: the repeating alarm, an early RecursionError, or the stall limit, never the wall clock.
RECURSE = {
    # the alarm's handler cannot run at the recursion limit: its RecursionError was caught here, the
    # TestTimeout lost, and the test ran until the CPU limit or the wall clock (now: the alarm repeats)
    "catches_RecursionError_and_recurses_again": (
        "def f(x):\n    try:\n        return f(x)\n    except RecursionError:\n        return f(x)\n", 2),
    # frames on the heap until memory runs out (now: the limit is capped, RecursionError in ms, no alarm)
    "raises_the_limit_and_recurses_until_it_fails": (
        "import sys\nsys.setrecursionlimit(10**9)\ndef f(x):\n    return f(x)\n", 0),
    # eats every TestTimeout: the harness goes silent, the parent kills the run (stalled)
    "swallows_every_exception": (
        "def f(x):\n    try:\n        return f(x)\n    except BaseException:\n        return f(x)\n", 0),
}


@pytest.mark.parametrize("backend", STRONG)
@pytest.mark.parametrize("name", RECURSE)
def test_recursing_until_it_fails_ends_well_within_the_wall_clock(backend, name):
    program, alarms = RECURSE[name]
    rew = reward(backend, workers=2)
    scores = rew.score([""] * 2, [program, CORRECT], [INVERSE] * 2)
    assert scores == [0.0, 1.0]
    stats = rew.stats()
    assert stats["sandbox/timeouts"] == 0  # never the wall clock
    assert stats["sandbox/stalled"] == (name == "swallows_every_exception")
    assert stats["sandbox/test_timeouts"] == alarms
