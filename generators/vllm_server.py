"""vLLM engines in their own processes behind the generator seam (`generator=vllm_server`; docs/scaling.md).

Generation runs in vLLM's own OpenAI-compatible servers (generators/vllm_fleet.py), not in the trainer's
process: `engines: N` starts N of them at the first round (ports `port`..`port+N-1`, on the `gpus` or
`cpu_cores` given to each), or `urls: [...]` connects to servers the user started (docs/scaling.md: the
command). Each prompt is one /v1/completions request with its prompt ids, its own seed (drawn from the
run's torch RNG: a seeded run asks for the same samples), the sampling settings and `logprobs: 0`; the
answer's `token_ids` are the completion and its `token_logprobs` the behaviour log-probs of the sampled
tokens (vLLM's processed log-probs: temperature, top-k and top-p applied, as generator=vllm). Prompts go
round-robin over the engines, `batch_size` requests in flight per engine.

Weights versions. The engines hold their own copy of the weights, numbered by the trainer's policy version
(its global step at the push). Callers sample inside `at_version(model, version)` (generators.base
`at_version`): on entry the policy's weights are pushed (generators/vllm_fleet.py: safetensors hand-off
and vLLM's in-place `reload_weights`) when the engines' copy is `sync_every` or more versions old (or
differs at all, `exact=True`: held-out evaluation), and the block yields the version the engines hold,
which every record of the round names as its `provenance.policy_version` (so with `sync_every: k` a
round's samples are up to k-1 versions stale, and the trainers' staleness metrics see it). A `sample`
outside such a block pushes first, every call, and its samples carry no version of ours.

Asynchronous rounds (`callbacks.regenerate.max_staleness` > 0) drive these engines from a thread of the
trainer's process (generators/async_server.py): the trainer writes a version's weights (`stage`), the thread
has the engines load them between rounds (`load_staged`) and samples; `lock` keeps a push (an evaluation's,
a round made in the trainer) from landing while a round is being generated.

An engine that exits, refuses or does not answer within `timeout_s` ends the run with one line
(`EngineError`); started engines are stopped by `close()` (the stage's end, callbacks/regenerate.py), at
process exit and when the trainer dies (generators/vllm_fleet.py).
"""
from __future__ import annotations

import copy
import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from generators.base import GenerationOutput, stop_ids
from generators.vllm import cut_at_stop, policy_weights
from generators.vllm_fleet import EngineFleet, write_weights


def shared_memory_dir() -> str | None:
    """/dev/shm where it is a writable folder (Linux): a push never touches a disk."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class VLLMServerGenerator:
    """Samples from vLLM servers in their own processes; see the module docstring."""

    name = "vllm_server"
    exact_logprobs = False
    own_processes = True  # asynchronous rounds drive these engines from a thread (generators/async_server.py)

    def __init__(self, max_new_tokens: int, temperature: float, top_p: float, top_k: int, batch_size: int,
                 ignore_eos: bool, engines: int, urls: list[str], host: str, port: int, gpus: list[str],
                 cpu_cores: list[str], python: str | None, dtype: str, max_model_len: int | None,
                 enforce_eager: bool, seed: int, gpu_memory_utilization: float, kv_cache_memory_bytes: int | None,
                 tensor_parallel_size: int, server_args: list[str], sync_every: int, weight_dir: str | None,
                 timeout_s: float, startup_timeout_s: float):
        if temperature <= 0:
            raise ValueError(f"generator.temperature must be > 0 for sampling, got {temperature}")
        self.max_new_tokens, self.temperature, self.top_p, self.top_k = max_new_tokens, temperature, top_p, top_k
        self.batch_size, self.ignore_eos = batch_size, ignore_eos
        self.engines, self.urls = engines, list(_plain_list(urls))
        self.host, self.port, self.python = host, port, python
        self.gpus, self.cpu_cores = list(_plain_list(gpus)), list(_plain_list(cpu_cores))
        self.engine_args = dict(dtype=dtype, max_model_len=max_model_len, enforce_eager=enforce_eager, seed=seed,
                                gpu_memory_utilization=gpu_memory_utilization,
                                kv_cache_memory_bytes=kv_cache_memory_bytes,
                                tensor_parallel_size=tensor_parallel_size)
        self.server_args = [str(a) for a in _plain_list(server_args)]
        self.sync_every, self.weight_dir = sync_every, weight_dir
        self.timeout_s, self.startup_timeout_s = timeout_s, startup_timeout_s
        self.fleet: EngineFleet | None = None
        self.held: int | None = None  # the version of the weights the engines hold (None: not ours / unknown)
        self._within = False  # inside at_version(): sample() uses the engines' weights as they are
        self.startup_seconds = self.sync_seconds = self.sync_bytes = 0.0
        self.pushes = 0
        self.lock = threading.RLock()  # the engines' weights: no push while a round is generated from them

    @property
    def sampling(self) -> dict:
        """The sampling settings recorded in every record's provenance."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "max_new_tokens": self.max_new_tokens, "engines": len(self.urls) or self.engines,
                "sync_every": self.sync_every}

    # ---- weights versions ------------------------------------------------------------------------
    @contextmanager
    def at_version(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, version: int,
                   exact: bool = False):
        """A block that samples `model` as of the trainer's `version`: the weights are pushed on entry when
        the engines' copy is `sync_every` versions old or more (`exact`: when it is any other version);
        yields the version the engines hold, the one the block's samples are made with."""
        with self.lock:
            due = self.held is None or version < self.held or version - self.held >= (1 if exact else self.sync_every)
            if due:
                self.push(model, tokenizer, version)
            self._within = True
            try:
                yield self.held
            finally:
                self._within = False

    def push(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, version: int | None) -> None:
        """Hand the policy's weights to every engine (starting them first if needed), as `version`."""
        with self.lock:
            started = self.fleet is None and not self.urls  # engines started now load the current weights
            if self.fleet is None:
                self._connect(model, tokenizer)
            start = time.perf_counter()
            if started:
                self.fleet.on_every(lambda i: self.fleet.call(i, "/update_weight_version",
                                                              {"new_version": str(version)}))
            else:
                self.sync_bytes += self.fleet.push(policy_weights(model), self._weights_folder(version), str(version))
            self.held = version
            self.sync_seconds += time.perf_counter() - start
            self.pushes += 1

    def connect(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        """Start the engines (or reach the user's) now, if not yet: they load the current weights, of no
        version of ours until the first push."""
        with self.lock:
            if self.fleet is None:
                self._connect(model, tokenizer)

    def stage(self, model: PreTrainedModel, version: int) -> tuple[str, int]:
        """Write the policy's weights for the engines to load later (`load_staged`): (folder, bytes). The
        engines keep generating from the weights they hold meanwhile."""
        folder = self._weights_folder(version)
        return folder, write_weights(policy_weights(model), folder)

    def load_staged(self, folder: str, version: int, nbytes: int) -> None:
        """Every engine loads the weights `stage` wrote into `folder`, as `version` (the folder is removed)."""
        with self.lock:
            start = time.perf_counter()
            self.fleet.reload(folder, str(version))
            self.held = version
            self.sync_seconds += time.perf_counter() - start
            self.sync_bytes += nbytes
            self.pushes += 1

    def _weights_folder(self, version: int | None) -> str:
        """A new folder's path for one push (write_weights makes it; the engines read it, then it is removed)."""
        folder = tempfile.mkdtemp(prefix=f"policyshift-weights-v{version}-", dir=self.weight_dir or shared_memory_dir())
        os.rmdir(folder)
        return folder

    def _connect(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        """Start the engines (or reach the user's) and learn the name they serve."""
        start = time.perf_counter()
        if self.urls:
            self.fleet = EngineFleet(self.urls, self.timeout_s, self.startup_timeout_s)
            self.fleet.wait_healthy()
            self.fleet.served_names()
        else:
            self.fleet = self._start(model, tokenizer)
        self.startup_seconds += time.perf_counter() - start

    def _start(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> EngineFleet:
        """The policy's config, tokenizer and current weights in a folder the new engines load from; then
        the servers, one per engine."""
        folder = tempfile.mkdtemp(prefix="policyshift-vllm-server-")
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        config = copy.deepcopy(base.config)
        config.architectures = [type(base).__name__]
        model_dir = os.path.join(folder, "model")
        config.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
        write_weights(policy_weights(model), model_dir)
        a = self.engine_args
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.") if a["dtype"] == "policy" else a["dtype"]
        args = ["--dtype", dtype, "--seed", str(a["seed"]), "--max-num-seqs", str(self.batch_size),
                "--tensor-parallel-size", str(a["tensor_parallel_size"]),
                "--gpu-memory-utilization", str(a["gpu_memory_utilization"])]
        args += ["--enforce-eager"] if a["enforce_eager"] else []
        args += ["--max-model-len", str(a["max_model_len"])] if a["max_model_len"] else []
        args += ["--kv-cache-memory-bytes", str(a["kv_cache_memory_bytes"])] if a["kv_cache_memory_bytes"] else []
        envs = [({"CUDA_VISIBLE_DEVICES": str(self.gpus[i])} if self.gpus else {})
                | ({"VLLM_CPU_OMP_THREADS_BIND": str(self.cpu_cores[i])} if self.cpu_cores else {})
                for i in range(self.engines)]
        fleet = EngineFleet.start(model_dir, self.engines, self.host, self.port, args + self.server_args, envs,
                                  self.python, folder, self.timeout_s, self.startup_timeout_s)
        self.urls = list(fleet.urls)
        return fleet

    def close(self) -> None:
        """Stop the engines this generator started (a later `sample` starts them again)."""
        if self.fleet is not None:
            self.fleet.stop()
            if self.fleet.processes[0] is not None:
                self.urls = []
        self.fleet, self.held = None, None

    # ---- sampling ---------------------------------------------------------------------------------
    def sample(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]],
               greedy: bool = False, stop_sequences: list[list[int]] | None = None,
               max_new_tokens: int | None = None) -> GenerationOutput:
        """One completion per prompt from the engines' weights (pushed first outside `at_version`)."""
        if stop_sequences:
            raise ValueError("generator=vllm_server does not play multi-turn episodes (stop sequences); "
                             "use generator=vllm or generator=hf with an env")
        with self.lock:
            return self._sample(model, tokenizer, prompts, greedy, max_new_tokens, None)

    def sample_held(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]],
                    rng: torch.Generator) -> GenerationOutput:
        """One completion per prompt from the weights the engines hold now, named with their version (the
        asynchronous rounds' thread, which has loaded the version it needs: `load_staged`)."""
        with self.lock:
            self._within = True
            try:
                return self._sample(model, tokenizer, prompts, False, None, rng)
            finally:
                self._within = False

    def _sample(self, model, tokenizer, prompts, greedy, max_new_tokens, rng) -> GenerationOutput:
        """The requests; each one's seed from `rng` (the asynchronous thread's, seeded per round), else torch's."""
        if not self._within or self.fleet is None:
            self.push(model, tokenizer, None)
        start = time.perf_counter()
        limit = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        stops = stop_ids(model, tokenizer)
        seeds = torch.randint(0, 2**31 - 1, (len(prompts),), generator=rng).tolist()  # seeded: a run repeats
        fleet, n = self.fleet, len(self.fleet.urls)

        def one(i: int) -> tuple[list[int], list[float]]:
            body = {"model": fleet.names[i % n], "prompt": list(prompts[i]), "max_tokens": limit,
                    "temperature": 0.0 if greedy else self.temperature, "top_p": 1.0 if greedy else self.top_p,
                    "top_k": 0 if greedy else self.top_k, "seed": seeds[i], "n": 1, "return_token_ids": True,
                    "logprobs": None if greedy else 0, "ignore_eos": self.ignore_eos,
                    "stop_token_ids": [] if self.ignore_eos else stops, "skip_special_tokens": False,
                    "include_stop_str_in_output": True}
            choice = fleet.call(i % n, "/v1/completions", body, f"generating (version {self.held})")["choices"][0]
            ids = list(choice["token_ids"])
            lps = [0.0] * len(ids) if greedy else [float(x) for x in choice["logprobs"]["token_logprobs"]]
            if not self.ignore_eos:  # vLLM stops at stop ids already: a guard, with the HF loop's rule
                ids = cut_at_stop(ids, stops)
            return ids, lps[: len(ids)]

        workers = max(1, min(len(prompts), self.batch_size * n))
        with ThreadPoolExecutor(workers, thread_name_prefix="vllm-request") as pool:
            results = list(pool.map(one, range(len(prompts))))
        return GenerationOutput([r[0] for r in results], [r[1] for r in results], time.perf_counter() - start,
                                policy_version=self.held if self._within else None)


def _plain_list(node) -> list:
    """A Hydra ListConfig (or list, or None) as a plain list."""
    from omegaconf import ListConfig, OmegaConf

    return OmegaConf.to_container(node, resolve=True) if isinstance(node, ListConfig) else list(node or [])
