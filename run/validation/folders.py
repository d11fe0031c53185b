"""Probes of a model folder's own settings at plan time (models/hf_checks.py has checked that the folder is
complete; nothing is loaded but its config.json and tokenizer): a context length and layer sizes that a
model can have, and an eos token, without which generation never stops before generator.max_new_tokens
and a demonstration has no end to learn."""
from __future__ import annotations

import json
from pathlib import Path

from models.hf_checks import CONTEXT_KEYS

SIZE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
             "n_embd", "n_layer", "n_head")


def config_problems(config: dict, config_file: Path) -> list[str]:
    """Each size or context length in config.json that is set but not a positive integer."""
    found = []
    for key in CONTEXT_KEYS + SIZE_KEYS:
        value = config.get(key)
        if key in config and value is not None and not (type(value) is int and value > 0):
            what = "the model's context in tokens" if key in CONTEXT_KEYS else "a layer size"
            found.append(f"{config_file}: {key}={value!r} must be a positive integer ({what})")
    return found


def model_eos(chain: list[Path], config: dict):
    """The eos id(s) a model folder's generation_config.json (or config.json) states, or None: a
    generator stops at those as well as at the tokenizer's (generators/base.py)."""
    for folder in chain:
        try:
            stated = json.loads((Path(folder) / "generation_config.json").read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        if stated is not None:
            return stated
    return config.get("eos_token_id")


def eos_problem(tok, tok_name: str, folder: str | None, rollouts_only: bool, stated=None) -> str | None:
    """A tokenizer without an eos token: demonstrations and preference pairs get no end (their answers
    end with the tokenizer's eos), and with no eos stated by the model either, every rollout runs to
    generator.max_new_tokens. `rollouts_only`: the stage encodes no answers, so a stated eos will do."""
    if getattr(tok, "eos_token_id", None) is not None or (rollouts_only and stated is not None):
        return None
    where = f"{folder}/tokenizer_config.json" if folder else tok_name
    return (f"{tok_name} has no eos token ({where}: eos_token is unset): generation would never stop before "
            f"generator.max_new_tokens and demonstrations would have no end; set eos_token (the token the "
            f"model was trained to end with)")
