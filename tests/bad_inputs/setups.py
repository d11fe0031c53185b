"""The files the cases name (written into the case's folder, DIR) and the flags they share."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

GOOD = [json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) for i in range(30)]


def jsonl(name: str, lines: list[str] | None = None, raw: bytes | None = None, at: int = 2):
    """A setup writing DIR/<name>: GOOD with `lines` inserted at line `at` + 1, or `raw` bytes."""
    def write(folder: Path) -> None:
        data = raw if raw is not None else "".join(
            x + "\n" for x in GOOD[:at] + list(lines or []) + GOOD[at:]).encode()
        (folder / name).write_bytes(data)
    return write


PAIRS = [json.dumps({"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": str(i + 2)}) for i in range(30)]


def pairs(name: str, lines: list[str] | None = None):
    """A setup writing DIR/<name>: 30 good preference pairs with `lines` inserted at line 3."""
    def write(folder: Path) -> None:
        (folder / name).write_text("".join(x + "\n" for x in PAIRS[:2] + list(lines or []) + PAIRS[2:]))
    return write


CHATS = [json.dumps({"messages": [{"role": "user", "content": f"{i}+1?"}, {"role": "assistant", "content": str(i + 1)},
                                  {"role": "user", "content": "+1?"}, {"role": "assistant", "content": str(i + 2)}]})
         for i in range(30)]


def chats(name: str, lines: list[str]):
    """A setup writing DIR/<name>: 30 good two-turn conversations with `lines` inserted at line 3."""
    def write(folder: Path) -> None:
        (folder / name).write_text("".join(x + "\n" for x in CHATS[:2] + lines + CHATS[2:]))
    return write


def text(name: str, content: str, encoding: str):
    return jsonl(name, raw=content.encode(encoding))


def model_folder(name: str, edit: Callable[[Path], None] | None = None, tokenizer: bool = True):
    """A setup saving the tests' tiny model (and its tokenizer) into DIR/<name>, then `edit`ing it."""
    def write(folder: Path) -> None:
        from tests.helpers import tiny_model
        model, tok = tiny_model()
        model.save_pretrained(folder / name)
        if tokenizer:
            tok.save_pretrained(folder / name)
        if edit:
            edit(folder / name)
    return write


def drop(*names: str):
    return lambda p: [os.remove(p / n) for n in names]


def truncated_weights(p: Path) -> None:
    """A safetensors file cut short: its header points at 4,000 bytes of tensor data; 1,000 are there."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}}).encode()
    (p / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(1000))


def bigger_tokenizer(p: Path) -> None:
    from models.tokenizer import build_char_tokenizer
    build_char_tokenizer(vocab_size=150).save_pretrained(p)  # the model's embedding has 100 rows


def edit_config(**changes):
    def edit(p: Path) -> None:
        config = json.loads((p / "config.json").read_text())
        (p / "config.json").write_text(json.dumps(config | changes))
    return edit


def sharded_with_a_missing_shard(p: Path) -> None:
    os.rename(p / "model.safetensors", p / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (p / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def adapter_of_a_hub_model(p: Path) -> None:
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        os.remove(p / name)
    (p / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "Qwen/Qwen2.5-0.5B"}))


def adapter_on_a_local_base(folder: Path) -> None:
    """DIR/base: the tiny model; DIR/m: an adapter folder naming it as its base (no weights needed to plan)."""
    model_folder("base")(folder)
    (folder / "m").mkdir()
    (folder / "m" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(folder / "base")}))


def write_over(name: str, content: str):
    return lambda p: (p / name).write_text(content)


def no_vllm() -> str | None:
    import importlib.util
    return "vllm is installed here: the refusal cannot happen" if importlib.util.find_spec("vllm") else None


NO_GPU = (("torch.cuda.is_available", lambda: False),)
HF = ("model=hf",)
JSONL = ("task=jsonl", "task.num_heldout=5")
REPLAY = ("algorithm=grpo", "data=replay_mix")
ADAPTIVE = ("algorithm=grpo", "data=adaptive")
