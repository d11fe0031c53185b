"""vLLM engines in their own processes (`generator=vllm_server`, generators/vllm_server.py): vLLM's own
OpenAI-compatible server (`python -m vllm.entrypoints.openai.api_server`, what `vllm serve` runs), started
by the run or by the user, and the trainer's side of it: HTTP calls with a timeout on every one, and the
weight push.

Started engines: one process per engine (its port `port + i`, its GPUs `CUDA_VISIBLE_DEVICES` or its CPU
cores `VLLM_CPU_OMP_THREADS_BIND`), each in its own process group, with `VLLM_SERVER_DEV_MODE=1` (the
/collective_rpc, /reset_prefix_cache and weight-version endpoints) and vLLM's processed log-probs. They are
stopped (the whole group: SIGTERM, then SIGKILL) by `stop()`, which the generator's owner calls at the end
of a stage and atexit calls at the end of the process; a trainer killed by SIGKILL takes them with it
(`PR_SET_PDEATHSIG`: the kernel sends the server SIGTERM when its parent dies).

The weight push is a safetensors hand-off through vLLM's in-place reload: the trainer writes the weights
(HF names, LoRA merged: generators.vllm.policy_weights) as one file per decoder layer into a fresh folder,
then every engine runs `reload_weights(weights_path=folder)` (POST /collective_rpc: vLLM's loader reads the
folder, re-fuses qkv/gate_up and re-packs its CPU kernels' layouts), drops its prefix cache (cached blocks
hold the old weights' keys and values) and records the version (POST /update_weight_version). One layer is
in memory at a time beyond the policy. The folder is on /dev/shm where there is one; engines on other
machines need `weight_dir` on a filesystem they share with the trainer.

Any failure (an engine that exited, a refused connection, no answer within `timeout_s`, an HTTP error) is
an `EngineError` (generators/async_engine.py): one line naming the engine, its address and its log.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import httpx
import torch

from generators.async_engine import EngineError

SERVED_NAME = "policy"  # the model name the started engines answer to
HEALTH_POLL_S = 1.0


def _die_with_parent(cores: set[int] | None = None) -> None:  # runs in the child between fork and exec
    """The started engine dies with the trainer; with `cores`, every process of it (the API server, the
    engine core, its workers) runs on those cores only, not just the OpenMP threads vLLM binds itself: on a
    shared CPU its other processes otherwise take the trainer's cores (docs/scaling.md)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: atexit and stop() still end it
    if cores and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cores)
        except OSError:
            pass  # a core this machine lacks: vLLM's own binding reports it, in the engine's log


def cpu_set(spec: str | None) -> set[int] | None:
    """The cores of a VLLM_CPU_OMP_THREADS_BIND value ("1", "0-7", "0-3,8-11", "0-7|8-15" for TP ranks);
    None for vLLM's own words (auto, all, nobind) or nothing."""
    if not spec or not any(c.isdigit() for c in spec) or any(c.isalpha() for c in spec):
        return None
    cores: set[int] = set()
    for part in spec.replace("|", ",").split(","):
        low, _, high = part.strip().partition("-")
        cores.update(range(int(low), int(high or low) + 1))
    return cores


def layer_shards(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, dict[str, torch.Tensor]]]:
    """(file stem, tensors) per decoder layer (`...layers.<i>....`), the rest in `other`; tensors that share
    storage (tied embeddings) are cloned, which safetensors needs."""
    seen: set[int] = set()
    group, tensors = None, {}
    for name, t in weights:
        parts = name.split(".")
        key = next((f"layer-{int(p):05d}" for p in parts if p.isdigit()), "other")
        if key != group and tensors:
            yield group, tensors
            tensors = {}
        group = key
        t = t.detach().to("cpu")
        ptr = t.untyped_storage().data_ptr()
        tensors[name] = t.clone().contiguous() if ptr in seen else t.contiguous()
        seen.add(ptr)
    if tensors:
        yield group, tensors


def write_weights(weights: Iterable[tuple[str, torch.Tensor]], folder: str) -> int:
    """Write `weights` as safetensors files into `folder` (one a layer; names repeat across groups: a file
    per group, numbered); the bytes written."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    total = 0
    for i, (stem, tensors) in enumerate(layer_shards(weights)):
        save_file(tensors, os.path.join(folder, f"{i:05d}-{stem}.safetensors"))
        total += sum(t.numel() * t.element_size() for t in tensors.values())
    return total


class EngineFleet:
    """The engines a generator samples from: started here (`start`) or the user's (`urls`)."""

    def __init__(self, urls: list[str], timeout_s: float, startup_timeout_s: float):
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout_s, self.startup_timeout_s = timeout_s, startup_timeout_s
        self.processes: list[subprocess.Popen | None] = [None] * len(self.urls)
        self.logs: list[str | None] = [None] * len(self.urls)
        self.client = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
                                   limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        self.names: list[str] = [SERVED_NAME] * len(self.urls)
        self.folder: str | None = None  # started engines: their model folder and logs
        self.failed: EngineError | None = None  # the first failure (its engines' logs are kept)
        self._failing = threading.Lock()  # concurrent requests may fail at once: one is the first
        atexit.register(self.stop)

    # ---- processes ------------------------------------------------------------------------------
    @classmethod
    def start(cls, model_dir: str, engines: int, host: str, port: int, args: list[str], envs: list[dict],
              python: str | None, folder: str, timeout_s: float, startup_timeout_s: float) -> "EngineFleet":
        """Start `engines` servers of the model in `model_dir` (ports port, port+1, ...), each with its
        own environment additions `envs[i]`; return once every one answers /health."""
        fleet = cls([f"http://{host}:{port + i}" for i in range(engines)], timeout_s, startup_timeout_s)
        fleet.folder = folder
        env = os.environ | {"VLLM_SERVER_DEV_MODE": "1"}
        for i in range(engines):
            log = os.path.join(folder, f"engine{i}.log")
            command = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                       "--served-model-name", SERVED_NAME, "--host", host, "--port", str(port + i),
                       "--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
                       "--disable-uvicorn-access-log", *args]
            with open(log, "w") as out:
                fleet.processes[i] = subprocess.Popen(command, env=env | envs[i], stdout=out, stderr=subprocess.STDOUT,
                                                      stdin=subprocess.DEVNULL, start_new_session=True,
                                                      preexec_fn=functools.partial(
                                                          _die_with_parent, cpu_set(envs[i].get("VLLM_CPU_OMP_THREADS_BIND"))))
            fleet.logs[i] = log
        fleet.wait_healthy()
        return fleet

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        pending = set(range(len(self.urls)))
        while pending:
            for i in sorted(pending):
                self.check_alive(i, "starting")
                try:
                    if self.client.get(f"{self.urls[i]}/health", timeout=5.0).status_code == 200:
                        pending.discard(i)
                except httpx.HTTPError:
                    pass
            if pending and time.monotonic() > deadline:
                i = min(pending)
                raise self._fail(i, f"did not answer /health within {self.startup_timeout_s:g} s of its start "
                                    f"(generator.startup_timeout_s)")
            if pending:
                time.sleep(HEALTH_POLL_S)

    def check_alive(self, i: int, doing: str) -> None:
        proc = self.processes[i]
        if proc is not None and proc.poll() is not None:
            raise self._fail(i, f"exited with code {proc.returncode} while {doing}")

    def _fail(self, i: int, what: str) -> EngineError:
        """The fleet's first failure (every later one, e.g. a concurrent request to the engines this stopped,
        reports the first: its cause, not "exited with code -9"); the engines are stopped, their logs kept."""
        with self._failing:
            if self.failed is None:
                where = f"; its log: {self.logs[i]}" if self.logs[i] else ""
                self.failed = EngineError(f"vLLM engine {i} ({self.urls[i]}) {what}{where}")
                self.stop(keep_logs=True)
        return self.failed

    def stop(self, keep_logs: bool = False) -> None:
        """End every started engine (its whole process group; idempotent) and remove their folder (its logs
        kept when `keep_logs` or once an engine failed). The user's engines are left running."""
        keep_logs = keep_logs or self.failed is not None
        for proc in self.processes:
            if proc is None or proc.poll() is not None:
                continue
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self.folder is not None and os.path.isdir(self.folder):
            for entry in os.listdir(self.folder):
                if not (keep_logs and entry.endswith(".log")):
                    path = os.path.join(self.folder, entry)
                    shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)
            if not keep_logs:
                shutil.rmtree(self.folder, ignore_errors=True)

    # ---- HTTP -----------------------------------------------------------------------------------
    def call(self, i: int, path: str, body: dict | None = None, doing: str = "") -> dict:
        """POST `body` (JSON) to engine i's `path`; its JSON answer (EngineError on any failure)."""
        self.check_alive(i, doing or path)
        try:
            response = self.client.post(f"{self.urls[i]}{path}", json=body)
        except httpx.TimeoutException:
            self.check_alive(i, doing or path)
            raise self._fail(i, f"did not answer {path} within {self.timeout_s:g} s while {doing or path} "
                                f"(generator.timeout_s)") from None
        except httpx.HTTPError as e:
            self.check_alive(i, doing or path)
            raise self._fail(i, f"is not reachable ({type(e).__name__}: {e}) while {doing or path}") from None
        if response.status_code != 200:
            raise self._fail(i, f"answered {path} with HTTP {response.status_code} while {doing or path}: "
                                f"{response.text[:300]!r}")
        return response.json() if response.content else {}

    def served_names(self) -> None:
        """The model name each engine answers to (GET /v1/models: the user's engines name theirs)."""
        for i, url in enumerate(self.urls):
            try:
                models = self.client.get(f"{url}/v1/models").json()["data"]
                self.names[i] = models[0]["id"]
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
                raise self._fail(i, f"did not list its model at /v1/models ({type(e).__name__}: {e})") from None

    def weight_version(self, i: int) -> str:
        try:
            return self.client.get(f"{self.urls[i]}/weight_info").json()["weight_version"]
        except (httpx.HTTPError, KeyError, ValueError) as e:
            raise self._fail(i, f"did not answer /weight_info ({type(e).__name__}: {e}); a server the run did "
                                f"not start needs VLLM_SERVER_DEV_MODE=1") from None

    def on_every(self, fn) -> list:
        """fn(i) on every engine at once (the first error raised)."""
        if len(self.urls) == 1:
            return [fn(0)]
        with ThreadPoolExecutor(len(self.urls), thread_name_prefix="engine") as pool:
            return list(pool.map(fn, range(len(self.urls))))

    def push(self, weights: Iterable[tuple[str, torch.Tensor]], folder: str, version: str) -> int:
        """Hand `weights` to every engine through a safetensors folder, name them `version`; the bytes."""
        written = write_weights(weights, folder)
        self.reload(folder, version)
        return written

    def reload(self, folder: str, version: str) -> None:
        """Every engine loads the weights written in `folder` (then removed) and names them `version`
        (asynchronous rounds: the trainer writes the folder, the engines' thread has them loaded)."""

        def reload(i: int) -> None:
            doing = f"loading weights version {version}"
            self.call(i, "/collective_rpc", {"method": "reload_weights", "kwargs": {
                "weights_path": folder, "is_checkpoint_format": True}}, doing)
            self.call(i, "/reset_prefix_cache", None, doing)
            self.call(i, "/update_weight_version", {"new_version": version}, doing)

        try:
            self.on_every(reload)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
