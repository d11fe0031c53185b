"""Code execution reward: a completion is a Python function; reward = fraction of the example's unit tests
it passes, run in a sandbox (rewards/sandbox.py). Model output is untrusted.

Example.meta carries `entry_point` (the function's name) and `tests`: [{"args": [...], "expected": ...}].
Inside the sandbox, rewards/sandbox_harness.py calls the function on each test's args and reports the
return values; the expected values never enter the sandbox and are compared here.

Scores: passed / len(tests) whenever the program ran (a syntax error, crash, timeout, stall, memory
error, output flood or a malformed result line fails the tests it did not report validly). None
(abstain, counted) only when it could not be judged: no tests in the example, the sandbox did not start,
the batch deadline had passed, or scoring this one sample failed (a bug: counted, the others unaffected).
"""
from __future__ import annotations

import json
import math
import os
import sys
import threading
import traceback
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

from rewards.base import RewardSource, ScoreReport
from rewards.code_protocol import parse_protocol, passes, same  # noqa: F401 - same: re-exported
from rewards.parsing import def_line, first_fence, head
from rewards.sandbox import RunResult, Sandbox, SandboxUnavailable
from tasks.base import Example

HARNESS = Path(__file__).resolve().parent / "sandbox_harness.py"
STALL_GRACE_S = 1.0  # beyond the harness's own per-test alarm, before a silent run is killed
WALL_MARGIN = 2.0  # a test's wall backstop: per_test_seconds / (its fair CPU share) × this


def per_test_wall_seconds(per_test_seconds: float, workers: int) -> float:
    """The wall-clock backstop of a test limited to `per_test_seconds` of CPU: with `workers` busy sandboxes
    sharing this machine's cores equally, each gets cores/workers of a core (at most one), and the margin
    covers the trainer's own threads and other load."""
    share = min(1.0, len(os.sched_getaffinity(0)) / workers)
    return per_test_seconds / share * WALL_MARGIN


def extract_program(completion: str, prompt: str, entry_point: str) -> str:
    """The code to run: the first ``` fenced block if any, else the completion; a completion that does
    not define `entry_point` but continues a prompt that does (HumanEval style) is appended to it. Reads
    at most the first MAX_PARSED_CHARS of the completion, in linear time (rewards/parsing.py)."""
    completion = head(completion)
    fenced = first_fence(completion)
    code = completion if fenced is None else fenced
    start = def_line(prompt, entry_point) if def_line(code, entry_point) is None else None
    return code if start is None else prompt[start:] + code


def untested_example(examples: list[Example]) -> tuple[int, Example] | None:
    """(index, example) of the first example without unit tests (an `entry_point` and `tests` in its
    meta), which this reward could only abstain on; None when every example has them. Checked when the
    run is planned, so a task without tests is refused before any model is built."""
    for i, ex in enumerate(examples):
        if not ex.meta.get("tests") or not ex.meta.get("entry_point"):
            return i, ex
    return None


class CodeExecReward(RewardSource):
    version = "2"

    def __init__(self, name: str, sandbox: Callable[..., Sandbox], allow_weak_sandbox: bool,
                 per_test_seconds: float, workers: int, timeout_s: float):
        self.name, self.per_test_seconds, self.timeout_s = name, per_test_seconds, timeout_s
        self.sandbox = sandbox(allow_weak=allow_weak_sandbox)  # raises SandboxUnavailable: refuse to start
        self.cpu_isolation = getattr(getattr(self.sandbox, "cpu", None), "kind", None) or "serial"
        # without a cpu cgroup per run, two concurrent sandboxes share the CPU per process, so a sample
        # could slow its neighbour by forking spinners: one run at a time, so it only slows itself
        self.workers = workers if self.cpu_isolation != "serial" else 1
        if self.workers != workers:
            why = getattr(getattr(self.sandbox, "cpu", None), "why", None)
            print(f"[code_exec] reward.workers={workers}: running one sandbox at a time, since no cpu cgroup "
                  f"can be made here ({why}); see docs/rewards.md", file=sys.stderr)
        if timeout_s < self.sandbox.wall_seconds + 2:
            raise ValueError(f"reward.timeout_s={timeout_s} must exceed reward.sandbox.wall_seconds + 2 = "
                             f"{self.sandbox.wall_seconds + 2}: a batch must fit at least one run")
        # the harness prints a line per test within its wall backstop (the first after loading, too):
        # silence past this means the code defeated the in-process alarms, so the run is killed
        self.test_wall_seconds = per_test_wall_seconds(per_test_seconds, self.workers)
        self.stall_seconds = 2 * self.test_wall_seconds + STALL_GRACE_S
        self.version = f"2:{self.sandbox.backend}"
        self._lock = threading.Lock()
        self.counts = {"runs": 0, "all_passed": 0, "timeouts": 0, "test_timeouts": 0, "stalled": 0,
                       "output_limited": 0, "load_errors": 0, "launch_failures": 0, "no_tests": 0,
                       "skipped_deadline": 0, "scoring_errors": 0}
        self.seconds = 0.0

    def score(self, prompts: list[str], completions: list[str], examples: list[Example]) -> list[float | None]:
        return self.score_report(prompts, completions, examples).scores

    def score_report(self, prompts, completions, examples) -> ScoreReport:
        # no launch after this: every run started finishes (wall_seconds) before safe_score gives up
        deadline = time.monotonic() + self.timeout_s - self.sandbox.wall_seconds - 1.0
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sandbox") as pool:
            outs = list(pool.map(lambda a: self.guarded_one(*a, deadline), zip(prompts, completions, examples)))
        errors = [e for _, e in outs if e]
        return ScoreReport([s for s, _ in outs], errors=len(errors),
                           first_error=f"{self.name}: {errors[0]}" if errors else None)

    def guarded_one(self, prompt: str, completion: str, example: Example,
                    deadline: float = math.inf) -> tuple[float | None, str | None]:
        """score_one, but an unexpected error abstains on this sample alone (counted), never the batch."""
        try:
            return self.score_one(prompt, completion, example, deadline)
        except Exception as e:  # noqa: BLE001 - a bug here must not cost the other samples
            self._count("scoring_errors")
            where = traceback.extract_tb(e.__traceback__)[-1]
            return None, f"scoring failed ({type(e).__name__}: {e} at {where.name}:{where.lineno})"

    def score_one(self, prompt: str, completion: str, example: Example,
                  deadline: float = math.inf) -> tuple[float | None, str | None]:
        """(score or None, why it abstained when that was the sandbox's fault, else None)."""
        tests, entry = example.meta.get("tests"), example.meta.get("entry_point")
        if not tests or not entry:
            self._count("no_tests")
            return None, None
        if time.monotonic() > deadline:
            self._count("skipped_deadline")
            return None, "batch deadline passed before this sample ran"
        try:  # the file holding the expected outputs, however the task was loaded, must be out of reach
            self.sandbox.protect_file(example.meta.get("source_file"))
        except SandboxUnavailable as e:
            self._count("launch_failures")
            return None, str(e)
        spec = {"entry_point": entry, "inputs": [json.dumps(t["args"]) for t in tests],
                "per_test_seconds": self.per_test_seconds, "per_test_wall_seconds": self.test_wall_seconds}
        files = {"harness.py": HARNESS.read_text(), "spec.json": json.dumps(spec),
                 "solution.py": extract_program(completion, prompt, entry)}
        return self.judge(self.sandbox.run(files, ["harness.py"], idle_seconds=self.stall_seconds), tests)

    def judge(self, run: RunResult, tests: list[dict]) -> tuple[float | None, str | None]:
        """The fraction of `tests` whose reported value equals the expected one."""
        ready, results = parse_protocol(run.stdout)
        with self._lock:
            self.counts["runs"] += 1
            self.seconds += run.seconds
            self.counts["timeouts"] += run.timed_out
            self.counts["stalled"] += run.stalled
            self.counts["output_limited"] += run.output_limited
            self.counts["test_timeouts"] += sum(1 for kind, v in results.values() if v == "TestTimeout")
        if not ready:  # the harness never started, so the solution never ran: not the solution's fault
            self._count("launch_failures")
            err = run.stderr.decode(errors="replace").strip().splitlines()
            return None, f"sandbox did not start (exit {run.returncode}): {err[-1] if err else 'no output'}"
        if b"@@ERROR@@ load" in run.stdout:
            self._count("load_errors")
        passed = sum(1 for i, t in enumerate(tests) if results.get(i, ("", None))[0] == "ok"
                     and passes(results[i][1], t["expected"]))
        if passed == len(tests):
            self._count("all_passed")
        return passed / len(tests), None

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def stats(self) -> dict:
        runs = self.counts["runs"]
        out = {"sandbox/backend": self.sandbox.backend, "sandbox/cpu_isolation": self.cpu_isolation,
               **{f"sandbox/{k}": v for k, v in self.counts.items()},
               "sandbox/seconds_mean": self.seconds / runs if runs else 0.0}
        return out
