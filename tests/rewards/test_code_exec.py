"""code_exec: reward = fraction of unit tests passed, computed from return values the sandbox reports and
expected values it never sees; abstain only when the code could not be judged; and no run starts
without isolation beyond rlimits unless allow_weak_sandbox is set."""
from __future__ import annotations

import functools
import os
import shutil
import time

import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from rewards import sandbox as sandbox_mod
from rewards.base import safe_score
from rewards.code_exec import CodeExecReward, extract_program, parse_protocol, same
from rewards.sandbox import RunResult, Sandbox, SandboxUnavailable, default_python, probe
from tasks.base import Example
from tasks.code import code_task

STRONG = [b for b in ("bwrap", "unshare") if probe(b, default_python(), os.geteuid() == 0) is None]
LIMITS = dict(python=None, cpu_seconds=2, memory_mb=512, max_processes=16, max_file_mb=8, tmpfs_mb=16,
              wall_seconds=4, max_output_kb=64)
needs_sandbox = pytest.mark.skipif(not STRONG, reason="no namespace sandbox on this host")


def reward(backend="auto", allow_weak=False, workers=2, timeout_s=60):
    box = functools.partial(Sandbox, backend=backend, **LIMITS)
    return CodeExecReward("code_exec", box, allow_weak, per_test_seconds=1.0, workers=workers, timeout_s=timeout_s)


@pytest.fixture(scope="module")
def task():
    return code_task(None, num_heldout=3)


@needs_sandbox
def test_every_shipped_reference_solution_passes_all_its_tests(task):
    examples = task.train + task.heldout
    rew = reward()
    assert rew.score([e.prompt for e in examples], [e.answer for e in examples], examples) == [1.0] * 26
    assert rew.stats()["sandbox/all_passed"] == 26 and rew.stats()["sandbox/backend"] in STRONG


@needs_sandbox
def test_partial_credit_errors_and_formats(task):
    lis = next(e for e in task.train if e.meta["entry_point"] == "longest_increasing_subsequence")
    wrong = "def longest_increasing_subsequence(nums):\n    return len(nums)\n"  # right on 2 of 5
    crash = "def longest_increasing_subsequence(nums):\n    return nums[0]\n"
    fenced = "Here you go:\n```python\n" + lis.answer + "```\nDone."
    body = "    return 4\n"  # continues a prompt that ends with the signature (HumanEval style)
    prompt = "# LIS\ndef longest_increasing_subsequence(nums):\n"
    report = safe_score(reward(), [lis.prompt] * 4 + [prompt],
                        [wrong, crash, "this is not python (", fenced, body], [lis] * 5)
    assert report.scores == [pytest.approx(2 / 5), 0.0, 0.0, 1.0, pytest.approx(2 / 5)]
    assert report.abstained == 0 and report.errors == 0


@needs_sandbox
def test_per_test_timeout_fails_only_the_slow_tests():
    ex = Example("", "", {"entry_point": "f", "tests": [{"args": [x], "expected": x} for x in (1, 2, 3)]})
    stuck_on_two = "def f(x):\n    while x == 2:\n        pass\n    return x\n"
    rew = reward()
    [score] = rew.score([""], [stuck_on_two], [ex])
    assert score == pytest.approx(2 / 3) and rew.stats()["sandbox/test_timeouts"] == 1


@needs_sandbox
def test_abstains_without_tests_or_when_the_sandbox_does_not_start(task, monkeypatch):
    rew = reward()
    assert rew.score([""], ["def f(): pass"], [Example("", "")]) == [None]
    err = b"bwrap: Creating new namespace failed: No space left\n"
    failed = RunResult(b"", err, 1, 0.01, False, False, "t", "/x")
    monkeypatch.setattr(rew.sandbox, "run", lambda files, argv, **kw: failed)
    report = safe_score(rew, [""], [task.train[0].answer], task.train[:1])
    assert report.scores == [None] and report.errors == 1
    assert "sandbox did not start (exit 1): bwrap: Creating new namespace failed" in report.first_error


@needs_sandbox
@pytest.mark.skipif(os.geteuid() != 0, reason="per-run uids need root; otherwise sandboxes share the uid's budget")
def test_a_fork_bomb_does_not_starve_concurrent_sandboxes(task):
    ex = task.train[0]
    bomb = ("import os, signal\ndef reverse_string(s):\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
            "    while True:\n        try:\n            os.fork()\n"
            "        except BaseException:\n            pass\n")
    start = time.monotonic()
    scores = reward(workers=2).score([""] * 6, [bomb] + [ex.answer] * 5, [ex] * 6)
    assert scores == [0.0] + [1.0] * 5 and time.monotonic() - start < LIMITS["wall_seconds"] + 4


@needs_sandbox
def test_batch_deadline_abstains_on_samples_not_started(task):
    """No launch later than timeout_s - wall_seconds - 1: whatever started can finish in time."""
    ex = task.train[0]
    slow = "import time\ntime.sleep(0.5)\ndef reverse_string(s):\n    return s[::-1]\n"
    rew = reward(workers=1, timeout_s=LIMITS["wall_seconds"] + 1 + 1.2)  # launches stop after 1.2 s
    report = safe_score(rew, [""] * 4, [slow] * 4, [ex] * 4)
    assert report.scores[0] == 1.0 and report.scores[-1] is None and report.timeouts == 0
    assert "batch deadline" in report.first_error and rew.stats()["sandbox/skipped_deadline"] >= 1
    with pytest.raises(ValueError, match="reward.timeout_s"):
        reward(timeout_s=LIMITS["wall_seconds"])


# ---------------------------------------------------------------- refusing to start
def test_refuses_without_isolation_unless_weak_is_allowed(monkeypatch):
    real_which = shutil.which
    hidden = lambda n: None if n in ("bwrap", "unshare") else real_which(n)  # noqa: E731
    monkeypatch.setattr(sandbox_mod.shutil, "which", hidden)
    sandbox_mod.probe.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match=r"bwrap: bwrap not found.*reward\.allow_weak_sandbox=true"):
            reward()
        with pytest.raises(SandboxUnavailable, match=r"backend=bwrap does not work here: bwrap not found"):
            reward(backend="bwrap", allow_weak=True)  # a named backend is never downgraded
        weak = reward(allow_weak=True)
        assert weak.sandbox.backend == "rlimits" and weak.version == "2:rlimits"
        ok = "def reverse_string(s):\n    return s[::-1]\n"
        ex = code_task(None, 3).train[0]
        assert weak.score([""], [ok], [ex]) == [1.0]  # it runs (with rlimits, as another uid), just not isolated
    finally:
        sandbox_mod.probe.cache_clear()


def test_an_explicit_weak_backend_also_needs_the_flag():
    with pytest.raises(SandboxUnavailable, match="allow_weak_sandbox"):
        reward(backend="rlimits")
    with pytest.raises(ValueError, match="reward.sandbox.backend"):
        reward(backend="docker")


def test_the_config_refuses_too(hydra_conf):
    """train.py builds the reward before fitting: the run stops there, saying why."""
    with pytest.raises(InstantiationException, match="allow_weak_sandbox"):
        instantiate(hydra_conf(["reward=code_exec", "reward.sandbox.backend=rlimits"]).reward)


# ---------------------------------------------------------------- pure helpers
def test_extract_program():
    assert extract_program("```py\ndef f():\n    return 1\n```\ntext", "", "f") == "def f():\n    return 1\n"
    assert extract_program("    return 1\n", "# doc\ndef f(x):\n", "f") == "def f(x):\n    return 1\n"
    assert extract_program("def f(): return 2", "def f(x):\n", "f") == "def f(): return 2"


def test_parse_protocol_first_line_per_test_wins_and_junk_is_ignored():
    out = (b"@@READY@@\nnoise\n@@RESULT@@ 0 [1, 2]\n@@RESULT@@ 0 7\n@@ERROR@@ 1 ZeroDivisionError\n"
           b"@@RESULT@@ 2 {not json\n@@RESULT@@ x 1\n@@DONE@@\n")
    ready, results = parse_protocol(out)
    assert ready and results == {0: ("ok", [1, 2]), 1: ("error", "ZeroDivisionError"),
                                 2: ("error", "UnparsableResult")}
    assert parse_protocol(b"bwrap: failed\n") == (False, {})


def test_same():
    assert same(0.1 + 0.2, 0.3) and same([1, [2.0]], [1, [2]]) and same({"a": None}, {"a": None})
    assert not same(True, 1) and not same(1, "1") and not same([1], [1, 2]) and not same(None, 0)
