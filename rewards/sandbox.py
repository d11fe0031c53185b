"""Run untrusted Python in a separate process inside an OS-level sandbox (see docs/rewards.md).

Backends, best first (`backend=auto` takes the first that works on this host):
  bwrap    bubblewrap: fresh user/pid/net/ipc/uts/cgroup namespaces, a minimal read-only root (only what
           the interpreter needs: rewards/sandbox_mounts.py), size-limited tmpfs /tmp and /sandbox, no
           capabilities, no env
  unshare  the same namespaces via util-linux unshare + rewards/sandbox_init.py (pivot_root, caps dropped)
  rlimits  resource limits only: no isolation. Refused unless allow_weak=True.
Every backend also gets rlimits (CPU, address space, processes, file size, open files, no core dumps), an
empty environment, a new session, a wall-clock timeout that kills the whole process tree, a cap on the
output read back, death with the trainer (rewards/sandbox_proc.py), and a cpu cgroup of its own where
one can be made, so its processes together get one run's share of the CPU (rewards/sandbox_cgroup.py).
A namespace backend refuses to start if the project or a `protect`ed path (the task file) would be
visible inside. When the trainer runs as root, each run gets its own unprivileged uid/gid from RUN_UIDS
(no account, no files, no capabilities; no two runs of this process share one), so its RLIMIT_NPROC
budget is its alone: a fork bomb in one sandbox cannot starve another, nor any real user's processes.
"""
from __future__ import annotations

import functools
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from rewards.sandbox_cgroup import CpuGroups
from rewards.sandbox_cgroup import join as join_cgroup
from rewards.sandbox_mounts import PROJECT, MountError, Mounts, interpreter_mounts, refuse_if_exposed
from rewards.sandbox_proc import (die_with_parent, kill_tree, make_run_dir, read_bounded,
                                  remove_stale_run_dirs, tasks_of_uid)

HERE = Path(__file__).resolve().parent
NOBODY = 65534  # the uid seen inside the bwrap sandbox
RUN_UIDS = range(200_000, 300_000)  # host uids for sandbox runs when the trainer is root
BACKENDS = ("bwrap", "unshare", "rlimits")
_uids_in_use: set[int] = set()
_uids_lock = threading.Lock()


class SandboxUnavailable(RuntimeError):
    """No backend with isolation beyond rlimits works here (and the weak one was not allowed), or the
    sandbox would expose a protected path."""


@dataclass
class RunResult:
    stdout: bytes
    stderr: bytes
    returncode: int | None
    seconds: float
    timed_out: bool
    output_limited: bool
    token: str  # in the sandboxed command line: find leftovers with /proc/*/cmdline
    root: str  # the host temp dir it ran from (removed before run() returns)
    stalled: bool = False  # killed: stdout silent for `idle_seconds`


def default_python() -> str:
    """The interpreter run inside: the system one, else this one."""
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else os.path.realpath(sys.executable)


class Sandbox:
    def __init__(self, backend: str, allow_weak: bool, python: str | None, cpu_seconds: float,
                 memory_mb: int, max_processes: int, max_file_mb: int, tmpfs_mb: int,
                 wall_seconds: float, max_output_kb: int, protect: list[str | None] | None = None,
                 key: str = "reward.sandbox", weak_key: str = "reward.allow_weak_sandbox"):
        """`key`: where this sandbox's node is in the config, `weak_key`: the key that accepts rlimits only;
        the refusals name them (reward=code_exec's by default; conf/env/chat_python.yaml names its own)."""
        self.key, self.weak_key = key, weak_key
        if backend not in ("auto",) + BACKENDS:
            raise ValueError(f"{key}.backend={backend!r}: choose auto, {', '.join(BACKENDS)}")
        self.python = python or default_python()
        self.cpu_seconds, self.memory_mb, self.max_processes = cpu_seconds, memory_mb, max_processes
        self.max_file_mb, self.tmpfs_mb, self.wall_seconds = max_file_mb, tmpfs_mb, wall_seconds
        self.max_output = max_output_kb * 1024
        self.protect = [str(PROJECT)] + [str(p) for p in protect or () if p]
        self.as_root = os.geteuid() == 0
        self._checked: set[str] = set()  # files protect_file found out of reach
        self.backend = self._choose(backend, allow_weak)
        remove_stale_run_dirs()  # the model's code left by a trainer that was killed mid-run
        self.cpu = CpuGroups()  # a cpu cgroup per run where one can be made (and stale ones removed)

    # ------------------------------------------------------------------ choosing a backend
    def _choose(self, wanted: str, allow_weak: bool) -> str:
        """The backend to use; never a weaker one than asked for, and rlimits only if allowed."""
        why = {}
        for name in ("bwrap", "unshare") if wanted == "auto" else (wanted,) if wanted != "rlimits" else ():
            why[name] = probe(name, self.python, self.as_root)
            if why[name] is None:
                self._refuse_if_exposed()
                return name
        if wanted not in ("auto", "rlimits"):
            raise SandboxUnavailable(f"{self.key}.backend={wanted} does not work here: {why[wanted]}")
        if allow_weak:
            return "rlimits"
        lead = (f"{self.key}.backend=rlimits isolates nothing" if wanted == "rlimits" else
                f"no sandbox with isolation beyond rlimits works here "
                f"({'; '.join(f'{k}: {v}' for k, v in why.items())}); install bubblewrap "
                "(apt-get install -y bubblewrap) or allow unprivileged user namespaces")
        raise SandboxUnavailable(
            f"{lead}. Model-written code would run with only resource limits: refusing to start. Set "
            f"{self.weak_key}=true to accept that (never on a machine with secrets).")

    def _refuse_if_exposed(self, paths: list[str] | None = None) -> None:
        try:
            refuse_if_exposed(self.protect if paths is None else paths, interpreter_mounts(self.python))
        except MountError as e:
            raise SandboxUnavailable(str(e)) from None

    def protect_file(self, path: str | None) -> None:
        """Raise SandboxUnavailable if `path` (a task file, however it was loaded) lies under what a
        namespace backend mounts; checked once per path. The `protect` paths were checked at start."""
        if path and self.backend in ("bwrap", "unshare") and path not in self._checked:
            self._refuse_if_exposed([path])
            self._checked.add(path)

    # ------------------------------------------------------------------ running
    def run(self, files: dict[str, str], argv: list[str], idle_seconds: float | None = None,
            wall_seconds: float | None = None) -> RunResult:
        """Write `files` to a fresh read-only dir (/harness inside) and run `python -I -S /harness/argv[0]
        argv[1:]` in it, killed after `wall_seconds` (the sandbox's, or this run's when smaller: a tool call
        near the end of its round's budget), or once its stdout has been silent for `idle_seconds` after its
        first output. Never raises for anything the program does; the temp dir is removed
        (by the next start if this process is killed meanwhile)."""
        token = uuid.uuid4().hex
        if self.backend == "unshare":
            files = files | {"sandbox_init.py": (HERE / "sandbox_init.py").read_text()}
        root, uid, group = make_run_dir(), None, None
        try:
            uid = take_uid() if self.as_root else None
            group = self.cpu.create(root.name) if self.cpu is not None else None
            code = root / "code"
            code.mkdir()
            for name, text in files.items():
                (code / name).write_text(text)
            for p in (root, code, *code.iterdir()):
                p.chmod(0o755 if p.is_dir() else 0o644)
            cmd, cwd = self._command(root, code, [argv[0], *argv[1:], token], uid)
            wall = self.wall_seconds if wall_seconds is None else min(self.wall_seconds, wall_seconds)
            return self._execute(cmd, cwd, token, str(root), uid, group, idle_seconds, wall)
        finally:
            shutil.rmtree(root, ignore_errors=True)
            if group is not None:
                self.cpu.remove(group)
            release_uid(uid)

    def _command(self, root: Path, code: Path, argv: list[str], uid: int | None) -> tuple[list[str], str]:
        limits = self._prlimit()
        if self.backend in ("bwrap", "unshare"):
            mounts = interpreter_mounts(self.python)
            inner = [mounts.executable, "-I", "-S", f"/harness/{argv[0]}", *argv[1:]]
            if self.backend == "bwrap":
                return limits + bwrap_args(mounts, str(code), self.tmpfs_mb) + ["--"] + inner, str(root)
            (root / "root").mkdir(mode=0o755)
            return limits + unshare_args(self.python, mounts, str(root / "root"), str(code), self.tmpfs_mb,
                                         inner), str(root)
        work = root / "work"  # rlimits only: a fresh host temp dir as the working directory
        work.mkdir()
        if uid is not None:
            os.chown(work, uid, uid)
        return limits + [self.python, "-I", "-S", str(code / argv[0]), *argv[1:]], str(work)

    def _prlimit(self) -> list[str]:
        nproc = self.max_processes
        if not self.as_root:  # the kernel counts every process of this uid: allow ours plus the budget
            nproc += tasks_of_uid(os.getuid())
        mb = 1024 * 1024
        cpu = max(1, int(self.cpu_seconds + 0.999))
        return [shutil.which("prlimit") or "prlimit", f"--cpu={cpu}:{cpu + 1}",
                f"--as={self.memory_mb * mb}", f"--nproc={nproc}", f"--fsize={self.max_file_mb * mb}",
                "--nofile=64", "--core=0", "--"]

    def _execute(self, cmd: list[str], cwd: str, token: str, root: str, uid: int | None,
                 group: Path | None, idle: float | None, wall: float) -> RunResult:
        start = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, cwd=cwd, env={}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                                    preexec_fn=functools.partial(enter_run, group, uid))
        except (OSError, subprocess.SubprocessError) as e:  # e.g. a tool vanished: this run did not start
            return RunResult(b"", f"{type(e).__name__}: {e}".encode(), None, 0.0, False, False, token, root)
        out, err, timed_out, limited, stalled = read_bounded(proc, start + wall, self.max_output,
                                                             idle)
        kill_tree(proc)
        return RunResult(out, err, proc.returncode, time.monotonic() - start, timed_out, limited, token, root,
                         stalled)


def enter_run(group: Path | None, uid: int | None) -> None:
    """Popen preexec_fn, in the child before exec: join the run's cpu cgroup (while still root: cgroup v2
    lets only the common ancestor's owner move a process), take the run's uid and no groups, then
    die_with_parent (after the uid change, which would clear it)."""
    if group is not None:
        join_cgroup(group)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    die_with_parent()


def take_uid() -> int:
    """A uid from RUN_UIDS that no other run of this process is using."""
    pick = random.SystemRandom()
    with _uids_lock:
        uid = pick.choice(RUN_UIDS)
        while uid in _uids_in_use:
            uid = pick.choice(RUN_UIDS)
        _uids_in_use.add(uid)
    return uid


def release_uid(uid: int | None) -> None:
    with _uids_lock:
        _uids_in_use.discard(uid)


def bwrap_args(mounts: Mounts, code: str, tmpfs_mb: int) -> list[str]:
    args = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
            "--as-pid-1", "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL",
            "--hostname", "sandbox", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    for path in mounts.paths:
        args += ["--ro-bind", path, path]
    for link, target in mounts.links:
        args += ["--symlink", target, link]
    size = str(tmpfs_mb * 1024 * 1024)
    return args + ["--ro-bind", code, "/harness", "--proc", "/proc", "--dev", "/dev",
                   "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/sandbox",
                   "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/sandbox"]


def unshare_args(python: str, mounts: Mounts, root: str, code: str, tmpfs_mb: int,
                 inner: list[str]) -> list[str]:
    cfg = {"root": root, "ro_binds": list(mounts.paths), "links": dict(mounts.links), "code": code,
           "tmpfs_bytes": tmpfs_mb * 1024 * 1024, "argv": inner}
    return [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--mount", "--pid", "--net",
            "--ipc", "--uts", "--cgroup", "--fork", "--kill-child", "--", python, "-I", "-S",
            f"{code}/sandbox_init.py", json.dumps(cfg)]


@functools.lru_cache(maxsize=None)
def probe(backend: str, python: str, as_root: bool) -> str | None:
    """None if `backend` runs a trivial program on this host, else why not (cached per process)."""
    for tool in (backend, "prlimit"):
        if not shutil.which(tool):
            return f"{tool} not found" + (" (util-linux)" if tool == "prlimit" else "")
    box = Sandbox.__new__(Sandbox)  # the real run path, with fixed small limits
    box.python, box.backend, box.as_root = python, backend, as_root
    box.cpu_seconds, box.memory_mb, box.max_processes, box.max_file_mb = 5, 512, 16, 1
    box.tmpfs_mb, box.wall_seconds, box.max_output, box.cpu = 1, 20, 4096, None
    try:
        result = box.run({"probe.py": "import os; print('ok', os.getuid())"}, ["probe.py"])
    except MountError as e:
        return str(e)
    if result.stdout.startswith(b"ok"):
        return None
    msg = result.stderr.decode(errors="replace").strip().splitlines()
    return f"exit {result.returncode}: {msg[-1] if msg else 'no output'}"
