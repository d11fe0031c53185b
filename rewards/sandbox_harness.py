"""Runs INSIDE the sandbox (stdlib only, `python -I -S`): load an untrusted solution, call its entry point
on each test input, and report each return value. It never sees the expected outputs: the trusted parent
compares them (rewards/code_exec.py), so a solution cannot forge a pass without computing the answer.

Files next to this script: spec.json {"entry_point", "inputs": [json text of the argument list, ...],
"per_test_seconds"} and solution.py. Protocol, one line each on the original stdout (the solution's own
prints go to stderr):  @@READY@@ | @@RESULT@@ <i> <json> | @@ERROR@@ <i|load> <ExceptionType> | @@DONE@@
"""
import json
import os
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


class TestTimeout(BaseException):
    """Raised by the per-test alarm (a BaseException, so `except Exception` in a solution can't eat it)."""


def _alarm(signum, frame):
    raise TestTimeout()


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
    signal.signal(signal.SIGALRM, _alarm)
    seconds = float(spec["per_test_seconds"])
    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        exec(compile(source, "solution.py", "exec"), namespace)
        signal.setitimer(signal.ITIMER_REAL, 0)
        fn = namespace[spec["entry_point"]]
        if not callable(fn):
            raise TypeError("entry point is not callable")
    except BaseException as e:  # noqa: BLE001 - any failure to load is the solution's
        signal.setitimer(signal.ITIMER_REAL, 0)
        say("@@ERROR@@", "load", type(e).__name__)
        return
    for i, args_json in enumerate(spec["inputs"]):
        try:
            args = json.loads(args_json)  # a fresh copy per test: mutation can't leak between tests
            signal.setitimer(signal.ITIMER_REAL, seconds)
            text = json.dumps(fn(*args))
            signal.setitimer(signal.ITIMER_REAL, 0)
            say("@@RESULT@@", i, text)
        except BaseException as e:  # noqa: BLE001
            signal.setitimer(signal.ITIMER_REAL, 0)
            say("@@ERROR@@", i, type(e).__name__)
    say("@@DONE@@")


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: nothing the solution registered (atexit, __del__) runs
