"""The `generator` group (conf/generator): generator=hf and generator=vllm are closed."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from run.validation.schemas.model import Seed
from run.validation.schemas.base import (Bool, Mapping, Node, OpenNode, PositiveInt, PositiveNumber, choice, must,
                                         optional)

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


class AnyGenerator(HF):
    """Another engine: the sampling keys every engine takes are checked, any other key passed on."""
    model_config = OpenNode.model_config


SCHEMAS = {"generators.hf.HFGenerator": HF, "generators.vllm.VLLMGenerator": VLLM}
FALLBACK = AnyGenerator
