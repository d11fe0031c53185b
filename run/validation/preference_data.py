"""A stage's preference files, read at plan time, before any stage trains: a bad row in the second stage's
file (a missing column, an empty text, a label that is not a boolean, chosen = rejected), a missing file,
unpaired rows for an algorithm that needs pairs, or data.num_heldout at least the file's rows is refused
before the first stage starts, naming the key, the file and the line. The rows are parsed as the data
module parses them (data_modules/preference_files.py), without a tokenizer: what depends on the model's
tokenizer (its chat template, the token lengths) is checked when the stage starts."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from data_modules.preference_files import PreferenceDataError
from data_modules.static_preferences import planned_records
from run.errors import ConfigError
from run.validation.values import raw
from tasks.base import Task

STATIC_PREFERENCES = "data_modules.static_preferences.StaticPreferencesDataModule"
ARITHMETIC_PAIRS = "data_modules.synthetic_preferences.arithmetic_pairs"


def preference_records(name: str, cfg: DictConfig, task: Task) -> int | None:
    """The training records data=static_preferences serves per epoch in stage `name` (None: another data
    source, or pairs not known until the stage runs); raises ConfigError naming the key, file and line."""
    if raw(cfg, "data._target_") != STATIC_PREFERENCES:
        return None
    data = OmegaConf.to_container(cfg.data, resolve=True)
    try:
        return planned_records(data["path"], data["heldout_path"], data["num_heldout"], data["split"],
                               data["columns"], bool(data["unpaired"]), data["skip_bad_rows"],
                               _synthetic_pairs(data, task))
    except PreferenceDataError as e:
        key = "data.heldout_path" if data["heldout_path"] and str(e).startswith(str(data["heldout_path"])) \
            else "data.path"
        problem = f"{key}={data[key.split('.')[1]]}: {e}"
        raise ConfigError(f"invalid data for stage {name!r}: {problem}", problems=[problem],
                          where=f"stage {name}") from None


def _synthetic_pairs(data: dict, task: Task) -> int | None:
    """Synthetic arithmetic pairs: data.synthetic.num_pairs, or one per training prompt. Another generator
    (checkpoint_pairs: the pairs an older policy's samples give) is not counted before it runs."""
    synthetic = data.get("synthetic") or {}
    if data["path"] is not None or synthetic.get("_target_") != ARITHMETIC_PAIRS:
        return None
    return synthetic.get("num_pairs") or len(task.train)
