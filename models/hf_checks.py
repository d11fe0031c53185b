"""Cheap checks of a Hugging Face model folder (local, or a Hub id's snapshot in the cache: models/hub.py),
run when the run is planned (before any model is built) and again by `load_hf`: every message names the
folder and what is missing or mismatched.

Checked without loading weights: the folder exists; config.json is there and parses; weights are there
(model.safetensors, a sharded index and its shards, or pytorch_model.bin) and each safetensors file is
as long as its header says (a truncated copy is caught here, not mid-load); tokenizer files are there;
the tokenizer loads, and has no more tokens than the embedding (config.json's vocab_size) has rows.
A peft adapter folder (a LoRA run's `policy/`) passes when its base model folder does (models/adapters.py).
"""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

from models.hub import is_hub_id, model_folder

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model")
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
MAX_CHAIN = 16  # adapter folders whose bases are adapter folders
MAX_HEADER = 100 * 2**20  # safetensors headers are JSON of a few KB to a few MB


class ModelFolderError(ValueError):
    """A model folder is missing, incomplete or inconsistent; the message names the folder."""


class ModelFolderMissing(ModelFolderError, FileNotFoundError):
    """No such folder."""


def check_folder(path: str | Path, key: str = "model.name_or_path") -> dict:
    """Raise ModelFolderError unless `path` (a folder, or a Hub id in the cache) looks like a complete model
    folder; returns its config.json."""
    p = model_folder(path, key, ModelFolderMissing)
    if not p.is_dir():
        raise ModelFolderMissing(f"{key}={str(path)!r}: no such local directory (nor a Hub id: owner/name)")
    if is_adapter_folder(p):
        return _check_adapter(p, key)
    config = read_config(p)
    for file in weight_files(p):
        check_weights_file(file)
    if not any((p / name).is_file() for name in TOKENIZER_FILES):
        raise ModelFolderError(f"{p}: no tokenizer files (tokenizer.json, tokenizer.model or vocab.json + "
                               f"merges.txt; the folder has {_listing(p)}): save the tokenizer there too "
                               f"(tokenizer.save_pretrained)")
    return config


def is_adapter_folder(p: str | Path) -> bool:
    """A peft adapter folder (a LoRA run's `policy/`): adapter_config.json and no full model's config.json."""
    p = Path(p)
    return (p / "adapter_config.json").is_file() and not (p / "config.json").is_file()


def adapter_base(p: str | Path, key: str = "model.name_or_path") -> Path:
    """The base model folder an adapter folder names (`base_model_name_or_path`: a folder, or a Hub id in the
    cache); ModelFolderError naming `key`, the adapter folder and the base when it is neither."""
    p = Path(p)
    try:
        base = json.loads((p / "adapter_config.json").read_text()).get("base_model_name_or_path")
    except (ValueError, AttributeError):
        raise ModelFolderError(f"{p}/adapter_config.json: not valid JSON") from None
    if base and is_hub_id(base):
        return model_folder(base, f"{p}/adapter_config.json base_model_name_or_path", ModelFolderMissing)
    if not base or not Path(base).is_dir():
        raise ModelFolderError(f"{key}={str(p)!r}: a LoRA adapter whose base model is not a local folder "
                               f"({p}/adapter_config.json base_model_name_or_path={base!r}, nor a Hub "
                               f"id): copy the base model to that path, or point {key} at a merged "
                               f"model (model.lora.save_merged=true writes policy_merged/) or at the base model")
    return Path(base)


def adapter_chain(p: str | Path, key: str = "model.name_or_path") -> list[Path]:
    """[p, its base, its base's base, …] down to the first folder that is not an adapter folder (the
    last; [p] for a full model folder). A base may itself be an adapter folder: a run started from one
    with model.adapter=merge and a fresh model.lora saves its adapter with that folder as its base."""
    chain = [model_folder(p, key, ModelFolderMissing)]
    while is_adapter_folder(chain[-1]):
        if len(chain) > MAX_CHAIN:
            raise ModelFolderError(f"{key}={str(p)!r}: more than {MAX_CHAIN} adapter folders chained by "
                                   f"base_model_name_or_path (a cycle?)")
        chain.append(adapter_base(chain[-1], key if len(chain) == 1 else
                                  f"{chain[-2]}/adapter_config.json base_model_name_or_path"))
    return chain


def _check_adapter(p: Path, key: str) -> dict:
    """A peft LoRA folder (adapter_config.json, adapter weights): models/adapters.py loads the base model
    named by `base_model_name_or_path`, which must be a complete local folder (or another adapter folder);
    returns the base's config.json (without vocab_size)."""
    chain = adapter_chain(p, key)
    for adapter in chain[:-1]:
        if (adapter / "adapter_model.safetensors").is_file():
            check_weights_file(adapter / "adapter_model.safetensors")
    config = dict(check_folder(chain[-1], f"{chain[-2]}/adapter_config.json base_model_name_or_path"))
    config.pop("vocab_size", None)  # the adapter may carry resized embeddings: checked once loaded
    return config


def read_config(p: Path) -> dict:
    file = p / "config.json"
    if not file.is_file():
        raise ModelFolderError(f"{p}: no config.json (the folder has {_listing(p)}): not a saved Hugging "
                               f"Face model (model.save_pretrained writes config.json and the weights)")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFolderError(f"{file}: not valid JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(config, dict):
        raise ModelFolderError(f"{file}: expected a JSON object")
    return config


def weight_files(p: Path) -> list[Path]:
    """The weight files the folder's model loads from; ModelFolderError when there are none."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = p / index_name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (ValueError, KeyError, TypeError, AttributeError):
                raise ModelFolderError(f"{index}: not a weight index (JSON with a 'weight_map')") from None
            missing = [s for s in shards if not (p / s).is_file()]
            if missing:
                raise ModelFolderError(f"{p}: {index_name} names {len(missing)} missing shard(s): "
                                       f"{', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}")
            return [p / s for s in shards]
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (p / name).is_file():
            return [p / name]
    raise ModelFolderError(f"{p}: no weights (model.safetensors, model.safetensors.index.json or "
                           f"pytorch_model.bin; the folder has {_listing(p)})")


def check_weights_file(file: Path) -> None:
    """A safetensors file must hold every byte its header points at; a zip .bin must have its directory."""
    size = file.stat().st_size
    if file.suffix == ".bin":
        with file.open("rb") as f:
            zipped = f.read(2) == b"PK"
        if zipped and not zipfile.is_zipfile(file):
            raise ModelFolderError(f"{file}: truncated PyTorch checkpoint ({size:,} bytes, its zip directory "
                                   f"is missing): copy or save the model again")
        return
    if file.suffix != ".safetensors":
        return
    with file.open("rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        header = f.read(n) if 0 < n <= min(MAX_HEADER, size - 8) else b""
    try:
        tensors = json.loads(header)
        end = max((t["data_offsets"][1] for k, t in tensors.items() if k != "__metadata__"), default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise ModelFolderError(f"{file}: not a readable safetensors file ({size:,} bytes, no valid header): "
                               f"truncated or corrupt; copy or save the model again") from None
    if 8 + n + end > size:
        raise ModelFolderError(f"{file}: truncated ({size:,} bytes, its header needs {8 + n + end:,}): copy "
                               f"or save the model again")


def context_length(config: dict) -> int | None:
    """The model's context (positions) from its config.json, or None when it states none."""
    for key in CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def tokenizer_folder(chain: list[Path]) -> Path:
    """The first folder of an `adapter_chain` that holds tokenizer files (a LoRA run saves its tokenizer
    beside the adapter), else its base model folder."""
    return next((p for p in chain if any((p / name).is_file() for name in TOKENIZER_FILES)), chain[-1])


def load_tokenizer(p: str | Path):
    """AutoTokenizer from the folder, or ModelFolderError naming it and why it did not load."""
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(p, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds for a broken folder
        raise ModelFolderError(f"{p}: the tokenizer does not load ({type(e).__name__}: "
                               f"{_first_line(e)})") from e


def check_vocab(p: str | Path, tokenizer, rows: int | None) -> None:
    """Every token id must index a row of the embedding (`rows`: config.json's vocab_size, or the
    loaded model's embedding size)."""
    if isinstance(rows, int) and len(tokenizer) > rows:
        raise ModelFolderError(f"{p}: the tokenizer has {len(tokenizer):,} tokens but the model's embedding "
                               f"has {rows:,} rows (config.json vocab_size): ids ≥ {rows:,} index past it; "
                               f"use the tokenizer saved with these weights")


def _listing(p: Path, most: int = 6) -> str:
    names = sorted(x.name for x in p.iterdir())
    if not names:
        return "nothing"
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else "no message"
