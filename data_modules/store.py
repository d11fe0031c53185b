"""The experience store: experience records on disk as Parquet, with provenance, for later harvesting.

A store is a directory of `round_{index:05d}.parquet` files, one per rollout round, read in index order.
One row per `ExperienceRecord`; the columns follow the dataclasses, generically (`dataclasses.fields`),
so fields added later to `ExperienceRecord` or `Provenance` are stored without code changes:

    <record field>   every ExperienceRecord field except `provenance`, under its own name:
                     prompt_ids, completion_ids: list<int64>; behaviour_logprobs, ref_logprobs (and any
                     other per-token field): list<double> or null; group_id: int64; prompt_text,
                     completion_text, answer: string; reward, advantage: double
    prov_<name>      every Provenance field, flattened: prov_source, prov_created_step,
                     prov_policy_version, prov_generator, prov_origin, prov_times_used, ...
    JSON columns     fields annotated as dicts (keys vary from row to row: `rewards`, `prov_sampling`)
                     are JSON strings (null for None); Python floats round-trip exactly through JSON.

Schema metadata: `policyshift.format_version` (FORMAT_VERSION), `policyshift.tokenizer_fingerprint`
(`tokenizer_fingerprint` of the writing run's tokenizer) and `policyshift.json_columns` (a JSON list).

Rows in memory (`record_to_row`) are plain dicts with `provenance` as a nested dict: only str, int,
float, bool, None, list and dict values, so they also survive `torch.save`/`torch.load(weights_only=True)`
(the buffer's checkpoint state uses them).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from data_modules.experience import ExperienceRecord, Provenance
from data_modules.store_checks import StoreDataError, StoreMissing, check_round_file, check_table
from tasks.base import encode_prompt

FORMAT_VERSION = "1"
PROV_PREFIX = "prov_"
KEY_VERSION = b"policyshift.format_version"
KEY_FINGERPRINT = b"policyshift.tokenizer_fingerprint"
KEY_JSON = b"policyshift.json_columns"
ROUND_FILE = re.compile(r"round_(\d+)\.parquet")
MISMATCH_MODES = ("refuse", "retokenize")
PLAIN_SCALARS, PLAIN_NUMBERS = (bool, int, float, str), (int, float)


# ---------------------------------------------------------------- rows (plain dicts)
def _plain(value: Any, where: str) -> Any:
    """A deep copy made only of str/int/float/bool/None/list/dict (numpy scalars become Python ones)."""
    kind = type(value)
    if value is None or kind in PLAIN_SCALARS:  # fast path: the common case, already plain
        return value
    if kind is list and all(type(v) in PLAIN_NUMBERS for v in value):  # token ids, log-probs
        return list(value)
    if isinstance(value, bool):
        return value
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    if isinstance(value, dict):
        return {_plain(k, where): _plain(v, where) for k, v in value.items()}
    raise TypeError(f"{where}: {type(value).__name__} is not a plain value "
                    "(str/int/float/bool/None/list/dict)")


def _fields_of(cls: type, values: dict) -> dict:
    """The keyword arguments of `cls` present in `values` (unknown keys, e.g. from newer files, dropped)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: _plain(v, f"{cls.__name__}.{k}") for k, v in values.items() if k in names}


def record_to_row(record: ExperienceRecord) -> dict:
    """Every field of the record as plain values; `provenance` becomes a nested dict of its fields."""
    row = {f.name: _plain(getattr(record, f.name), f"ExperienceRecord.{f.name}")
           for f in dataclasses.fields(record) if f.name != "provenance"}
    row["provenance"] = {f.name: _plain(getattr(record.provenance, f.name), f"Provenance.{f.name}")
                         for f in dataclasses.fields(record.provenance)}
    return row


def row_to_record(row: dict, cls: type = ExperienceRecord):
    """Inverse of `record_to_row`; missing fields take their defaults, unknown keys are ignored. `cls`:
    the record dataclass the row came from (a buffer of online DPO's pairs holds PreferenceRecords)."""
    provenance = Provenance(**_fields_of(Provenance, row["provenance"]))
    rest = {k: v for k, v in row.items() if k != "provenance"}
    return cls(provenance=provenance, **_fields_of(cls, rest))


# ---------------------------------------------------------------- Parquet columns
def _json_columns() -> list[str]:
    """Columns stored as JSON: fields annotated with a dict type (keys vary from row to row)."""
    rec = [f.name for f in dataclasses.fields(ExperienceRecord)
           if f.name != "provenance" and "dict" in str(f.type)]
    prov = [PROV_PREFIX + f.name for f in dataclasses.fields(Provenance) if "dict" in str(f.type)]
    return rec + prov


def _column_names() -> list[str]:
    rec = [f.name for f in dataclasses.fields(ExperienceRecord) if f.name != "provenance"]
    return rec + [PROV_PREFIX + f.name for f in dataclasses.fields(Provenance)]


def _flatten(row: dict, json_columns: list[str]) -> dict:
    flat = {k: v for k, v in row.items() if k != "provenance"}
    flat.update({PROV_PREFIX + k: v for k, v in row["provenance"].items()})
    for name in json_columns:
        if flat.get(name) is not None:
            flat[name] = json.dumps(flat[name])
    return flat


def _unflatten(flat: dict, json_columns: list[str]) -> dict:
    flat = {k: (json.loads(v) if k in json_columns and v is not None else v) for k, v in flat.items()}
    row = {k: v for k, v in flat.items() if not k.startswith(PROV_PREFIX)}
    row["provenance"] = {k[len(PROV_PREFIX):]: v for k, v in flat.items() if k.startswith(PROV_PREFIX)}
    return row


def records_to_table(records: list[ExperienceRecord], fingerprint: str) -> pa.Table:
    """One Arrow table (schema above), types inferred per column, with the store metadata."""
    json_columns = _json_columns()
    flat = [_flatten(record_to_row(r), json_columns) for r in records]
    table = pa.table({name: pa.array([f.get(name) for f in flat]) for name in _column_names()})
    return table.replace_schema_metadata({
        KEY_VERSION: FORMAT_VERSION.encode(), KEY_FINGERPRINT: fingerprint.encode(),
        KEY_JSON: json.dumps(json_columns).encode()})


# ---------------------------------------------------------------- tokenizer identity
def tokenizer_fingerprint(tokenizer: Any) -> str:
    """16 hex digits of sha256 over the sorted vocabulary and the special token ids: equal fingerprints
    mean the same ids denote the same tokens."""
    specials = {name: getattr(tokenizer, f"{name}_token_id", None) for name in ("bos", "eos", "pad", "unk")}
    specials["all"] = sorted(getattr(tokenizer, "all_special_ids", None) or [])
    payload = json.dumps([sorted(tokenizer.get_vocab().items()), specials])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- writing
def round_files(directory: str | Path) -> list[tuple[int, Path]]:
    """(index, path) of every `round_NNNNN.parquet` in the directory, by index."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), directory / name) for name in os.listdir(directory)
             if (m := ROUND_FILE.fullmatch(name))]
    return sorted(found)


class ExperienceStore:
    """Writes one Parquet file per round into `directory` (created if needed).

    File index = round_index + offset. The offset is fixed at this object's first write so that the file
    lands after every existing file: a second run (or a resumed one) appends rather than overwrites.

    Reuse counts: a round is written when it is made, before any of its records is served, so its
    `prov_times_used` column starts at 0. The store keeps the records of the files it wrote while any of them
    may still be served, and `sync` rewrites a file's `prov_times_used` column (that column only, atomically)
    whenever their counts changed: the data module calls it before each new round, with each checkpoint and
    at the end of the fit, so the counts read back are the optimizer batches that served each record, as of
    the last round, checkpoint or end of the run. Its `state_dict` (in the data module's checkpoint) names
    each row's record by (group id, position in its group), so a resumed run keeps the counts true."""

    def __init__(self, directory: str | Path, tokenizer: Any):
        self.directory = Path(directory)
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        self._offset: int | None = None
        self._written: set[Path] = set()
        self._rows: dict[str, list] = {}  # file name → its rows' records (None: not known after a resume)
        self._counts: dict[str, list[int]] = {}  # file name → the prov_times_used the file holds

    def path_for(self, round_index: int) -> Path:
        if self._offset is None:
            existing = round_files(self.directory)
            next_free = existing[-1][0] + 1 if existing else 0
            self._offset = max(0, next_free - round_index)
        return self.directory / f"round_{round_index + self._offset:05d}.parquet"

    def write_round(self, records: list[ExperienceRecord], round_index: int) -> Path:
        """Write the round atomically (temp file in the same directory, then `os.replace`)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path_for(round_index)
        if path.exists() and path not in self._written:
            raise FileExistsError(f"{path} was written by another run; refusing to overwrite it")
        self._replace(path, records_to_table(records, self.fingerprint))
        self._written.add(path)
        self._rows[path.name] = list(records)
        self._counts[path.name] = [r.provenance.times_used for r in records]
        return path

    def _replace(self, path: Path, table: pa.Table) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            pq.write_table(table, tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    # ---- reuse counts
    def sync(self, live: list) -> list[Path]:
        """Rewrite the `prov_times_used` column of every file whose records were served since it was last
        written; then forget the files none of whose records is in `live` (the buffer's records: no longer
        served, so their counts are final). Returns the files rewritten."""
        alive, rewritten = {id(r) for r in live}, []
        for name, rows in list(self._rows.items()):
            counts = [old if r is None else r.provenance.times_used for r, old in zip(rows, self._counts[name])]
            if counts != self._counts[name]:
                path = self.directory / name
                table = pq.read_table(path)
                column = table.schema.get_field_index(PROV_PREFIX + "times_used")
                table = table.set_column(column, PROV_PREFIX + "times_used", pa.array(counts, pa.int64()))
                self._replace(path, table.replace_schema_metadata(pq.read_schema(path).metadata))
                self._counts[name] = counts
                rewritten.append(path)
            if not any(r is not None and id(r) in alive for r in rows):
                del self._rows[name], self._counts[name]
        return rewritten

    def state_dict(self) -> dict:
        """Per file still followed: each row's (group id, position in its group) and the counts it holds."""
        keys = {}
        for name, rows in self._rows.items():
            seen: dict[int, int] = {}
            keys[name] = []
            for r in rows:
                gid = None if r is None else r.group_id
                keys[name].append(None if r is None else [gid, seen.setdefault(gid, 0)])
                if r is not None:
                    seen[gid] += 1
        return {"rows": keys, "counts": copy.deepcopy(self._counts)}

    def load_state_dict(self, state: dict, groups: dict[int, list]) -> None:
        """Follow the files of `state` again, their rows' records found in `groups` (the restored buffer's)."""
        def find(key):
            group = groups.get(key[0], []) if key is not None else []
            return group[key[1]] if key is not None and key[1] < len(group) else None
        self._rows = {name: [find(k) for k in keys] for name, keys in state.get("rows", {}).items()}
        self._counts = {name: list(state["counts"][name]) for name in self._rows}


# ---------------------------------------------------------------- reading
def _read_store_file(path: Path) -> tuple[pa.Table, str, list[str]]:
    check_round_file(path)  # a FIFO, a device or a symlink: refused before anything opens it
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise StoreDataError(f"{path} is not a readable Parquet file: {err}") from err
    meta = table.schema.metadata or {}
    if KEY_VERSION not in meta or KEY_FINGERPRINT not in meta:
        raise StoreDataError(f"{path} is not a policyshift experience store file (no store metadata)")
    version = meta[KEY_VERSION].decode()
    if version != FORMAT_VERSION:
        raise StoreDataError(f"{path} has store format version {version}; this code reads {FORMAT_VERSION}")
    try:
        json_columns = json.loads(meta.get(KEY_JSON, b"[]"))
    except (ValueError, RecursionError):
        json_columns = None
    if not isinstance(json_columns, list) or not all(isinstance(c, str) for c in json_columns):
        raise StoreDataError(f"{path}: its {KEY_JSON.decode()} metadata is not a JSON list of column names")
    return table, meta[KEY_FINGERPRINT].decode(), json_columns


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return None if f.default_factory is dataclasses.MISSING else f.default_factory()


def retokenize(record: ExperienceRecord, tokenizer: Any) -> ExperienceRecord:
    """Re-encode `prompt_text` (plain, no chat template) and `completion_text` (+ eos) with `tokenizer`.

    Every other list field (behaviour_logprobs, ref_logprobs, and any per-token field such as values)
    is reset to its default (None): it was aligned with the old ids and must be recomputed by the caller
    under the current policy. A "policy_rollout" record becomes "external_model": no policy of this run
    generated these ids."""
    completion = list(tokenizer(record.completion_text, add_special_tokens=False).input_ids)
    if tokenizer.eos_token_id is not None:
        completion.append(tokenizer.eos_token_id)
    reset = {f.name: _default(f) for f in dataclasses.fields(record)
             if f.name not in ("prompt_ids", "completion_ids") and isinstance(getattr(record, f.name), list)}
    source = "external_model" if record.provenance.source == "policy_rollout" else record.provenance.source
    return dataclasses.replace(
        record, prompt_ids=list(encode_prompt(tokenizer, record.prompt_text, chat=False)),
        completion_ids=completion, provenance=dataclasses.replace(record.provenance, source=source), **reset)


def _checked_table(path: Path, tokenizer: Any, on_mismatch: str,
                   vocab_size: int | None) -> tuple[pa.Table, list[str], bool]:
    """(table, JSON columns, whether its tokenizer is the current one) of a store file whose rows passed
    data_modules/store_checks.py (token ids against `vocab_size` only when they are kept: same tokenizer),
    after the tokenizer rule (`tokenizer` None: not checked, as when planning a model node it cannot
    probe). Raises StoreDataError naming the file (and row)."""
    table, fingerprint, json_columns = _read_store_file(path)
    current = fingerprint if tokenizer is None else tokenizer_fingerprint(tokenizer)
    check_table(path, table, json_columns, vocab_size if fingerprint == current else None)
    if fingerprint == current:
        return table, json_columns, True
    if on_mismatch == "refuse":
        raise StoreDataError(
            f"{path} was written with tokenizer {fingerprint} but the current tokenizer is {current}: "
            "its token ids mean different things here. Set data.harvest_mismatch=retokenize to re-encode "
            "the stored texts with the current tokenizer (log-probs are then dropped and recomputed).")
    masks = table.column("loss_mask").to_pylist() if "loss_mask" in table.column_names else []
    masked = [i for i, mask in enumerate(masks) if mask is not None and 0 in mask]
    if masked:
        raise StoreDataError(
            f"{path} was written with tokenizer {fingerprint} but the current tokenizer is {current}, and "
            f"{len(masked)} of its records (rows {masked[:5]}...) have a loss_mask (multi-turn episodes' "
            "observations, conversations' user turns): data.harvest_mismatch=retokenize re-encodes only the "
            "texts and cannot carry such a mask over, so the masked tokens would train. Harvest this store "
            "with the tokenizer (model) that wrote it, or leave it out.")
    return table, json_columns, False


def read_round(path: str | Path, tokenizer: Any, on_mismatch: str = "refuse",
               vocab_size: int | None = None) -> list[ExperienceRecord]:
    """One store file's records; see `load_experience`."""
    path = Path(path)
    table, json_columns, same = _checked_table(path, tokenizer, on_mismatch, vocab_size)
    records = [row_to_record(_unflatten(flat, json_columns)) for flat in table.to_pylist()]
    for i, r in enumerate(records):
        if r.provenance.origin is None:
            r.provenance.origin = f"{path.name}:{i}"
    return records if same else [retokenize(r, tokenizer) for r in records]


def load_experience(directory: str | Path, tokenizer: Any, on_mismatch: str = "refuse",
                    vocab_size: int | None = None) -> list[ExperienceRecord]:
    """Every record of every `round_*.parquet` in `directory`, in round order.

    Same tokenizer fingerprint: records come back exactly as written. Different fingerprint:
    on_mismatch="refuse" raises StoreDataError (a ValueError); "retokenize" re-encodes the texts with
    `tokenizer` and sets behaviour_logprobs/ref_logprobs to None: the caller must recompute them under the
    current policy. A file holding records with a loss mask that masks tokens (episodes, conversations) is
    refused either way: their masks cannot be re-derived from the texts. Every file is checked as
    data_modules/store_checks.py says (`vocab_size`: the model's, bounding the token ids; None: unbounded).
    Records with no `provenance.origin` get "<file name>:<row>"."""
    return [r for path in _store_files(directory, on_mismatch)
            for r in read_round(path, tokenizer, on_mismatch, vocab_size)]


def check_store(directory: str | Path, tokenizer: Any, on_mismatch: str = "refuse",
                vocab_size: int | None = None) -> int:
    """What `load_experience` refuses, refused without building the records (a run checks its harvest
    store when it is planned, before any model is built); the number of rows. `tokenizer` None: the
    tokenizer rule is not checked."""
    return sum(_checked_table(path, tokenizer, on_mismatch, vocab_size)[0].num_rows
               for path in _store_files(directory, on_mismatch))


def _store_files(directory: str | Path, on_mismatch: str) -> list[Path]:
    if on_mismatch not in MISMATCH_MODES:
        raise ValueError(f"data.harvest_mismatch={on_mismatch!r}: expected one of {MISMATCH_MODES}")
    files = round_files(directory)
    if not files:
        raise StoreMissing(f"no experience store files (round_*.parquet) in {directory}")
    return [path for _, path in files]
