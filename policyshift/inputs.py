"""What `policyshift.train` takes besides overrides, as TRL's trainers do: a model (a path, or a loaded
`PreTrainedModel` with its tokenizer) and a training dataset (a `datasets.Dataset`, a list of rows, or a path),
turned into the overrides `python train.py` would be given.

The simplest honest path: an object is written to the run folder (`<output_dir>/inputs/`), and the config
points at it, so the run, its record and a later resume read exactly what this call trained on:
    model object    → save_pretrained to inputs/model (its tokenizer too) → model=hf model.name_or_path=…
    dataset object  → one JSON line a row in inputs/train.jsonl → the data key of the stage's data source:
                      data.path (data=conversations, data=static_preferences), else task=jsonl task.train_path
A language-modeling dataset ({"text"} or {"messages"} rows, tasks/formats.py) with no data= given picks
data=conversations, the SFT source that takes it.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

from run.errors import ConfigError
from tasks.formats import LANGUAGE_MODELING, detect

FILE_SOURCES = ("data_modules.conversations.ConversationsDataModule",
                "data_modules.static_preferences.StaticPreferencesDataModule")
SAFE = re.compile(r"^[\w./-]+$")


def quoted(value: str) -> str:
    """A Hydra override value: as is when plain, else single-quoted with quotes and backslashes escaped."""
    return value if SAFE.match(value) else "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _keys(overrides: list[str]) -> set[str]:
    return {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}


def model_overrides(model, tokenizer, overrides: list[str], out: Path) -> list[str]:
    """model=hf model.name_or_path=<the folder>: `model` itself when a path, else where it was saved."""
    if model is None:
        return []
    taken = sorted(k for k in _keys(overrides) if k == "model" or k.startswith("model.name_or_path"))
    if taken:
        raise ConfigError(f"model= sets model=hf model.name_or_path; the overrides set {', '.join(taken)} too: keep one")
    if isinstance(model, (str, Path)):
        folder = str(Path(model).expanduser()) if Path(model).expanduser().exists() else str(model)  # or a Hub id
    else:
        folder = str(_save_model(model, tokenizer, out / "inputs" / "model"))
    return ["model=hf", f"model.name_or_path={quoted(folder)}"]


def _save_model(model, tokenizer, folder: Path) -> Path:
    if not hasattr(model, "save_pretrained"):
        raise ConfigError(f"model= takes a folder, a Hub id or a transformers PreTrainedModel, got {type(model).__name__}")
    if tokenizer is None:
        source = getattr(model, "name_or_path", "") or ""
        if not Path(source).is_dir():
            raise ConfigError("model= is a model object whose tokenizer cannot be found (its name_or_path is not a "
                              "folder): pass tokenizer= too")
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(source)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def dataset_file(dataset, out: Path) -> tuple[str, dict]:
    """(the dataset's file, its first row): a path as given, a Dataset or list of rows written to
    <out>/inputs/train.jsonl."""
    if isinstance(dataset, (str, Path)):
        from data_modules.preference_files import read_rows
        rows = read_rows(str(dataset), "train", "train_dataset")
        return str(dataset), rows[0][1] if rows else {}
    if type(dataset).__name__ == "DatasetDict":
        raise ConfigError(f"train_dataset= is a DatasetDict (splits {sorted(dataset)}): pass one split, "
                          f"e.g. train_dataset=ds['train']")
    try:
        rows = [dict(row) for row in dataset]
    except (TypeError, ValueError):
        raise ConfigError(f"train_dataset= takes a datasets.Dataset, a list of rows or a file path, "
                          f"got {type(dataset).__name__}") from None
    if not rows:
        raise ConfigError("train_dataset= has no rows")
    path = out / "inputs" / "train.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return str(path), rows[0]


def data_overrides(dataset, overrides: list[str], out: Path,
                   checked: Callable[[list[str]], list[str]], probe: Callable[[list[str]], object]) -> list[str]:
    """`overrides` (`checked`: the algorithm's default data added, the command line checked) + the data key
    of the stage's source set to the dataset's file; `probe` composes the config, to learn that source."""
    if dataset is None:
        return overrides
    path, first = dataset_file(dataset, out)
    chosen = "data" in _keys(overrides)
    if detect(first) == LANGUAGE_MODELING and not chosen:
        overrides = overrides + ["data=conversations"]
    overrides = checked(overrides)
    target = str(probe(overrides).data.get("_target_"))
    key = "data.path" if target in FILE_SOURCES else "task.train_path"
    tasks = [o.split("=", 1)[1] for o in overrides if o.lstrip("+~").startswith("task=")]
    if key in _keys(overrides) or key == "task.train_path" and tasks and tasks[-1] != "jsonl":
        given = f"task={tasks[-1]}" if key not in _keys(overrides) else key
        raise ConfigError(f"train_dataset= sets {key}; the overrides set {given} too: keep one")
    return overrides + (["task=jsonl"] if key == "task.train_path" and not tasks else []) + [f"{key}={quoted(path)}"]
