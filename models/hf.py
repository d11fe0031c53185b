"""Any Hugging Face causal LM and its tokenizer from a local folder or a Hub id through the Hugging Face
cache (models/hub.py: offline by default, nothing downloaded): a model folder, or a LoRA run's adapter
folder on its base (models/adapters.py)."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from models import compiled
from models.adapters import apply_chain, check_mode, continue_adapter
from models.hf_checks import (ModelFolderError, ModelFolderMissing, adapter_chain, check_folder, check_vocab,
                              is_adapter_folder, load_tokenizer, tokenizer_folder)
from models.hub import model_folder
from models.lora import apply_lora
from models.packing import enable as packing_enable


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def finish_model(model: PreTrainedModel, dtype: str, activation_checkpointing: bool,
                 lora: dict | None, packing: bool = False, compile: bool = False) -> PreTrainedModel:
    """The policy as configured: weights in `dtype`, activation (gradient) checkpointing of the decoder
    layers (recomputed in backward: less memory, ~30% more compute), an optional LoRA adapter, the
    padding-free training forward (`packing`: models/packing.py; a peft wrapper reads it through), and with
    `compile` the training forward through torch.compile (models/compiled.py)."""
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype={dtype!r}: choose one of {sorted(DTYPES)}")
    model = model.to(DTYPES[dtype])
    if activation_checkpointing:
        if not model.supports_gradient_checkpointing:
            raise ValueError(f"model.activation_checkpointing=true: {type(model).__name__} does not support it")
        if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.2x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    packing_enable(model, packing)
    model = apply_lora(model, lora)
    if compile:
        compiled.enable(model)
    return model


def load_hf(
    name_or_path: str, dtype: str, trust_remote_code: bool, activation_checkpointing: bool,
    lora: dict | None = None, adapter: str = "continue", packing: bool = False, compile: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM + tokenizer from a local directory or a Hub id's snapshot in the cache (downloaded
    first only with HF_HUB_OFFLINE=0: models/hub.py): a full model folder, or a LoRA run's adapter
    folder (its `policy/`) on its local base model, continued or merged as `adapter` says
    (models/adapters.py; a judge or reward model node without the key: continue).

    A missing pad token gets a dedicated new `<pad>` token (the embedding is resized) instead of
    reusing eos, so that padding never masks the real end of a sequence. Prompts are left-padded for
    batched generation. `dtype`, `activation_checkpointing`, `lora`, `packing`, `compile`: see `finish_model`.
    """
    path = model_folder(name_or_path, "model.name_or_path", ModelFolderMissing)
    config = check_folder(path)  # names the folder and what is missing, truncated or mismatched
    check_mode(adapter, lora if is_adapter_folder(path) else None)
    chain = adapter_chain(path)  # [path] for a full model folder
    tokenizer = load_tokenizer(tokenizer_folder(chain))
    check_vocab(path, tokenizer, config.get("vocab_size"))
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype={dtype!r}: choose one of {sorted(DTYPES)}")
    model = _load_weights(chain[-1], DTYPES[dtype], trust_remote_code)
    if len(chain) > 1 and len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))  # the adapter was trained with an added <pad>
    model = apply_chain(model, chain, adapter)
    check_vocab(path, tokenizer, model.get_input_embeddings().num_embeddings)
    _set_padding(model, tokenizer)
    if len(chain) > 1 and adapter == "continue":
        return continue_adapter(finish_model(model, dtype, activation_checkpointing, None, packing, compile), path), tokenizer
    return finish_model(model, dtype, activation_checkpointing, lora, packing, compile), tokenizer


def _set_padding(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """A distinct pad token (added, embedding resized, if the tokenizer has none); left padding."""
    if tokenizer.pad_token is None:
        tokenizer.add_special_tokens({"pad_token": "<pad>"})
        model.resize_token_embeddings(len(tokenizer))
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "left"


def skeleton(name_or_path: str, trust_remote_code: bool) -> PreTrainedModel:
    """The model a folder's config.json describes, on the meta device: its modules and shapes, no
    weights read or allocated (for checks of settings that depend on the architecture, like LoRA). An
    adapter folder: its base model's."""
    from transformers import AutoConfig
    name_or_path = str(adapter_chain(name_or_path)[-1])
    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code, local_files_only=True)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def _load_weights(path: Path, dtype: torch.dtype, trust_remote_code: bool) -> PreTrainedModel:
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True,
                                                    trust_remote_code=trust_remote_code)
    except (MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - a broken folder fails in many ways; name it and why
        lines = str(e).strip().splitlines()
        raise ModelFolderError(f"{path}: the weights do not load ({type(e).__name__}: "
                               f"{lines[0] if lines else 'no message'})") from e
