"""Call a function in a worker process that is killed when a call overruns its limit.

Python cannot stop a thread: a call abandoned after a timeout keeps running (and holding the GIL) until it
returns, perhaps never, and each new hang adds one. `WorkerCall` runs `fn` in a child interpreter
(this file run as a script: it imports only what unpickling `fn` needs) and SIGKILLs it at the
limit; the next call starts a fresh one. Nothing is left running after a timeout.

Protocol over two pipes (multiprocessing.connection framing): the parent sends sys.path, then pickled
(modules to preload, `fn`); the child imports them and answers "ready"; then, per call, pickled args →
("ok", value) | ("error", "Type: message").
The child exits when its parent does (a watchdog thread sees the parent pid change).
"""
from __future__ import annotations

import atexit
import importlib
import os
import pickle
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing.connection import Connection
from typing import Callable

STARTUP_S = 120.0  # importing fn's module in the worker (torch, a tokenizer...) is not part of a call's limit
_live: weakref.WeakSet = weakref.WeakSet()


class CallTimeout(TimeoutError):
    """The call overran its limit; the worker was killed."""


class CallError(RuntimeError):
    """fn raised in the worker (the message is "Type: message"), or the worker died or did not start."""


class WorkerCall:
    def __init__(self, fn: Callable, label: str, preload: tuple[str, ...] = ()):
        """`preload`: modules the worker imports before it reports ready (those the arguments' classes live
        in), so that importing them is not charged to the first call's limit."""
        self.proc: subprocess.Popen | None = None
        self.conn: tuple[Connection, Connection] | None = None  # (to the child, from the child)
        self.payload = pickle.dumps((list(preload), fn))  # raises for a fn another process cannot load
        self.label = label
        self._lock = threading.Lock()
        _live.add(self)

    def __call__(self, args: tuple, timeout_s: float):
        """fn(*args) in the worker; CallTimeout after `timeout_s` (the worker is killed), CallError if fn
        raised or the worker died."""
        with self._lock:
            to_child, from_child = self._worker()
            to_child.send_bytes(pickle.dumps(args))
            reply = self._receive(from_child, time.monotonic() + timeout_s)
            if reply is None:
                self.close()
                raise CallTimeout(f"timed out after {timeout_s:g}s (worker process killed)")
            kind, value = reply
            if kind == "error":
                raise CallError(value)
            return value

    def _worker(self) -> tuple[Connection, Connection]:
        if self.proc is not None and self.proc.poll() is None:
            return self.conn
        self.close()
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(down_r), str(up_w)],
                                     pass_fds=(down_r, up_w), stdin=subprocess.DEVNULL)
        os.close(down_r)
        os.close(up_w)
        self.conn = Connection(down_w, readable=False), Connection(up_r, writable=False)
        self.conn[0].send_bytes(pickle.dumps(list(sys.path)))
        self.conn[0].send_bytes(self.payload)
        if self._receive(self.conn[1], time.monotonic() + STARTUP_S) != ("ready", None):
            self.close()
            raise CallError(f"the worker process for {self.label} did not start")
        return self.conn

    def _receive(self, conn: Connection, deadline: float):
        """The child's next message, None at the deadline; CallError if it died meanwhile."""
        try:
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                return None
            return pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            code = self.proc.wait() if self.proc else None
            self.close()
            raise CallError(f"the worker process for {self.label} died (exit {code})") from None

    def close(self) -> None:
        """Kill the worker (if any) and wait for it: no process or thread remains."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
        for c in self.conn or ():
            c.close()
        self.conn = None

    def __del__(self):
        self.close()


@atexit.register
def _close_all() -> None:
    for call in list(_live):
        call.close()


def serve(fd_in: int, fd_out: int) -> None:
    """The worker's loop: load fn, then answer calls until the parent closes the pipe or dies."""
    inbox, outbox = Connection(fd_in, writable=False), Connection(fd_out, readable=False)
    parent = os.getppid()

    def watchdog():  # a hung fn must not outlive the trainer
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watchdog, daemon=True).start()
    sys.path[:] = pickle.loads(inbox.recv_bytes())
    preload, fn = pickle.loads(inbox.recv_bytes())
    for name in preload:
        importlib.import_module(name)
    outbox.send_bytes(pickle.dumps(("ready", None)))
    while True:
        try:
            args = pickle.loads(inbox.recv_bytes())
        except EOFError:
            return
        try:
            reply = ("ok", fn(*args))
            data = pickle.dumps(reply)
        except BaseException as e:  # noqa: BLE001 - handed back to the parent
            data = pickle.dumps(("error", f"{type(e).__name__}: {e}"))
        outbox.send_bytes(data)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
