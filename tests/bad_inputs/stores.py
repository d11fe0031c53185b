"""Harvest stores altered after the project wrote them (issue 31, item 13): each is refused when the run is
planned, in one line naming the file and the row, before any model is built (run/validation/harvest_data.py,
data_modules/store_checks.py). Before, each ended deep in the stage that harvested it (`IndexError: index
out of range in self`, `Total of weights must be finite`, a shape error), or a FIFO blocked the read."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable

from tests.bad_inputs.case import Case
from tests.bad_inputs.setups import REPLAY

C = Case
HARVEST = REPLAY + ("data.harvest=DIR/store",)
FILE = "error: stage grpo: data.harvest=DIR/store: DIR/store/round_00000.parquet row 2: "
EXTRA = "error: stage grpo: data.harvest=DIR/store: DIR/store/round_00001.parquet: "


def store_records() -> list:
    """Two groups of two records each, as a GRPO round stores them (model=tiny's character tokenizer)."""
    from data_modules.experience import ExperienceRecord, Provenance
    from models.tokenizer import build_char_tokenizer
    from tasks.base import encode_completion, encode_prompt
    tok = build_char_tokenizer()
    records = []
    for i in range(4):
        prompt, completion = f"{i}+1=", str(i + 1)
        ids = encode_completion(tok, completion)
        records.append(ExperienceRecord(
            prompt_ids=encode_prompt(tok, prompt, chat=False), completion_ids=ids, group_id=i // 2,
            provenance=Provenance(source="policy_rollout", created_step=0, policy_version=0, generator="hf"),
            prompt_text=prompt, completion_text=completion, answer=completion,
            behaviour_logprobs=[-0.5] * len(ids), rewards={"exact": 1.0}, reward=1.0, advantage=0.5 - i % 2))
    return records


def store(edit: Callable[[dict], None] | None = None, extra: Callable[[Path], None] | None = None):
    """A setup writing DIR/store with the project's ExperienceStore, then `edit`ing row 2 of its file (read
    and written back with pyarrow, the store's metadata kept) or adding `extra` beside it."""
    def write(folder: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from data_modules.store import ExperienceStore
        from models.tokenizer import build_char_tokenizer
        path = ExperienceStore(folder / "store", build_char_tokenizer()).write_round(store_records(), 0)
        if edit:
            table = pq.read_table(path)
            rows = table.to_pylist()
            edit(rows[2])
            pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
        if extra:
            extra(folder / "store" / "round_00001.parquet")
    return write


def _set(column: str, value) -> Callable[[dict], None]:
    def edit(row: dict) -> None:
        row[column] = value(row[column]) if callable(value) else value
    return edit


CASES: list[Case] = [
    C("store-token-id", "a harvest store with a token id one past the vocabulary", HARVEST,
      FILE + "completion_ids holds token id 100, outside the model's vocabulary of 100 ids (0..99): the file was "
      "not written with this model's tokenizer, or was altered since",
      setup=store(_set("completion_ids", lambda ids: ids[:-1] + [100]))),
    C("store-short-logprobs", "a harvest store with fewer log-probs than completion tokens", HARVEST,
      FILE + "behaviour_logprobs has 1 values for 2 completion tokens (one per completion token)",
      setup=store(_set("behaviour_logprobs", lambda lp: lp[:-1]))),
    C("store-nan-logprob", "a harvest store with a NaN log-prob", HARVEST,
      FILE + "behaviour_logprobs[1] is nan (each must be finite)",
      setup=store(_set("behaviour_logprobs", lambda lp: lp[:-1] + [math.nan]))),
    C("store-nan-reward", "a harvest store with a NaN reward", HARVEST,
      FILE + "reward is nan (must be a finite number)", setup=store(_set("reward", math.nan))),
    C("store-nan-advantage", "a harvest store with a NaN advantage", HARVEST,
      FILE + "advantage is nan (must be a finite number)", setup=store(_set("advantage", math.nan))),
    C("store-fifo", "a FIFO named round_*.parquet in a harvest store", HARVEST,
      EXTRA + "a FIFO (named pipe), not a Parquet file: a store holds the round_*.parquet files it wrote",
      setup=store(extra=os.mkfifo)),
    C("store-symlink", "a symlink to /etc/passwd named round_*.parquet in a harvest store", HARVEST,
      EXTRA + "a symbolic link (to /etc/passwd), not a round file the store wrote: copy the file into the store "
      "if it is one", setup=store(extra=lambda p: os.symlink("/etc/passwd", p))),
]
