"""Code execution reward: a completion is a Python function; reward = fraction of the example's unit tests
it passes, run in a sandbox (rewards/sandbox.py). Model output is untrusted.

Example.meta carries `entry_point` (the function's name) and `tests`: [{"args": [...], "expected": ...}].
Inside the sandbox, rewards/sandbox_harness.py calls the function on each test's args and reports the
return values; the expected values never enter the sandbox and are compared here.

Scores: passed / len(tests) whenever the program ran (a syntax error, crash, timeout, memory error or
output flood fails the tests it did not report). None (abstain, counted) only when it could not be
judged: no tests in the example, the sandbox did not start, or the batch deadline had passed.
"""
from __future__ import annotations

import json
import math
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from data_modules.tasks.base import Example
from rewards.base import RewardSource, ScoreReport
from rewards.sandbox import Sandbox

HARNESS = Path(__file__).resolve().parent / "sandbox_harness.py"
LINE = re.compile(rb"^@@(READY|RESULT|ERROR|DONE)@@(?: (\S+))?(?: (.*))?$", re.M)
FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


def extract_program(completion: str, prompt: str, entry_point: str) -> str:
    """The code to run: the first ``` fenced block if any, else the completion; a completion that does
    not define `entry_point` but continues a prompt that does (HumanEval style) is appended to it."""
    m = FENCE.search(completion)
    code = m.group(1) if m else completion
    defines = re.compile(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", re.M)
    if not defines.search(code) and defines.search(prompt):
        return prompt[defines.search(prompt).start() :] + code
    return code


def parse_protocol(stdout: bytes) -> tuple[bool, dict[int, tuple[str, Any]]]:
    """(the harness started, {test index: ("ok", value) | ("error", exception name)}). The first line
    for an index wins; unparsable values count as errors."""
    ready, results = False, {}
    for kind, key, rest in LINE.findall(stdout):
        if kind == b"READY":
            ready = True
        elif kind in (b"RESULT", b"ERROR") and key.isdigit() and int(key) not in results:
            if kind == b"ERROR":
                results[int(key)] = ("error", rest.decode(errors="replace"))
                continue
            try:
                results[int(key)] = ("ok", json.loads(rest))
            except ValueError:
                results[int(key)] = ("error", "UnparsableResult")
    return ready, results


def same(got: Any, want: Any) -> bool:
    """JSON values equal; floats within 1e-6 relative; bools are not numbers."""
    if isinstance(got, bool) or isinstance(want, bool):
        return type(got) is type(want) and got == want
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(same(a, b) for a, b in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want


class CodeExecReward(RewardSource):
    version = "1"

    def __init__(self, name: str, sandbox: Callable[..., Sandbox], allow_weak_sandbox: bool,
                 per_test_seconds: float, workers: int, timeout_s: float):
        self.name, self.per_test_seconds, self.workers = name, per_test_seconds, workers
        self.timeout_s = timeout_s
        self.sandbox = sandbox(allow_weak=allow_weak_sandbox)  # raises SandboxUnavailable: refuse to start
        if timeout_s < self.sandbox.wall_seconds + 2:
            raise ValueError(f"reward.timeout_s={timeout_s} must exceed reward.sandbox.wall_seconds + 2 = "
                             f"{self.sandbox.wall_seconds + 2}: a batch must fit at least one run")
        self.version = f"1:{self.sandbox.backend}"
        self._lock = threading.Lock()
        self.counts = {"runs": 0, "all_passed": 0, "timeouts": 0, "test_timeouts": 0, "output_limited": 0,
                       "load_errors": 0, "launch_failures": 0, "no_tests": 0, "skipped_deadline": 0}
        self.seconds = 0.0

    def score(self, prompts: list[str], completions: list[str], examples: list[Example]) -> list[float | None]:
        return self.score_report(prompts, completions, examples).scores

    def score_report(self, prompts, completions, examples) -> ScoreReport:
        # no launch after this: every run started finishes (wall_seconds) before safe_score gives up
        deadline = time.monotonic() + self.timeout_s - self.sandbox.wall_seconds - 1.0
        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="sandbox") as pool:
            outs = list(pool.map(lambda a: self.score_one(*a, deadline), zip(prompts, completions, examples)))
        errors = [e for _, e in outs if e]
        return ScoreReport([s for s, _ in outs], errors=len(errors),
                           first_error=f"{self.name}: {errors[0]}" if errors else None)

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
        spec = {"entry_point": entry, "inputs": [json.dumps(t["args"]) for t in tests],
                "per_test_seconds": self.per_test_seconds}
        files = {"harness.py": HARNESS.read_text(), "spec.json": json.dumps(spec),
                 "solution.py": extract_program(completion, prompt, entry)}
        run = self.sandbox.run(files, ["harness.py"])
        ready, results = parse_protocol(run.stdout)
        with self._lock:
            self.counts["runs"] += 1
            self.seconds += run.seconds
            self.counts["timeouts"] += run.timed_out
            self.counts["output_limited"] += run.output_limited
            self.counts["test_timeouts"] += sum(1 for kind, v in results.values() if v == "TestTimeout")
        if not ready:  # the harness never started, so the solution never ran: not the solution's fault
            self._count("launch_failures")
            err = run.stderr.decode(errors="replace").strip().splitlines()
            return None, f"sandbox did not start (exit {run.returncode}): {err[-1] if err else 'no output'}"
        if b"@@ERROR@@ load" in run.stdout:
            self._count("load_errors")
        passed = sum(1 for i, t in enumerate(tests) if results.get(i, ("", None))[0] == "ok"
                     and same(results[i][1], t["expected"]))
        if passed == len(tests):
            self._count("all_passed")
        return passed / len(tests), None

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def stats(self) -> dict:
        runs = self.counts["runs"]
        out = {"sandbox/backend": self.sandbox.backend, **{f"sandbox/{k}": v for k, v in self.counts.items()},
               "sandbox/seconds_mean": self.seconds / runs if runs else 0.0}
        return out
