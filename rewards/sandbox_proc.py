"""Host-side process plumbing for rewards/sandbox.py: the run's temp dir (and removing those a killed
trainer left behind), tying the sandbox's life to the trainer's, bounded reading, killing the tree.
"""
from __future__ import annotations

import ctypes
import os
import re
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

PREFIX = "policyshift-sandbox-"
RUN_DIR = re.compile(rf"^{PREFIX}(\d+)-(\d+)-(\d+)-")  # owner's pid namespace, pid, start time
PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up now: the forked child only calls it


def die_with_parent() -> None:
    """Popen preexec_fn (runs in the child after its uid change, before exec; kept across exec): SIGKILL
    this process when the thread that started it dies, e.g. the trainer killed by SIGKILL or SIGTERM.
    The sandboxed tree goes with it: bwrap --die-with-parent, unshare --kill-child, then the pid namespace."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time since boot), None if no such process (or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "(comm)", which may contain spaces
    return None if fields[0] in ("Z", "X") else int(fields[19])


def pid_namespace() -> int:
    """This process's pid namespace (its inode): pids of other namespaces (containers sharing the temp
    dir) say nothing about liveness here."""
    return os.stat("/proc/self/ns/pid").st_ino


def make_run_dir() -> Path:
    """A fresh temp dir named after this process (pid namespace, pid, start time), so a later start can
    tell whether its owner is gone."""
    pid = os.getpid()
    return Path(tempfile.mkdtemp(prefix=f"{PREFIX}{pid_namespace()}-{pid}-{start_time(pid)}-"))


def remove_stale_run_dirs(parent: str | None = None) -> list[str]:
    """Delete run dirs (the model's code) whose owning process is dead: left when a trainer was killed
    mid-run. Dirs of live processes (other trainers on this host), of other pid namespaces, and other
    names are kept."""
    parent = parent or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    here = pid_namespace()
    for name in names:
        m = RUN_DIR.match(name)
        if m and int(m.group(1)) == here and start_time(int(m.group(2))) != int(m.group(3)):
            path = os.path.join(parent, name)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def read_bounded(proc: subprocess.Popen, deadline: float, cap: int,
                 idle: float | None = None) -> tuple[bytes, bytes, bool, bool, bool]:
    """Read stdout/stderr until both close, the deadline passes (timed_out), more than `cap` bytes
    arrive on either (output_limited) or, once stdout has said something, it stays silent for `idle`
    seconds (stalled). Keeps at most `cap` bytes of each."""
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    sel = selectors.DefaultSelector()
    for f in bufs:
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    timed_out = limited = stalled = False
    last_out = None  # when stdout last grew
    while sel.get_map():
        now = time.monotonic()
        stall_at = last_out + idle if idle is not None and last_out is not None else float("inf")
        if now >= deadline:
            timed_out = True
            break
        if now >= stall_at:
            stalled = True
            break
        for key, _ in sel.select(timeout=min(deadline - now, stall_at - now, 0.5)):
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            if key.fileobj is proc.stdout:
                last_out = time.monotonic()
            buf = bufs[key.fileobj]
            buf += chunk[: max(0, cap - len(buf))]
            limited = limited or len(buf) >= cap
        if limited:
            break
    drain(sel, bufs, cap)
    return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), timed_out, limited, stalled


def drain(sel: selectors.BaseSelector, bufs: dict, cap: int) -> None:
    """What is already in the pipes (e.g. the harness's last line), up to `cap`."""
    for key in list(sel.get_map().values()):
        try:
            buf = bufs[key.fileobj]
            buf += os.read(key.fileobj.fileno(), max(0, cap - len(buf)) or 1)[: max(0, cap - len(buf))]
        except BlockingIOError:
            pass
    sel.close()


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher's process group and every process below it, then wait for the launcher and
    reap those of its descendants that were handed to this process: a trainer that is PID 1 (a
    container's init) or a child subreaper inherits the sandbox's PID 1 when its launcher dies first, and
    would otherwise keep it as a zombie, one per killed run. With bwrap/unshare the kernel kills the rest of
    the sandbox's pid namespace with its PID 1."""
    tree = descendants(proc.pid)  # before the launcher dies: its children are still its own
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid, started in tree.items():
        if (stat := proc_stat(pid)) and stat[2] == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    proc.wait()
    reap_inherited(tree)
    for f in (proc.stdout, proc.stderr):
        f.close()


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time) from /proc/<pid>/stat; None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "(comm)", which may contain spaces
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """pid → start time of every process below `root` (host pids), from /proc/<pid>/task/*/children."""
    found, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                kids = [int(k) for k in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
            except OSError:
                kids = []
            for kid in kids:
                if kid not in found and (stat := proc_stat(kid)):
                    found[kid] = stat[2]
                    frontier.append(kid)
    return found


def reap_inherited(tree: dict[int, int]) -> None:
    """waitpid each process of `tree` (pid → start time) that is now this process's child: only those, so
    no other subprocess's exit status is taken. They were SIGKILLed, so each wait is short."""
    me = os.getpid()
    for pid, started in tree.items():
        stat = proc_stat(pid)
        if stat is not None and stat[1] == me and stat[2] == started:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def tasks_of_uid(uid: int) -> int:
    """Threads + processes the kernel counts against RLIMIT_NPROC for `uid`."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1 ").split()[0]) == uid:
            count += int(fields.get("Threads", "1").strip())
    return count
