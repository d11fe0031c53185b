"""The `generator` group (conf/generator): generator=hf, vllm and vllm_server are closed."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from run.validation.schemas.model import Seed
from run.validation.schemas.base import (Bool, Mapping, Node, OpenNode, OptionalPath, PositiveInt, PositiveNumber,
                                         Text, choice, must, optional)

TopP = must(Annotated[float, Field(gt=0, le=1)], "in (0, 1]")
TopK = must(Annotated[int, Field(ge=0)], "an integer ≥ 0 (0: off)")


class HF(Node):
    """generators.hf.HFGenerator: transformers generate() with behaviour log-probs."""
    max_new_tokens: PositiveInt = None
    temperature: PositiveNumber = None
    top_p: TopP = None
    top_k: TopK = None
    batch_size: PositiveInt = None
    ignore_eos: Bool = None


class VLLM(HF):
    """generators.vllm.VLLMGenerator: a colocated vLLM engine."""
    dtype: choice("policy", "float32", "bfloat16", "float16", "auto") = None
    max_model_len: optional(PositiveInt, "(the model config's max_position_embeddings)") = None
    enforce_eager: Bool = None
    seed: Seed = None
    gpu_memory_utilization: must(Annotated[float, Field(gt=0, le=1)], "in (0, 1]") = None
    kv_cache_memory_bytes: optional(PositiveInt, "(from gpu_memory_utilization)") = None
    tensor_parallel_size: PositiveInt = None
    engine_kwargs: Mapping = None


Port = must(Annotated[int, Field(ge=1, le=65535)], "a port number in [1, 65535]")
Strings = must(list[str | int], "a list of strings ([] for none)")


class VLLMServer(HF):
    """generators.vllm_server.VLLMServerGenerator: vLLM servers in their own processes (started or given)."""
    engines: must(Annotated[int, Field(ge=0)], "an integer ≥ 0 (0: connect to generator.urls)") = None
    urls: must(list[str], "a list of base URLs ([http://host:8000, ...]; [] to start engines)") = None
    host: Text = None
    port: Port = None
    gpus: Strings = None
    cpu_cores: Strings = None
    python: OptionalPath = None
    dtype: choice("policy", "float32", "bfloat16", "float16", "auto") = None
    max_model_len: optional(PositiveInt, "(the model config's max_position_embeddings)") = None
    enforce_eager: Bool = None
    seed: Seed = None
    gpu_memory_utilization: must(Annotated[float, Field(gt=0, le=1)], "in (0, 1]") = None
    kv_cache_memory_bytes: optional(PositiveInt, "(from gpu_memory_utilization)") = None
    tensor_parallel_size: PositiveInt = None
    server_args: Strings = None
    sync_every: PositiveInt = None
    weight_dir: OptionalPath = None
    timeout_s: PositiveNumber = None
    startup_timeout_s: PositiveNumber = None


class AnyGenerator(HF):
    """Another engine: the sampling keys every engine takes are checked, any other key passed on."""
    model_config = OpenNode.model_config


SCHEMAS = {"generators.hf.HFGenerator": HF, "generators.vllm.VLLMGenerator": VLLM,
           "generators.vllm_server.VLLMServerGenerator": VLLMServer}
FALLBACK = AnyGenerator
