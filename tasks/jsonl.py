"""User prompts with reference answers from JSON-lines files: one {"prompt": ..., "answer": ...} a line.
A path that is no local file but a Hub dataset id (`owner/name`, or `owner/name/<file in the repo>`) reads
the dataset's .jsonl file(s) from the Hugging Face cache (models/hub.py says which are picked)."""
from __future__ import annotations

import codecs
import errno
import json
import os
import stat
import sys
from pathlib import Path
from typing import Iterator

from hardware.console import say0
from models.hub import dataset_files
from tasks.base import Example, Task
from tasks.formats import PROMPT_COMPLETION, PROMPT_ONLY, Columns, flatten, row_format, text_or_messages

TASK_FORMATS = (PROMPT_ONLY, PROMPT_COMPLETION)


class DataFileError(ValueError):
    """A data file is missing or malformed; the message names file and line."""


def read_jsonl_objects(path: Path, error: type[Exception] = DataFileError) -> list[tuple[int, dict]]:
    """(line number, object) for every non-blank line; a bad line raises `error` naming path:line."""
    rows = []
    for lineno, line in utf8_lines(path, error):
        if not line.strip():
            continue
        problem, row = parse_json(line)
        if problem:
            raise error(f"{path}:{lineno}: {problem}")
        if not isinstance(row, dict):
            raise error(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
        rows.append((lineno, row))
    return rows


def parse_json(text: str) -> tuple[str | None, object]:
    """(None, the value) of a JSON text, or (why it cannot be read, None). Every way the parser fails is a
    reason, never a traceback: bad syntax, nesting deeper than Python's recursion limit (a RecursionError),
    an integer longer than Python converts (over 4,300 digits: a ValueError), any other error it raises."""
    try:
        return None, json.loads(text)
    except json.JSONDecodeError as e:
        return f"not valid JSON ({e.msg})", None
    except RecursionError:
        limit = sys.getrecursionlimit()
        return f"not readable JSON (nested deeper than the parser's limit of about {limit:,} levels)", None
    except ValueError as e:
        if "integer string conversion" in str(e):
            return (f"not readable JSON (an integer of more than {sys.get_int_max_str_digits():,} digits, Python's "
                    "limit: write it as a string)"), None
        return f"not readable JSON ({_first_line(e)})", None
    except Exception as e:  # noqa: BLE001 - the parser's own failure, whatever it is, names the line
        return f"not readable JSON ({type(e).__name__}: {_first_line(e)})", None


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def utf8_lines(path: Path, error: type[Exception] = DataFileError) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 file (a UTF-8 byte-order mark is dropped); UTF-16/32 text or a
    line that is not UTF-8 raises `error` naming path (and line, column and byte)."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1:
                if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) or b"\x00" in raw:
                    raise error(f"{path}: UTF-16 (or UTF-32) text, not UTF-8: save it as UTF-8 "
                                f"(e.g. iconv -f UTF-16 -t UTF-8)")
                raw = raw.removeprefix(codecs.BOM_UTF8)
            try:
                yield lineno, raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise error(f"{path}:{lineno}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}): "
                            f"save the file as UTF-8") from None


def check_regular_file(p: Path, error: type[Exception] = DataFileError) -> None:
    """A task file must be a regular file: a FIFO would block, /dev/zero would never end, a symlink loop
    never resolves; each is named for what it is, not as "file not found"."""
    try:
        mode = p.stat().st_mode
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise error(f"{p}: a symlink loop (the link points back at itself): point it at a file") from None
        if p.is_symlink():
            raise error(f"{p}: a broken symlink (its target {os.readlink(p)} does not exist)") from None
        raise error(f"{p}: file not found") from None
    if not stat.S_ISREG(mode):
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "not a regular file")
        raise error(f"{p}: {kind}, not a regular file: a task file must be a .jsonl file")


def read_examples(path: str, prompt_key: str = "prompt", answer_key: str = "answer") -> list[Example]:
    """The file's examples; each one's meta keeps the file's real path as `source_file` (a sandbox running
    code against it checks that the file is out of the code's reach) and `file:line` as `origin`. Rows are
    prompt-only, prompt-completion (the completion is the reference answer and the SFT demonstration) or
    {prompt, answer}, standard or conversational (tasks/formats.py)."""
    p = Path(path)
    check_regular_file(p)
    examples, source, columns = [], str(p.resolve()), Columns(prompt=prompt_key)
    for lineno, row in read_jsonl_objects(p):
        where = {"origin": f"{p.name}:{lineno}", "source_file": source}
        examples.append(row_example(f"{path}:{lineno}", row, columns, answer_key, where))
    if not examples:
        raise DataFileError(f"{path}: no examples")
    return examples


def row_example(loc: str, row: dict, columns: Columns, answer_key: str, where: dict) -> Example:
    """One task row as an Example: the prompt (text, or messages kept in `messages` with their text in
    `prompt`), the answer (answer_key's string, else the completion's text, else "" for a prompt-only row)."""
    fmt = row_format(loc, row, TASK_FORMATS, "task=jsonl", DataFileError, columns)
    prompt = text_or_messages(loc, columns.prompt, row, DataFileError)
    completion = text_or_messages(loc, columns.completion, row, DataFileError) if fmt.name == PROMPT_COMPLETION else None
    if answer_key in row:  # the project's own {prompt, answer} rows (with a completion: the demonstration)
        if not isinstance(row[answer_key], str) or not row[answer_key].strip():
            raise DataFileError(f"{loc}: missing or empty string field {answer_key!r}")
        answer = row[answer_key]
    else:
        answer = flatten(completion) if completion is not None else ""
    meta = {k: v for k, v in row.items() if k not in (columns.prompt, answer_key, columns.completion)}
    if completion is not None and answer_key in row:
        meta["demonstration"] = flatten(completion)
    return Example(flatten(prompt), answer, meta | where, messages=prompt if isinstance(prompt, list) else None,
                   completion_messages=completion if isinstance(completion, list) else None)


def jsonl_task(train_path: str, heldout_path: str | None, chat: bool, num_heldout: int,
               prompt_key: str, answer_key: str) -> Task:
    """Train on `train_path`; evaluate on `heldout_path`, or on the last `num_heldout` train lines."""
    train = read_split(train_path, "task.train_path", prompt_key, answer_key)
    if heldout_path:
        heldout = read_split(heldout_path, "task.heldout_path", prompt_key, answer_key)
    else:
        if num_heldout >= len(train):
            raise DataFileError(f"{train_path}: task.num_heldout={num_heldout} but only {len(train)} lines")
        train, heldout = train[: len(train) - num_heldout], train[len(train) - num_heldout :]
    conversational = next((ex for ex in train + heldout if ex.messages is not None), None)
    if conversational is None:
        return Task(name=Path(train_path).stem, train=train, heldout=heldout, chat=chat)
    line = conversational.meta["origin"].rsplit(":", 1)[1]
    return Task(name=Path(train_path).stem, train=train, heldout=heldout, chat=True,
                chat_why=f"{conversational.meta['source_file']}:{line} is a conversational row")


def read_split(path: str, key: str, prompt_key: str, answer_key: str) -> list[Example]:
    """read_examples of a local file, or of the .jsonl file(s) a Hub dataset id names (all the shards of
    the split, in name order: the train split for task.train_path, test/validation/… for a held-out key)."""
    files = dataset_files(path, key, DataFileError, (".jsonl",), heldout=key != "task.train_path")
    if files is None:
        return read_examples(path, prompt_key, answer_key)
    say0(f"{key}={path}: {', '.join(str(f) for f in files)} (Hugging Face cache)")
    return [ex for f in files for ex in read_examples(str(f), prompt_key, answer_key)]
