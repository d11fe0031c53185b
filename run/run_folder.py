"""One owner per run folder (and per sweep folder), and no trace of a run that never took a step.

- `FolderLock`: an exclusive `fcntl.flock` on `<folder>/.owner.lock`, held for the life of the process
  that runs in the folder (a new run, a resume, the launcher of a multi-rank job, a `-m` sweep). A second
  process is refused in one line naming the live owner's pid; the kernel drops the lock when the owner
  dies, however it dies, so a killed run's folder is never locked for good. The lock file holds the
  owner's pid and is removed when the owner releases it (a waiter that opened the removed file notices
  the swap and locks the new one). The ranks of a job that train.py launched run under their
  launcher's lock (`OWNER_ENV`); ranks > 0 of a job started by torchrun or srun directly run under rank 0's.
- `RunFolder`: what the folder held when this process took it. A run that fails before its first
  optimizer step (a bad value only the model, the data or the first step reveals, a signal, a bug) has
  written no run record yet (train.py writes run.json and .hydra/ at the first step), and `undo` removes
  every file and folder this process added, and cuts Hydra's log back to its former length; nothing
  that existed before is removed. So the corrected command runs in the same folder, and `resume=true`
  never replays a value that never trained. A folder that held nothing but the log this process opened
  counts as new (removed when empty again).
"""
from __future__ import annotations

import fcntl
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from run.errors import ConfigError

LOCK_NAME = ".owner.lock"
OWNER_ENV = "POLICYSHIFT_RUN_OWNER"  # "<launcher pid>:<run folder>": the ranks that train.py launched
RECORD = "run.json"  # written at a run's first optimizer step (and appended to by each resume's)


class FolderInUse(ConfigError):
    """Another live process owns the folder."""


class FolderLock:
    def __init__(self, folder: Path, what: str = "run"):
        self.folder, self.what = Path(folder), what
        self.path = self.folder / LOCK_NAME
        self.fd: int | None = None

    def acquire(self, hint: str) -> "FolderLock":
        """Take the folder (creating it), or raise FolderInUse naming its owner; `hint`: what to do then
        (`{pid}` in it: the owner's pid)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        while self.fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _owner(fd)
                os.close(fd)
                pid = owner.split()[1] if owner.startswith("pid ") else "its pid"
                raise FolderInUse(f"{self.folder} is in use by a live {self.what} ({owner}); two processes "
                                  f"must not write one folder: " + hint.replace("{pid}", pid)) from None
            if _same_file(fd, self.path):
                self.fd = fd
            else:  # its previous owner removed the file while we waited on it: lock the current one
                os.close(fd)
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                          f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        return self

    def release(self) -> None:
        """Remove the lock file (while still holding it) and let go; idempotent."""
        if self.fd is None:
            return
        if _same_file(self.fd, self.path):
            self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None


def _owner(fd: int) -> str:
    text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    return text or "its pid not yet written"


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def owned_by_launcher(out: Path) -> bool:
    """Whether this process is a rank of a job whose launcher (train.py, run/launch.py) holds `out`."""
    pid, _, folder = os.environ.get(OWNER_ENV, "").partition(":")
    return pid.isdigit() and Path(folder) == Path(out)


class RunFolder:
    """The state of a run folder as this process found it, and `undo` back to it."""

    def __init__(self, out: Path, log_files: list[Path], process_start: float):
        self.out = Path(out)
        logs = {Path(f).resolve(): f for f in log_files}
        self.entries, self.log_sizes, ours = set(), {}, set()
        self.logs = [str(Path(f).relative_to(self.out)) for f in log_files if Path(f).parent == self.out]
        for path in _walk(self.out):
            rel = path.relative_to(self.out)
            if rel.name == LOCK_NAME and len(rel.parts) == 1:
                continue
            if path.resolve() in logs and not path.is_symlink():
                st = path.stat()
                if st.st_size == 0 and st.st_mtime >= process_start:  # Hydra opened it for this process
                    ours.add(rel)
                    continue
                self.log_sizes[rel] = st.st_size
            self.entries.add(rel)
        self.new = not self.entries  # held nothing before this process (or was absent)
        self.record = self._read(RECORD)

    def _read(self, name: str) -> bytes | None:
        try:
            return (self.out / name).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def started(self) -> bool:
        """Whether this process's run took an optimizer step (it wrote or extended the run record)."""
        return self._read(RECORD) != self.record

    def undo(self) -> list[str]:
        """Remove what this process added, deepest first; cut the logs back. The names removed."""
        removed = []
        for path in sorted(_walk(self.out), key=lambda p: len(p.parts), reverse=True):
            rel = path.relative_to(self.out)
            if rel in self.entries or (rel.name == LOCK_NAME and len(rel.parts) == 1):
                continue
            if path.is_dir() and not path.is_symlink():
                if not any(path.iterdir()):  # a folder that held something before keeps it
                    path.rmdir()
                    removed.append(str(rel))
            else:
                path.unlink(missing_ok=True)
                removed.append(str(rel))
        for rel, size in self.log_sizes.items():
            if (self.out / rel).is_file() and (self.out / rel).stat().st_size > size:
                os.truncate(self.out / rel, size)
        return removed

    def remove_if_new(self) -> None:
        """The folder itself, when it was new and holds nothing now (call after the lock is released)."""
        if self.new and self.out.is_dir() and not any(self.out.iterdir()):
            self.out.rmdir()


def _walk(root: Path) -> list[Path]:
    """Every file, link and folder under `root` (links not followed); [] for a missing folder."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        found += [base / d for d in dirnames] + [base / f for f in filenames]
    return found


@contextmanager
def owned(out: Path, log_files: list[Path], process_start: float, is_zero: bool):
    """Own run folder `out` for the block (new run, resume, or the launcher of a multi-rank job); a block
    that fails before the run's first optimizer step leaves the folder as this process found it. The
    ranks of a launched job own nothing (their launcher, or rank 0, does)."""
    if owned_by_launcher(out) or not is_zero:
        yield None
        return
    lock = FolderLock(out).acquire("choose another hydra.run.dir, or wait for that run to end (or stop it: "
                                   "kill {pid})")
    folder, failed = None, False
    try:
        folder = RunFolder(out, log_files, process_start)
        yield folder
    except BaseException as e:
        failed = not (isinstance(e, SystemExit) and e.code in (0, None))
        if failed and folder is not None and not folder.started() and set(folder.undo()) - set(folder.logs):
            print(f"[run] no optimizer step was taken: {out} is left as this attempt found it", flush=True)
        raise
    finally:
        lock.release()
        if failed and folder is not None and not folder.started():
            folder.remove_if_new()
