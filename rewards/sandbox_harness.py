"""Runs INSIDE the sandbox (stdlib only, `python -I -S`): load an untrusted solution, call its entry point
on each test input, and report each return value. It never sees the expected outputs: the trusted parent
compares them (rewards/code_exec.py), so a solution cannot forge a pass without computing the answer.

Files next to this script: spec.json {"entry_point", "inputs": [json text of the argument list, ...],
"per_test_seconds", "per_test_wall_seconds"} and solution.py. Protocol, one line each on the original
stdout (the solution's own prints go to stderr):
    @@READY@@ | @@RESULT@@ <i> <json> | @@ERROR@@ <i|load> <ExceptionType> | @@DONE@@

Each test (and loading the solution) is limited in CPU time, `per_test_seconds` of this process's own CPU
(ITIMER_PROF, SIGPROF): a test is not failed because other processes (another sample's, the trainer's)
took the CPU while it waited. A wall-clock backstop, `per_test_wall_seconds` (ITIMER_REAL, SIGALRM, set
by the parent with room for sharing the CPU), ends a test that sleeps or waits instead of computing.

Each alarm repeats every RETRY_S (of its own clock) after it first fires, until the test ends: a TestTimeout that
was lost (a solution recursing at its limit turns the handler call into a RecursionError, which it may
catch) is raised again, so such a test ends about when its time is up. sys.setrecursionlimit is capped
at MAX_RECURSION, so a solution that raises the limit and recurses until it fails gets its RecursionError
in milliseconds instead of growing frames until memory runs out. A solution that defeats even that
(catching BaseException, replacing the handler) goes silent, and the parent kills the run (stalled).
"""
import json
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RETRY_S = 0.05
MAX_RECURSION = 100_000  # frames; deeper recursion raises RecursionError
_armed = [False]  # a test is running: only then does the alarm raise


class TestTimeout(BaseException):
    """Raised by the per-test alarm (a BaseException, so `except Exception` in a solution can't eat it)."""


def _alarm(signum, frame):
    if _armed[0]:
        raise TestTimeout()


def cap_recursion_limit() -> None:
    set_limit = sys.setrecursionlimit

    def capped(limit):
        set_limit(min(limit, MAX_RECURSION))

    sys.setrecursionlimit = capped


def guarded(call, seconds: tuple[float, float]):
    """("ok", call()) or ("error", exception name), under the CPU alarm and the wall backstop; never raises,
    both are off after. `_armed[0] = False` comes first in each exit path, before any call (where a
    pending alarm could run)."""
    cpu_seconds, wall_seconds = seconds
    signal.signal(signal.SIGPROF, _alarm)  # again each time: the solution may have replaced them
    signal.signal(signal.SIGALRM, _alarm)
    try:
        _armed[0] = True
        signal.setitimer(signal.ITIMER_PROF, cpu_seconds, RETRY_S)
        signal.setitimer(signal.ITIMER_REAL, wall_seconds, RETRY_S)
        value = call()
        _armed[0] = False
        outcome = ("ok", value)
    except BaseException as e:  # noqa: BLE001 - any failure is the solution's
        _armed[0] = False
        outcome = ("error", type(e).__name__)
    signal.setitimer(signal.ITIMER_PROF, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    return outcome


def main() -> None:
    proto = os.dup(1)  # the protocol channel; fd 1 becomes stderr for whatever the solution prints
    os.dup2(2, 1)

    def say(*parts) -> None:
        os.write(proto, (" ".join(str(p) for p in parts) + "\n").encode())

    with open(os.path.join(HERE, "spec.json")) as f:
        spec = json.load(f)
    with open(os.path.join(HERE, "solution.py")) as f:
        source = f.read()
    say("@@READY@@")
    seconds = float(spec["per_test_seconds"]), float(spec["per_test_wall_seconds"])
    cap_recursion_limit()
    namespace = {"__name__": "solution", "__builtins__": __builtins__}

    def load():
        exec(compile(source, "solution.py", "exec"), namespace)
        fn = namespace[spec["entry_point"]]
        if not callable(fn):
            raise TypeError("entry point is not callable")
        return fn

    kind, fn = guarded(load, seconds)
    if kind == "error":
        say("@@ERROR@@", "load", fn)
        return
    for i, args_json in enumerate(spec["inputs"]):
        # fresh args per test (mutation can't leak between tests); the reply is encoded under the alarm too
        kind, value = guarded(lambda: json.dumps(fn(*json.loads(args_json))), seconds)
        say("@@RESULT@@" if kind == "ok" else "@@ERROR@@", i, value)
    say("@@DONE@@")


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: nothing the solution registered (atexit, __del__) runs
