"""A stage's harvest store (`data.harvest=DIR`), checked when the run is planned, before any model is built:
every round_*.parquet file is what the store wrote (a regular file, not a FIFO or a symlink), with token ids
inside the model's vocabulary, one log-prob (and value, mask, ...) per completion token, and finite rewards,
advantages and log-probs; and its tokenizer is the stage's, unless data.harvest_mismatch=retokenize
(data_modules/store_checks.py, data_modules/store.py: check_store reads the columns, builds no records). A
bad file is refused naming the key, the file and the row. The vocabulary is the model's embedding size as
its config states it (model=hf: config.json's vocab_size; model=tiny: its tokenizer's size), read with the
tokenizer alone (run/validation/data.py), no weights."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from data_modules.store import check_store
from data_modules.store_checks import StoreDataError
from run.errors import ConfigError
from run.validation.data import plan_tokenizer
from run.validation.values import raw

TINY, HF = "models.tiny.build_tiny", "models.hf.load_hf"


def check_harvest(name: str, cfg: DictConfig, tokenizers: dict) -> None:
    """Raise ConfigError naming data.harvest, the file and the row of the first unusable one."""
    harvest = raw(cfg, "data.harvest")
    if not harvest or not Path(str(harvest)).is_dir():  # no store, or a missing one (run/validation/config.py)
        return
    tokenizer = plan_tokenizer(cfg, tokenizers)[0]
    try:
        check_store(str(harvest), tokenizer, raw(cfg, "data.harvest_mismatch") or "refuse",
                    model_vocab(cfg, tokenizer, tokenizers))
    except StoreDataError as e:
        problem = f"data.harvest={harvest}: {e}"
        raise ConfigError(f"invalid data for stage {name!r}: {problem}", problems=[problem],
                          where=f"stage {name}") from None


def model_vocab(cfg: DictConfig, tokenizer, tokenizers: dict) -> int | None:
    """Rows of the stage's model's embedding, known before its weights load (None: a model node not known)."""
    target = raw(cfg, "model._target_")
    if target == TINY and tokenizer is not None:
        return len(tokenizer)  # models/tiny.py: tiny_config's vocab_size
    if target == HF:
        return tokenizers.get(("vocab", str(raw(cfg, "model.name_or_path"))))  # run/validation/data.py
    return None
