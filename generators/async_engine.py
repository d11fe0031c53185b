"""A generation engine in its own process: rounds that overlap training at a bounded staleness.

`callbacks.regenerate.max_staleness=k > 0` (docs/scaling.md) starts one `AsyncEngine`: a spawned process
holding a copy of the policy whose weights live in shared memory. The trainer pushes its weights with a
version number (`push`: `copy_` into the shared tensors under a lock: the CPU weight-update path, its
seconds and bytes counted); the engine, given the next round's prompts (`submit`), waits until the
shared weights are at least the version the request needs, copies them into its private model (so a
push never lands mid-round), samples with the wrapped generator (generator=hf) and answers with the
completions, their behaviour log-probs and the version that made them (`collect`). Rewards, annotation
and everything else stay in the trainer's process.

An engine that exits or does not answer within `timeout_s` ends the run with one line (`EngineError`);
`stop` ends the process, and is registered with atexit, so no engine outlives the run however it ends;
an engine whose parent died (kill -9) exits by itself at its next poll.
"""
from __future__ import annotations

import atexit
import copy
import os
import queue
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.multiprocessing as mp

from generators.base import GenerationOutput

POLL_S = 0.5  # how often a waiting side checks that the other is still alive


class EngineError(RuntimeError):
    """The generation engine's process died, raised, or stopped answering: the run ends with this line."""


@dataclass
class Made:
    """One round from the engine: its output, the weights version that generated it, and the engine's
    idle seconds before it (waiting for the request, then for the weights version it needed)."""

    out: GenerationOutput
    version: int
    idle_seconds: float


@dataclass
class Request:
    prompts: list[list[int]]
    seed: int
    round_index: int


def _serve(shared, tokenizer, generator, lock, version, need, requests, results, threads: int, parent: int,
           ready) -> None:
    """The engine process's loop: one request at a time, until None (or the parent is gone)."""
    torch.set_num_threads(threads)
    private, held = copy.deepcopy(shared), -1
    ready.set()  # loaded: its imports and its model (seconds, more on a loaded machine)
    idle_from = time.perf_counter()
    while True:
        try:
            req = requests.get(timeout=POLL_S)
        except queue.Empty:
            if os.getppid() != parent:
                return
            continue
        if req is None:
            return
        while version.value < need.value:  # `wait`: not before the weights are recent enough
            if os.getppid() != parent:
                return
            time.sleep(0.002)
        with lock:
            if version.value != held:
                for dst, src in zip(private.state_dict().values(), shared.state_dict().values()):
                    dst.copy_(src)
                held = version.value
        idle = time.perf_counter() - idle_from
        try:
            torch.manual_seed(req.seed)
            out = generator.sample(private, tokenizer, req.prompts)
        except Exception as e:  # noqa: BLE001 - reported to the trainer as one line
            results.put(("error", req.round_index, f"{type(e).__name__}: {e}"))
        else:
            results.put(("ok", req.round_index, out, held, idle))
        idle_from = time.perf_counter()


@contextmanager
def _main_hidden():
    """Start a spawned child without importing the parent's main script (train.py imports every layer of
    the project, a third of the engine's start on the 2-core machine): the engine needs only what its
    arguments' pickles import."""
    main = sys.modules["__main__"]
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.update(saved)
        if "__spec__" not in saved:
            del main.__spec__


class AsyncEngine:
    """The trainer's handle on the engine process (one per stage; generator=hf, one process, CPU or one GPU)."""

    def __init__(self, generator, policy, tokenizer, threads: int, timeout_s: float):
        ctx = mp.get_context("spawn")
        self.shared = copy.deepcopy(policy).requires_grad_(False).share_memory()
        self.tensors = self._unique(self.shared)
        self.lock, self.version, self.need = ctx.Lock(), ctx.Value("q", -1), ctx.Value("q", -1)
        self.ready = ctx.Event()  # set by the engine once it has loaded
        self.requests, self.results = ctx.Queue(), ctx.Queue()
        self.timeout_s, self.pending = timeout_s, None
        self.sync_seconds = self.sync_bytes = 0.0  # the weight-update path, since the engine started
        self.process = ctx.Process(target=_serve, daemon=True, name="policyshift-engine",
                                   args=(self.shared, tokenizer, generator, self.lock, self.version, self.need,
                                         self.requests, self.results, threads, os.getpid(), self.ready))
        with _main_hidden():
            self.process.start()
        atexit.register(self.stop)

    @staticmethod
    def _unique(model) -> list[torch.Tensor]:
        """The model's state tensors, each storage once (tied weights are one tensor)."""
        seen, out = set(), []
        for t in model.state_dict().values():
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                out.append(t)
        return out

    def push(self, policy, version: int) -> None:
        """Copy the policy's weights into the engine's shared copy and number them `version`."""
        if version == self.version.value:
            return
        start, source = time.perf_counter(), self._unique(policy)
        with torch.no_grad(), self.lock:
            for dst, src in zip(self.tensors, source):
                dst.copy_(src.detach())
            self.version.value = version
        self.sync_seconds += time.perf_counter() - start
        self.sync_bytes += sum(t.numel() * t.element_size() for t in self.tensors)

    @property
    def loaded(self) -> bool:
        """Whether the engine process has loaded (imported what it needs and copied the model); EngineError
        if it exited before (a trainer that never asks it would otherwise make every round itself)."""
        if not self.ready.is_set() and self.process.exitcode is not None:
            raise EngineError(f"the generation engine (process {self.process.pid}) exited with code "
                              f"{self.process.exitcode} while loading (callbacks.regenerate.max_staleness > 0 runs "
                              f"it in its own process)")
        return self.ready.is_set()

    @property
    def waiting(self) -> bool:
        """Whether a submitted request waits for a weights version not yet pushed."""
        return self.pending is not None and self.version.value < self.need.value

    def submit(self, prompts: list[list[int]], seed: int, round_index: int, need: int) -> None:
        """Ask for one completion per prompt, generated with weights of version ≥ `need`."""
        self.need.value = need
        self.pending = round_index
        self.requests.put(Request(prompts, seed, round_index))

    def lower_need(self, need: int) -> None:
        """The trainer now serves the round at an earlier version than planned (the round ended early)."""
        self.need.value = min(self.need.value, need)

    def collect(self) -> Made:
        """The pending round's output (blocks); EngineError if the engine died, raised or timed out."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                msg = self.results.get(timeout=POLL_S)
                break
            except queue.Empty:
                if not self.process.is_alive():
                    self.stop()
                    raise EngineError(f"the generation engine (process {self.process.pid}) exited with code "
                                      f"{self.process.exitcode} while generating round {self.pending + 1} "
                                      f"(callbacks.regenerate.max_staleness > 0 runs it in its own process)")
                if time.monotonic() > deadline:
                    self.stop()
                    raise EngineError(f"the generation engine (process {self.process.pid}) did not answer round "
                                      f"{self.pending + 1} within {self.timeout_s:g} s "
                                      f"(callbacks.regenerate.engine_timeout_s)")
        self.pending = None
        if msg[0] == "error":
            self.stop()
            raise EngineError(f"the generation engine failed on round {msg[1] + 1}: {msg[2]}")
        _, _, out, version, idle = msg
        return Made(out, version, idle)

    def stop(self) -> None:
        """End the engine process (idempotent): ask, then terminate, then kill."""
        proc = self.process
        if proc.pid is None or proc.exitcode is not None:
            return
        try:
            self.requests.put(None)
        except (OSError, ValueError):
            pass
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join()
