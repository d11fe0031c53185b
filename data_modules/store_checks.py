"""What a store file must hold before its records are trusted (data_modules/store.py reads through here).

A harvested store is input from outside the run: another run wrote it, or someone edited it since. A file
that would otherwise end deep inside a stage (`IndexError: index out of range in self` at the embedding,
`Total of weights must be finite` in the buffer's sampling, a shape error when log-probs are collated) is
refused when it is read, in one line naming the file and the row (0-based, as `provenance.origin` names
rows: "<file>:<row>"). Checked, each generically from the dataclass fields, as the store's columns are:

    the file itself     a regular file, looked at before it is opened: a FIFO would block the read, a
                        device never end; a symbolic link is not a file the store wrote (refused, with
                        its target named)
    columns             the record's and provenance's fields without defaults are present
    token ids           `list[int]` fields (prompt_ids, completion_ids): present, integers in
                        [0, vocab_size) when the model's vocabulary size is known
    per-token values    `list[float] | None` fields (behaviour_logprobs, ref_logprobs, values, ...): one
                        per completion token, each finite; `list[int] | None` (loss_mask): one per
                        completion token, each 0 or 1
    scalars             `float` fields (reward, advantage): present and finite; `int` (group_id): present
    JSON columns        parse; a `dict[str, float | None]` field's (rewards) numbers finite

Vectorised over the Arrow columns (pyarrow.compute): a check costs a pass over the file's numbers, not a
Python loop per token.
"""
from __future__ import annotations

import dataclasses
import math
import os
import stat
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from data_modules.experience import ExperienceRecord, Provenance
from tasks.jsonl import parse_json


class StoreDataError(ValueError):
    """A store file (or one of its rows) is unusable; the message names the file and row."""


class StoreMissing(StoreDataError, FileNotFoundError):
    """No store files where a store was named."""


PROV_PREFIX = "prov_"  # as data_modules/store.py flattens Provenance


def _kinds() -> dict[str, list[str]]:
    """Column names by what they must hold, from the ExperienceRecord fields' annotations."""
    kinds: dict[str, list[str]] = {"ids": [], "per_token": [], "mask": [], "float": [], "int": [], "scores": []}
    by_type = {"list[int]": "ids", "list[float] | None": "per_token", "list[int] | None": "mask", "float": "float",
               "int": "int", "dict[str, float | None]": "scores"}
    for f in dataclasses.fields(ExperienceRecord):
        kind = by_type.get(str(f.type))
        if kind:
            kinds[kind].append(f.name)
    return kinds


def _required() -> list[str]:
    """Columns a record cannot be built without: fields with no default."""
    def needed(cls, prefix=""):
        return [prefix + f.name for f in dataclasses.fields(cls) if f.name != "provenance"
                and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    return needed(ExperienceRecord) + needed(Provenance, PROV_PREFIX)


KINDS, REQUIRED = _kinds(), _required()


# ---------------------------------------------------------------- the file
def check_round_file(path: Path) -> None:
    """Refuse anything but a regular file, before it is opened (os.lstat: a link is not followed)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as e:
        raise StoreDataError(f"{path}: cannot be read ({e.strerror})") from None
    if stat.S_ISLNK(mode):
        raise StoreDataError(f"{path}: a symbolic link (to {os.readlink(path)}), not a round file the store wrote: "
                             "copy the file into the store if it is one")
    if not stat.S_ISREG(mode):
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "not a regular file")
        raise StoreDataError(f"{path}: {kind}, not a Parquet file: a store holds the round_*.parquet files it wrote")


# ---------------------------------------------------------------- the rows
def check_table(path: Path, table: pa.Table, json_columns: list[str], vocab_size: int | None) -> None:
    """Raise StoreDataError naming the file and the first bad row (see the module docstring).
    `vocab_size`: the model's vocabulary (None: token ids are not bounded, e.g. texts to be re-encoded)."""
    missing = [name for name in REQUIRED if name not in table.column_names]
    if missing:
        raise StoreDataError(f"{path}: no column(s) {missing}: not a complete store file")
    cols = {name: table.column(name).combine_chunks() for name in table.column_names}
    for name in KINDS["ids"]:
        _check_ids(path, name, cols[name], vocab_size)
    lengths = pc.list_value_length(cols["completion_ids"]) if "completion_ids" in cols else None
    for name in KINDS["per_token"] + KINDS["mask"]:
        if name in cols and lengths is not None:
            _check_per_token(path, name, cols[name], lengths, mask=name in KINDS["mask"])
    for name in KINDS["float"] + KINDS["int"]:
        if name in cols:
            _check_scalar(path, name, cols[name], finite=name in KINDS["float"])
    for name in json_columns:
        if name in cols:
            _check_json(path, name, cols[name], numbers=name in KINDS["scores"])


def _first(mask: pa.Array) -> int | None:
    """Index of the first true value (nulls count as false), or None."""
    i = pc.index(pc.fill_null(mask, False), True).as_py()
    return None if i < 0 else i


def _list_type(path: Path, name: str, col: pa.Array, numeric: bool = True) -> pa.DataType | None:
    """The list's value type (None: an all-null column); anything but a list of numbers is refused."""
    if pa.types.is_null(col.type):
        return None
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
        raise StoreDataError(f"{path}: column {name} holds {col.type}, not lists of numbers")
    value = col.type.value_type
    if numeric and not (pa.types.is_integer(value) or pa.types.is_floating(value) or pa.types.is_null(value)):
        raise StoreDataError(f"{path}: column {name} holds lists of {value}, not of numbers")
    return value


def _check_ids(path: Path, name: str, col: pa.Array, vocab_size: int | None) -> None:
    if not len(col):
        return
    value = _list_type(path, name, col)
    row = _first(col.is_null())
    if value is None or row is not None:
        raise StoreDataError(f"{path} row {row or 0}: {name} is missing (null)")
    flat = col.flatten()
    if not (pa.types.is_integer(value) or pa.types.is_null(value)):
        raise StoreDataError(f"{path}: column {name} holds lists of {value}, not of integer token ids")
    bad = pc.less(flat, 0)
    if vocab_size is not None:
        bad = pc.or_(bad, pc.greater_equal(flat, vocab_size))
    i = _first(pc.or_(bad, flat.is_null()))
    if i is not None:
        row = pc.list_parent_indices(col)[i].as_py()
        bound = f"the model's vocabulary of {vocab_size:,} ids (0..{vocab_size - 1:,})" if vocab_size else "0 and up"
        raise StoreDataError(f"{path} row {row}: {name} holds token id {flat[i].as_py()}, outside {bound}: "
                             "the file was not written with this model's tokenizer, or was altered since")


def _check_per_token(path: Path, name: str, col: pa.Array, lengths: pa.Array, mask: bool) -> None:
    if _list_type(path, name, col) is None:
        return
    n = pc.list_value_length(col)
    row = _first(pc.not_equal(n, lengths))  # null (no values): nothing to align
    if row is not None:
        raise StoreDataError(f"{path} row {row}: {name} has {n[row].as_py()} values for {lengths[row].as_py()} "
                             "completion tokens (one per completion token)")
    flat = col.flatten()
    if not len(flat):
        return
    what = "0 or 1" if mask else "finite"
    if pa.types.is_null(flat.type):
        bad = flat.is_null()
    elif mask:
        bad = pc.invert(pc.fill_null(pc.is_in(flat, value_set=pa.array([0, 1], flat.type)), False))
    elif pa.types.is_floating(flat.type):
        bad = pc.invert(pc.fill_null(pc.is_finite(flat), False))
    else:
        bad = flat.is_null()
    i = _first(pc.or_(bad, flat.is_null()))
    if i is not None:
        parents = pc.list_parent_indices(col)
        row = parents[i].as_py()
        j = i - _first(pc.equal(parents, row))
        raise StoreDataError(f"{path} row {row}: {name}[{j}] is {flat[i].as_py()} (each must be {what})")


def _check_scalar(path: Path, name: str, col: pa.Array, finite: bool) -> None:
    numeric = pa.types.is_integer(col.type) or (finite and pa.types.is_floating(col.type))
    if not numeric and not pa.types.is_null(col.type):
        raise StoreDataError(f"{path}: column {name} holds {col.type}, not numbers")
    bad = col.is_null()
    if finite and pa.types.is_floating(col.type):
        bad = pc.or_(bad, pc.invert(pc.fill_null(pc.is_finite(col), True)))
    row = _first(bad)
    if row is not None:
        value = col[row].as_py()
        raise StoreDataError(f"{path} row {row}: {name} is {'missing (null)' if value is None else value} "
                             f"(must be a {'finite number' if finite else 'whole number'})")


def _check_json(path: Path, name: str, col: pa.Array, numbers: bool) -> None:
    for row, text in enumerate(col.to_pylist()):
        if text is None:
            continue
        problem, value = parse_json(text)
        if problem:
            raise StoreDataError(f"{path} row {row}: {name} is {problem}")
        if numbers and isinstance(value, dict):
            for key, v in value.items():
                if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)):
                    raise StoreDataError(f"{path} row {row}: {name}[{key!r}] is {v!r} (must be a finite number "
                                         "or null)")
