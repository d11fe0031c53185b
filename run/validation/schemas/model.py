"""The `model` group (conf/model): model=tiny and model=hf are closed (their factories take exactly
these keys); another factory's node is open, its dtype and lora checked. A LoRA adapter's common fields
are typed here; the rest, and its target modules, by building it on the model's skeleton
(run/validation/model.py)."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from models.adapters import ADAPTER_MODES
from run.validation.schemas.base import Bool, Node, OpenNode, Path, PositiveInt, PositiveNumber, choice, must

Seed = must(Annotated[int, Field(ge=0, lt=2**32)], "an integer in [0, 2**32)")
Dtype = choice("float32", "bfloat16", "float16")


class LoraFields(OpenNode):
    """model.lora: peft LoraConfig's fields (open: any other LoraConfig field is passed on; peft checks
    them when the adapter is dry-built on the model's skeleton, run/validation/model.py), and save_merged."""
    r: PositiveInt = None
    lora_alpha: PositiveNumber = None
    lora_dropout: must(Annotated[float, Field(ge=0, lt=1)], "a number in [0, 1)") = None
    target_modules: must(str | list[str], "all-linear, a regular expression, or a list of module names") = None
    save_merged: Bool = None


Lora = must(LoraFields | None, "null (no adapter) or a mapping of peft LoraConfig fields, e.g. "
            "{r: 8, lora_alpha: 16, target_modules: all-linear}")


class Tiny(Node):
    """models.tiny.build_tiny: a small Llama built in code."""
    hidden_size: PositiveInt = None
    num_layers: PositiveInt = None
    num_heads: PositiveInt = None
    intermediate_size: PositiveInt = None
    max_position_embeddings: PositiveInt = None
    seed: Seed = None
    dtype: Dtype = None
    activation_checkpointing: Bool = None
    packing: Bool = None
    compile: Bool = None
    lora: Lora = None


class HF(Node):
    """models.hf.load_hf: a local Hugging Face folder (its config.json is probed at plan time too)."""
    name_or_path: Path = None
    dtype: Dtype = None
    trust_remote_code: Bool = None
    activation_checkpointing: Bool = None
    packing: Bool = None
    compile: Bool = None
    lora: Lora = None
    adapter: choice(*ADAPTER_MODES, why="how a LoRA run's policy/ given as model.name_or_path is loaded") = None


class AnyModel(OpenNode):
    """Another factory (a user's): only the keys the project reads everywhere are checked."""
    dtype: Dtype = None
    lora: Lora = None
    activation_checkpointing: Bool = None


SCHEMAS = {"models.tiny.build_tiny": Tiny, "models.hf.load_hf": HF}
FALLBACK = AnyModel
