"""How a bad input reaches the user: one line on stderr per problem, exit status 1, no traceback.

The project's own errors (a config value, a data file, a model folder, a sandbox that cannot start, a
non-finite loss, a reward that raised or hung on every sample until the rounds ran dry) already name the
key, file and line at fault; the traceback above them only hides that. An error that stopped a stage after
its checkpoint was written (run/checkpointing.py sets the exception's `checkpoint`) adds one line: the
checkpoint and the command that continues from it. `HYDRA_FULL_ERROR=1` brings the traceback back
(re-raised as Hydra would). Anything else (a bug) keeps Hydra's usual report.

This module imports nothing heavy at its top (the command line is checked with it before torch is
imported: run/command_line.py); the project's error classes are imported when an error is looked at.
"""
from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path
from typing import Iterable, NoReturn



class ConfigError(ValueError):
    """A bad config; `problems` lists each one (a line each on the console), `where` says which stage."""

    def __init__(self, message: str, problems: list[str] | None = None, where: str | None = None):
        super().__init__(message)
        self.problems, self.where = list(problems or []), where


def user_errors() -> tuple[type[BaseException], ...]:
    """The project's own error classes (imported here, not at the top: see the module's docstring)."""
    from callbacks.regenerate import DroppedRoundsError
    from data_modules.preference_files import PreferenceDataError
    from data_modules.store_checks import StoreDataError
    from generators.async_engine import EngineError
    from models.hf_checks import ModelFolderError
    from rewards.sandbox import SandboxUnavailable
    from run.checkpointing import CheckpointReadError, CheckpointWriteError
    from tasks.jsonl import DataFileError
    from trainers.base import NonFiniteLossError
    return (ConfigError, DataFileError, PreferenceDataError, ModelFolderError, SandboxUnavailable,
            NonFiniteLossError, CheckpointWriteError, CheckpointReadError, DroppedRoundsError, StoreDataError,
            EngineError)


def user_error(exc: BaseException) -> BaseException | None:
    """`exc`, or the project error it wraps (Hydra's InstantiationException keeps it as __cause__)."""
    seen, errors = 0, user_errors()
    while exc is not None and seen < 5:
        if isinstance(exc, errors):
            return exc
        exc, seen = exc.__cause__, seen + 1
    return None


def format_error(exc: BaseException) -> str:
    """The lines the user sees: `error: <message>`, one per problem of a ConfigError, whitespace folded."""
    problems = getattr(exc, "problems", None)
    where = getattr(exc, "where", None)
    if problems:
        prefix = f"{where}: " if where else ""
        return "\n".join(f"error: {prefix}{_fold(p)}" for p in problems)
    return f"error: {_fold(str(exc))}"


def _fold(text: str) -> str:
    return " ".join(text.split())


def full_traceback() -> bool:
    """HYDRA_FULL_ERROR=1: show the traceback, as Hydra does for its own errors."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def resume_line(exc: BaseException, run_dir: Path | str) -> str | None:
    """'[checkpoint] <file> written; ... continue with: python train.py resume=true hydra.run.dir=<run_dir>'
    when the error stopped a stage after writing its checkpoint (`checkpoint` on it or on an exception it
    wraps), else None."""
    seen = 0
    while exc is not None and seen < 5:
        checkpoint = getattr(exc, "checkpoint", None)
        if checkpoint:
            return (f"[checkpoint] {checkpoint} written; once the cause is fixed, continue with: "
                    f"python train.py resume=true hydra.run.dir={run_dir}")
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def exit_with(exc: BaseException, resume: str | None = None) -> NoReturn:
    """Print the project error in `exc` as format_error does (then `resume`, the line that continues the
    run, if any) and exit with status 1."""
    sys.stderr.write(format_error(user_error(exc) or exc) + "\n" + (f"{resume}\n" if resume else ""))
    sys.stderr.flush()
    raise SystemExit(1)


def nearest(word: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate closest to `word` (difflib's ratio ≥ cutoff), or None."""
    pool = sorted({c for c in candidates if c != word})
    match = difflib.get_close_matches(word, pool, n=1, cutoff=cutoff)
    return match[0] if match else None


def did_you_mean(key: str, leaves: Iterable[str], full_keys: Iterable[str] = ()) -> str:
    """' did you mean `a.b`?' for the dotted `key`: its leaf against `leaves` (the keys its parent node
    has) when the parent exists, else the whole key against every dotted key; '' when nothing is close."""
    parent, _, leaf = key.rpartition(".")
    leaves = list(leaves)
    if leaves:
        near = nearest(leaf, leaves)
        return f"; did you mean `{parent + '.' if parent else ''}{near}`?" if near else ""
    near = nearest(key, full_keys, cutoff=0.75)
    return f"; did you mean `{near}`?" if near else ""
