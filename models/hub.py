"""Hugging Face Hub ids as local folders, through the Hugging Face cache.

A model key (`model.name_or_path`) or a data file key (`task.train_path`, `data.path`, ...) that names no
local file or folder but looks like a Hub id (`owner/name`; a data key may go on into the repo:
`owner/name/data/train.jsonl`) resolves to the repo's snapshot folder in the cache
(`huggingface_hub.snapshot_download`), and the project's readers read that folder like any local one.

Offline (`HF_HUB_OFFLINE=1`, train.py's default) nothing is downloaded: the id must be in the cache
already (`hf download <id>`; `hub_cli` names the command the installed
huggingface_hub ships), else the error names the key, the id, the cache folder
searched and how to fetch it. `HF_HUB_OFFLINE=0` lets the run download what the cache lacks. Both are read
when a key is resolved (not when huggingface_hub was imported), as are `HF_HUB_CACHE` and `HF_HOME`.
"""
from __future__ import annotations

import functools
import os
import re
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name
TRUE = {"1", "on", "yes", "true"}  # huggingface_hub's spelling of a true flag
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja", "*.py"]  # no .bin, onnx…
DATA_FILES = ["*.jsonl", "*.json", "*.parquet", "*.arrow", "*.md"]
HELDOUT_WORDS = ("test", "validation", "valid", "heldout", "eval", "dev")


def hub_cli(action: str) -> str:
    """The shell command for `action` (download, login, upload) with the CLI the installed huggingface_hub
    ships: `hf` since 0.34 (`hf download`, `hf auth login`, `hf upload`), `huggingface-cli` before (later
    releases dropped it), so the advice in an error runs as printed."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        major, minor = (int(x) for x in re.findall(r"\d+", version("huggingface_hub"))[:2])
    except (PackageNotFoundError, ValueError):
        major, minor = 1, 0
    if (major, minor) >= (0, 34):
        return {"login": "hf auth login"}.get(action, f"hf {action}")
    return f"huggingface-cli {action}"


def offline() -> bool:
    """HF_HUB_OFFLINE as huggingface_hub reads it, from the environment now."""
    value = os.environ.get("HF_HUB_OFFLINE")
    if value is None:
        from huggingface_hub import constants
        return bool(constants.HF_HUB_OFFLINE)
    return value.strip().lower() in TRUE


def cache_dir() -> Path:
    """The Hub cache folder: HF_HUB_CACHE, else HF_HOME/hub, else huggingface_hub's default."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def is_hub_id(text: str) -> bool:
    """`owner/name` that is no local path."""
    return bool(HUB_ID.match(str(text))) and not Path(text).exists()


def model_folder(name_or_path: str | Path, key: str, error: type[Exception]) -> Path:
    """The local folder of `name_or_path`: itself, or a Hub id's snapshot in the cache (downloaded first
    when online: config, tokenizer and safetensors weights; .bin weights only when there are no others)."""
    if not is_hub_id(str(name_or_path)):
        return Path(name_or_path)
    what = f"{key}={str(name_or_path)!r}"
    folder = snapshot(str(name_or_path), "model", what, error, MODEL_FILES)
    if not offline() and not any(folder.glob("*.safetensors")):
        folder = snapshot(str(name_or_path), "model", what, error, ["*.bin"])
    return folder


def dataset_files(path: str, key: str, error: type[Exception], suffixes: tuple[str, ...],
                  heldout: bool = False, split: str = "train") -> list[Path] | None:
    """The data files a Hub dataset id names, or None when `path` is a local path (or not an id).

    `owner/name/rel/path`: that file, or the files under that folder; `owner/name`: the files of the
    snapshot. Of several files with a suffix in `suffixes`, those whose path names the split (`split`, or
    for a held-out key test/validation/eval/…) are taken, all of them (shards, in name order)."""
    parts = str(path).split("/")
    if Path(path).exists() or len(parts) < 2 or not HUB_ID.match("/".join(parts[:2])):
        return None
    if len(parts) == 2 and Path(parts[1]).suffix in suffixes:  # data/train.jsonl: a missing local file
        return None
    repo_id, rest = "/".join(parts[:2]), "/".join(parts[2:])
    folder = snapshot(repo_id, "dataset", f"{key}={path!r}", error, [rest, f"{rest}/*"] if rest else DATA_FILES)
    target = folder / rest
    if target.is_file():
        return [target]
    if not target.is_dir():
        raise error(f"{key}={path!r}: the dataset {repo_id!r} has no {rest!r} (its snapshot: {folder})")
    if (target / "dataset_dict.json").is_file() or (target / "state.json").is_file():
        return [target]  # a datasets.save_to_disk folder: read as a whole
    return _pick(target, f"{key}={path!r}", error, suffixes, HELDOUT_WORDS if heldout else (split,))


def _pick(folder: Path, what: str, error: type[Exception], suffixes: tuple[str, ...],
          words: tuple[str, ...]) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.suffix in suffixes and p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    if len(files) <= 1:
        if not files:
            raise error(f"{what}: no {'/'.join(suffixes)} file in {folder}")
        return files
    named = [p for p in files if any(w in p.relative_to(folder).as_posix().lower() for w in words)]
    if not named:
        listed = ", ".join(p.relative_to(folder).as_posix() for p in files[:6])
        raise error(f"{what}: {len(files)} data files and none names the split ({'/'.join(words)}): {listed}; "
                    f"name one after the id (owner/name/<file>)")
    return named


def snapshot(repo_id: str, kind: str, what: str, error: type[Exception], patterns: list[str]) -> Path:
    """The repo's snapshot folder in the cache (downloaded when online); `error` naming `what` (key=value),
    the id, the cache folder searched and how to fetch it when it is missing."""
    cache, local = cache_dir(), offline()
    try:
        return _download(repo_id, kind, cache, local, tuple(patterns))
    except Exception as e:  # noqa: BLE001 - not cached, not found, no network, gated: named below
        fetch = f"{hub_cli('download')} {repo_id}" + (" --repo-type dataset" if kind == "dataset" else "")
        folder = cache / f"{kind}s--{repo_id.replace('/', '--')}"
        if local:
            raise error(f"{what}: no such local path, and the Hugging Face cache has no {kind} "
                        f"{repo_id!r} (searched {folder}; HF_HUB_OFFLINE=1: nothing is downloaded): fetch it "
                        f"with `{fetch}`, or let the run download it with HF_HUB_OFFLINE=0") from None
        lines = str(e).strip().splitlines()
        raise error(f"{what}: no such local path, and the {kind} {repo_id!r} did not download from "
                    f"the Hugging Face Hub into {cache} ({type(e).__name__}: {lines[0] if lines else ''}): check "
                    f"the id, the network, and `{hub_cli('login')}` for a gated or private repo") from None


@functools.lru_cache(maxsize=64)
def _download(repo_id: str, kind: str, cache: Path, local: bool, patterns: tuple[str, ...]) -> Path:
    """snapshot_download once per process and settings: planning and loading resolve an id several times,
    and online each call would ask the Hub again (a failure is not remembered)."""
    from huggingface_hub import snapshot_download
    return Path(snapshot_download(repo_id, repo_type=kind, cache_dir=cache, local_files_only=local,
                                  allow_patterns=list(patterns)))
