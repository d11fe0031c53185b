"""Asynchronous rounds on vLLM servers (`generator=vllm_server` with `callbacks.regenerate.max_staleness=k > 0`).

The engines already run in processes of their own (generators/vllm_fleet.py), so nothing is spawned: a
thread of the trainer's process sends the next round's requests (HTTP: the thread waits on sockets, the
trainer's training keeps the cores) while the trainer trains this one. `ServerEngine` has the interface of
generators/async_engine.py's `AsyncEngine`, which callbacks/async_rounds.py drives:

- `push(policy, version)` (the trainer's thread): the policy's weights are written as a safetensors folder
  (`VLLMServerGenerator.stage`) and become the newest staged version. A staged version nobody loaded is
  replaced by a newer one (its folder removed). The engines are not touched: a round being generated
  keeps the weights it started with.
- the thread, per request: waits until the newest version (staged or held) is at least the request's
  `need` (past_bound=wait), has every engine load the staged weights if they are newer than the ones it
  holds (`load_staged`: vLLM's in-place `reload_weights`), then samples with a generator seeded by the
  request's seed (never torch's global RNG, which the trainer's thread draws from) and answers with the
  version the engines held: every record of the round names it.
- The generator's lock keeps the trainer's own pushes (held-out evaluation, a round past the bound made
  in the trainer's process) from landing mid-round: they wait for the round in flight to end.

Weight-sync seconds count the trainer's writing and the engines' loading; bytes, the weights loaded.
An engine that dies or stops answering raises `EngineError` (one line) from `collect`, as the spawned
engine does; `stop` ends the thread, and the generator's `close` the engines it started.
"""
from __future__ import annotations

import shutil
import threading
import time

import torch

from generators.async_engine import POLL_S, EngineError, Made, Request


class ServerEngine:
    """The asynchronous rounds' handle on `generator=vllm_server`'s engines; see the module docstring."""

    def __init__(self, generator, policy, tokenizer, threads: int, timeout_s: float):
        del threads  # the engines' cores are theirs (generator.cpu_cores / gpus)
        self.generator, self.policy, self.tokenizer, self.timeout_s = generator, policy, tokenizer, timeout_s
        self.cond = threading.Condition()
        self.staged: tuple[int, str, int] | None = None  # (version, folder, bytes) written, not yet loaded
        self.need, self.pending, self.request, self.result = -1, None, None, None
        self.stopped = False
        self.sync_seconds = self.sync_bytes = 0.0
        generator.connect(policy, tokenizer)  # in the trainer's thread: started engines load its weights
        self._loaded_before = (generator.sync_seconds, generator.sync_bytes)
        self.thread = threading.Thread(target=self._serve, daemon=True, name="policyshift-engine-requests")
        self.thread.start()

    loaded = True  # the engines were started (or reached) above, before the trainer goes on

    @property
    def newest(self) -> int:
        """The newest weights version the engines hold or can load now."""
        held = -1 if self.generator.held is None else self.generator.held
        return max(held, self.staged[0]) if self.staged is not None else held

    @property
    def waiting(self) -> bool:
        return self.pending is not None and self.newest < self.need

    # ---- the trainer's thread -------------------------------------------------------------------
    def push(self, policy, version: int) -> None:
        """Stage the policy's weights as `version` for the engines to load before their next round."""
        if version <= self.newest:
            return
        start = time.perf_counter()
        folder, nbytes = self.generator.stage(policy, version)
        with self.cond:
            old, self.staged = self.staged, (version, folder, nbytes)
            self.cond.notify_all()
        if old is not None:  # never loaded: a newer version replaced it
            shutil.rmtree(old[1], ignore_errors=True)
        self.sync_seconds += time.perf_counter() - start

    def submit(self, prompts: list[list[int]], seed: int, round_index: int, need: int) -> None:
        with self.cond:
            self.need, self.pending, self.result = need, round_index, None
            self.request = Request(prompts, seed, round_index)
            self.cond.notify_all()

    def lower_need(self, need: int) -> None:
        with self.cond:
            self.need = min(self.need, need)
            self.cond.notify_all()

    def collect(self) -> Made:
        """The pending round's output (blocks); EngineError if an engine failed or the round timed out."""
        deadline = time.monotonic() + self.timeout_s
        with self.cond:
            while self.result is None:
                if time.monotonic() > deadline:
                    raise EngineError(f"the vLLM engines did not answer round {self.pending + 1} within "
                                      f"{self.timeout_s:g} s (callbacks.regenerate.engine_timeout_s)")
                self.cond.wait(POLL_S)
            result, self.result, self.pending = self.result, None, None
        if isinstance(result, BaseException):
            raise result if isinstance(result, EngineError) else EngineError(
                f"the vLLM engines' thread failed on a round: {type(result).__name__}: {result}")
        loaded_s = self.generator.sync_seconds - self._loaded_before[0]
        loaded_b = self.generator.sync_bytes - self._loaded_before[1]
        self._loaded_before = (self.generator.sync_seconds, self.generator.sync_bytes)
        self.sync_seconds += loaded_s
        self.sync_bytes += loaded_b
        return result

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self.thread.join(timeout=5)  # a request in flight ends when the generator closes its engines
        if self.staged is not None:
            shutil.rmtree(self.staged[1], ignore_errors=True)
            self.staged = None

    # ---- the engines' thread --------------------------------------------------------------------
    def _serve(self) -> None:
        idle_from = time.perf_counter()
        while True:
            with self.cond:
                while not self.stopped and (self.request is None or self.newest < self.need):
                    self.cond.wait(POLL_S)
                if self.stopped:
                    return
                req, self.request = self.request, None
                staged, held = self.staged, self.generator.held
                if staged is not None and (held is None or staged[0] > held):
                    self.staged = None
                else:
                    staged = None
            idle = time.perf_counter() - idle_from
            try:
                with self.generator.lock:
                    if staged is not None:
                        self.generator.load_staged(staged[1], staged[0], staged[2])
                    rng = torch.Generator().manual_seed(req.seed)
                    out = self.generator.sample_held(self.policy, self.tokenizer, req.prompts, rng)
                    result: Made | BaseException = Made(out, self.generator.held, idle)
            except BaseException as e:  # noqa: BLE001 - the trainer's collect raises it, as one line
                result = e
            with self.cond:
                self.result = result
                self.cond.notify_all()
            idle_from = time.perf_counter()
