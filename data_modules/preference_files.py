"""Preference rows from local files: JSON lines, Parquet, or a `datasets.save_to_disk` folder; or from a Hub
dataset id (`owner/name`, `owner/name/<file or folder in the repo>`) in the Hugging Face cache, whose
.jsonl/.parquet files of the split (data.split; test/validation/… for data.heldout_path) are read, every
shard in name order, or its save_to_disk folder (models/hub.py; the files picked are printed).

Two of TRL's formats (tasks/formats.py, docs/datasets.md), told apart by their columns (the names are
configurable):
    paired    {prompt, chosen, rejected}        DPO, IPO, reward model (KTO splits each pair in two)
    unpaired  {prompt, completion, label}       KTO; label must be a JSON boolean
Each text is either plain text or chat messages ([{"role": ..., "content": ...}, ...]); chat rows go
through the tokenizer's chat template (a prompt with the generation prompt appended, a completion as
the template's continuation of it). A paired chat row may omit the prompt column when chosen and
rejected are whole conversations sharing every turn but the last (the "implicit prompt" form).

Every bad row is a `PreferenceDataError` naming the file and the row (`file:line` for JSON lines,
`file row i` (0-based) for tables), unless `skip_bad_rows` is set: then it is skipped and counted.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from data_modules.experience import Provenance
from data_modules.preferences import PreferenceRecord, UnpairedRecord
from hardware.console import say0
from models.hub import dataset_files
from tasks.base import encode_completion, encode_prompt
from tasks.formats import (PREFERENCE, UNPAIRED, as_messages, chat_ids, detect, encode_completion_after, row_format,
                           text_or_messages)
from tasks.formats import Columns as FormatColumns
from tasks.jsonl import read_jsonl_objects


class PreferenceDataError(ValueError):
    """A preference file or row is unusable; the message names the file and the row."""


def read_rows(path: str, split: str, key: str = "data.path",
              error: type[Exception] = PreferenceDataError) -> list[tuple[str, dict]]:
    """[(location, row)] from a .jsonl/.json-lines file, a .parquet file or a save_to_disk folder, or from
    those a Hub dataset id names (`key`: data.heldout_path picks the held-out split's files). A missing
    or unreadable file or line raises `error` (data_modules/conversations.py reads its files here too)."""
    files = dataset_files(path, key, error, (".jsonl", ".parquet"),
                          heldout=key == "data.heldout_path", split=split)
    if files is not None:
        say0(f"{key}={path}: {', '.join(str(f) for f in files)} (Hugging Face cache)")
        return [row for f in files for row in read_rows(str(f), split, key, error)]
    p = Path(path)
    if p.is_dir():
        return _read_saved_dataset(p, split, error)
    if not p.is_file():
        raise error(f"{path}: no such file or directory")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq
        try:
            rows = pq.read_table(p).to_pylist()
        except Exception as e:  # pyarrow raises several types for a corrupt file
            raise error(f"{path}: not a readable Parquet file ({e})") from None
        return [(f"{path} row {i}", row) for i, row in enumerate(rows)]
    return [(f"{p}:{lineno}", row) for lineno, row in read_jsonl_objects(p, error)]


def _read_saved_dataset(p: Path, split: str, error: type[Exception]) -> list[tuple[str, dict]]:
    from datasets import DatasetDict, load_from_disk
    try:
        ds = load_from_disk(str(p))
    except Exception as e:
        raise error(f"{p}: not a datasets.save_to_disk folder ({e})") from None
    if isinstance(ds, DatasetDict):
        if split not in ds:
            raise error(f"{p}: no split {split!r} (has {sorted(ds)}); set data.split")
        ds, where = ds[split], f"{p} (split {split})"
    else:
        where = str(p)
    return [(f"{where} row {i}", row) for i, row in enumerate(ds)]


@dataclass
class Columns:
    prompt: str
    chosen: str
    rejected: str
    completion: str
    label: str

    def formats(self) -> FormatColumns:
        return FormatColumns(prompt=self.prompt, completion=self.completion, chosen=self.chosen,
                             rejected=self.rejected, label=self.label)

    def form(self, row: dict) -> str | None:
        """'paired' (a preference row), 'unpaired' (an unpaired preference row) or None."""
        return {PREFERENCE: "paired", UNPAIRED: "unpaired"}.get(detect(row, self.formats()))


def parse_row(loc: str, row: dict, form: str, columns: Columns) -> tuple:
    """A row's texts (plain or chat messages), checked without a tokenizer: (prompt, chosen, rejected) of a
    paired row, (prompt, completion, label) of an unpaired one. Raises PreferenceDataError naming the row."""
    c = columns
    if c.form(row) != form:
        need = [c.prompt, c.chosen, c.rejected] if form == "paired" else [c.prompt, c.completion, c.label]
        missing = [k for k in need if k not in row and k != c.prompt]
        raise PreferenceDataError(f"{loc}: missing column(s) {missing} of the {form} form "
                                  f"(the file's first row set the form); row has {sorted(row)}")
    return _parse_unpaired(loc, row, c) if form == "unpaired" else _parse_paired(loc, row, c)


def _parse_paired(loc: str, row: dict, c: Columns) -> tuple:
    chosen, rejected = _text_or_messages(loc, c.chosen, row), _text_or_messages(loc, c.rejected, row)
    if c.prompt in row:
        prompt = _text_or_messages(loc, c.prompt, row)
    elif isinstance(chosen, list) and isinstance(rejected, list):  # implicit prompt: shared turns
        prompt, shared, chosen, rejected = chosen[:-1], rejected[:-1], chosen[-1:], rejected[-1:]
        if not prompt or prompt != shared:
            raise PreferenceDataError(f"{loc}: no {c.prompt!r} column, and {c.chosen!r} and "
                                      f"{c.rejected!r} do not share every turn but the last")
    else:
        raise PreferenceDataError(f"{loc}: missing column {c.prompt!r}; row has {sorted(row)}")
    if chosen == rejected:
        raise PreferenceDataError(f"{loc}: {c.chosen!r} and {c.rejected!r} are identical")
    return prompt, chosen, rejected


def _parse_unpaired(loc: str, row: dict, c: Columns) -> tuple:
    label = row[c.label]
    if not isinstance(label, bool):
        raise PreferenceDataError(f"{loc}: {c.label!r} must be a boolean (true/false), got {label!r}")
    if c.prompt not in row:
        raise PreferenceDataError(f"{loc}: missing column {c.prompt!r}; row has {sorted(row)}")
    return _text_or_messages(loc, c.prompt, row), _text_or_messages(loc, c.completion, row), label


class RowEncoder:
    """Turns validated rows into records; raises PreferenceDataError naming the row otherwise."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, columns: Columns, chat: bool, source: str):
        self.tokenizer, self.columns, self.chat, self.source = tokenizer, columns, chat, source

    def encode(self, loc: str, row: dict, form: str, index: int) -> PreferenceRecord | UnpairedRecord:
        parsed = parse_row(loc, row, form, self.columns)
        prov = Provenance(source=self.source, created_step=0, origin=loc)
        if form == "unpaired":
            return self._unpaired(loc, parsed, prov, index)
        return self._paired(loc, parsed, prov, index)

    def _paired(self, loc, parsed, prov, index) -> PreferenceRecord:
        prompt, chosen, rejected = parsed
        chat = self._is_chat(loc, prompt, chosen, rejected)
        prompt_ids = self._prompt_ids(prompt, chat)
        chosen_ids = self._completion_ids(loc, prompt, prompt_ids, chosen, chat)
        rejected_ids = self._completion_ids(loc, prompt, prompt_ids, rejected, chat)
        if chosen_ids == rejected_ids:
            c = self.columns
            raise PreferenceDataError(f"{loc}: {c.chosen!r} and {c.rejected!r} encode to the same tokens")
        return PreferenceRecord(prompt_ids, chosen_ids, rejected_ids, prov, group_id=index,
                                prompt_text=_show(prompt), chosen_text=_show(chosen),
                                rejected_text=_show(rejected))

    def _unpaired(self, loc, parsed, prov, index) -> UnpairedRecord:
        prompt, completion, label = parsed
        chat = self._is_chat(loc, prompt, completion)
        prompt_ids = self._prompt_ids(prompt, chat)
        ids = self._completion_ids(loc, prompt, prompt_ids, completion, chat)
        return UnpairedRecord(prompt_ids, ids, label, [], prov, group_id=index, prompt_text=_show(prompt),
                              completion_text=_show(completion))

    def _is_chat(self, loc: str, *values) -> bool:
        """Chat rows (any message list, or data.chat=true) need the tokenizer's chat template."""
        chat = self.chat or any(isinstance(v, list) for v in values)
        if chat and not getattr(self.tokenizer, "chat_template", None):
            raise PreferenceDataError(f"{loc}: chat-form row (or data.chat=true) but the tokenizer has no "
                                      f"chat template; give plain-text rows or a tokenizer with a template")
        return chat

    def _prompt_ids(self, prompt, chat: bool) -> list[int]:
        if not chat:
            return encode_prompt(self.tokenizer, prompt, chat=False)
        return chat_ids(self.tokenizer, as_messages(prompt, "user"), add_generation_prompt=True)

    def _completion_ids(self, loc, prompt, prompt_ids, completion, chat: bool) -> list[int]:
        if not chat:
            return encode_completion(self.tokenizer, completion)
        return encode_completion_after(self.tokenizer, loc, prompt, prompt_ids, completion, PreferenceDataError)


def _text_or_messages(loc: str, key: str, row: dict):
    return text_or_messages(loc, key, row, PreferenceDataError)


def _show(value) -> str:
    return value if isinstance(value, str) else "\n".join(f"{m['role']}: {m['content']}" for m in value)


def file_form(path: str, rows: list[tuple[str, dict]], columns: Columns) -> str:
    """'paired' or 'unpaired': the form the first row's columns set (every row must then have it)."""
    if not rows:
        raise PreferenceDataError(f"{path}: no rows")
    loc, first = rows[0]
    row_format(loc, first, (PREFERENCE, UNPAIRED), "data=static_preferences", PreferenceDataError, columns.formats())
    return columns.form(first)


@dataclass
class FileCheck:
    """What a preference file holds, read without a tokenizer: its form and how many rows parse."""
    form: str
    rows: int
    good: int


def check_file(path: str, columns: Columns, split: str, skip_bad_rows: bool, key: str = "data.path") -> FileCheck:
    """Read `path` and parse every row (columns present, texts and labels well-formed), as `load_records`
    will before tokenizing: a bad row raises PreferenceDataError naming it unless `skip_bad_rows`."""
    rows = read_rows(path, split, key)
    form, good = file_form(path, rows, columns), 0
    for loc, row in rows:
        try:
            parse_row(loc, row, form, columns)
            good += 1
        except PreferenceDataError:
            if not skip_bad_rows:
                raise
    return FileCheck(form, len(rows), good)


def load_records(path: str, tokenizer, columns: Columns, chat: bool, split: str, skip_bad_rows: bool,
                 stats, key: str = "data.path") -> list:
    """Read `path` (the value of `key`) and encode every row; the first row decides the form (paired or
    unpaired)."""
    rows = read_rows(path, split, key)
    form = file_form(path, rows, columns)
    encoder, records = RowEncoder(tokenizer, columns, chat, source="dataset"), []
    for index, (loc, row) in enumerate(rows):
        try:
            records.append(encoder.encode(loc, row, form, index))
        except PreferenceDataError as e:
            if not skip_bad_rows:
                raise
            stats.skip(str(e))
    stats.rows += len(rows)
    return records
