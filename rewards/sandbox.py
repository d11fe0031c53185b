"""Run untrusted Python in a separate process inside an OS-level sandbox (see docs/rewards.md).

Backends, best first (`backend=auto` takes the first that works on this host):
  bwrap    bubblewrap: fresh user/pid/net/ipc/uts/cgroup namespaces, a minimal read-only root (/usr and
           the interpreter only), size-limited tmpfs /tmp and /sandbox, no capabilities, no env
  unshare  the same namespaces via util-linux unshare + rewards/sandbox_init.py (pivot_root, caps dropped)
  rlimits  resource limits only: no isolation. Refused unless allow_weak=True.
Every backend also gets rlimits (CPU, address space, processes, file size, open files, no core dumps), an
empty environment, a new session, a wall-clock timeout that kills the whole process tree, and a cap on
the output read back. When the trainer runs as root, each run gets its own unprivileged uid/gid from
RUN_UIDS (no account, no files, no capabilities), so its RLIMIT_NPROC budget is its alone: a fork bomb in
one sandbox cannot starve another, nor any real user's processes.
"""
from __future__ import annotations

import functools
import json
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOBODY = 65534  # the uid seen inside the bwrap sandbox
RUN_UIDS = range(200_000, 300_000)  # host uids for sandbox runs when the trainer is root
BACKENDS = ("bwrap", "unshare", "rlimits")


class SandboxUnavailable(RuntimeError):
    """No backend with isolation beyond rlimits works here, and the weak one was not allowed."""


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


def default_python() -> str:
    """The interpreter run inside: the system one (only /usr is mounted), else this one."""
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else os.path.realpath(sys.executable)


class Sandbox:
    def __init__(self, backend: str, allow_weak: bool, python: str | None, cpu_seconds: float,
                 memory_mb: int, max_processes: int, max_file_mb: int, tmpfs_mb: int,
                 wall_seconds: float, max_output_kb: int):
        if backend not in ("auto",) + BACKENDS:
            raise ValueError(f"reward.sandbox.backend={backend!r}: choose auto, {', '.join(BACKENDS)}")
        self.python = python or default_python()
        self.cpu_seconds, self.memory_mb, self.max_processes = cpu_seconds, memory_mb, max_processes
        self.max_file_mb, self.tmpfs_mb, self.wall_seconds = max_file_mb, tmpfs_mb, wall_seconds
        self.max_output = max_output_kb * 1024
        self.as_root = os.geteuid() == 0
        self.backend = self._choose(backend, allow_weak)

    # ------------------------------------------------------------------ choosing a backend
    def _choose(self, wanted: str, allow_weak: bool) -> str:
        """The backend to use; never a weaker one than asked for, and rlimits only if allowed."""
        why = {}
        for name in ("bwrap", "unshare") if wanted == "auto" else (wanted,) if wanted != "rlimits" else ():
            why[name] = probe(name, self.python, self.as_root)
            if why[name] is None:
                return name
        if wanted not in ("auto", "rlimits"):
            raise SandboxUnavailable(f"reward.sandbox.backend={wanted} does not work here: {why[wanted]}")
        if allow_weak:
            return "rlimits"
        lead = ("reward.sandbox.backend=rlimits isolates nothing" if wanted == "rlimits" else
                f"no sandbox with isolation beyond rlimits works here "
                f"({'; '.join(f'{k}: {v}' for k, v in why.items())}); install bubblewrap "
                "(apt-get install -y bubblewrap) or allow unprivileged user namespaces")
        raise SandboxUnavailable(
            f"{lead}. Model-written code would run with only resource limits: refusing to start. Set "
            "reward.allow_weak_sandbox=true to accept that (never on a machine with secrets).")

    # ------------------------------------------------------------------ running
    def run(self, files: dict[str, str], argv: list[str]) -> RunResult:
        """Write `files` to a fresh read-only dir (/harness inside) and run `python -I -S /harness/argv[0]
        argv[1:]` in it. Never raises for anything the program does; the temp dir is always removed."""
        token = uuid.uuid4().hex
        uid = random.SystemRandom().choice(RUN_UIDS) if self.as_root else None
        if self.backend == "unshare":
            files = files | {"sandbox_init.py": (HERE / "sandbox_init.py").read_text()}
        root = Path(tempfile.mkdtemp(prefix="policyshift-sandbox-"))
        try:
            code = root / "code"
            code.mkdir()
            for name, text in files.items():
                (code / name).write_text(text)
            for p in (root, code, *code.iterdir()):
                p.chmod(0o755 if p.is_dir() else 0o644)
            cmd, cwd = self._command(root, code, [argv[0], *argv[1:], token], uid)
            return self._execute(cmd, cwd, token, str(root), uid)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def _command(self, root: Path, code: Path, argv: list[str], uid: int | None) -> tuple[list[str], str]:
        inner = [self.python, "-I", "-S", f"/harness/{argv[0]}", *argv[1:]]
        limits = self._prlimit()
        if self.backend == "bwrap":
            return limits + bwrap_args(self.python, str(code), self.tmpfs_mb) + ["--"] + inner, str(root)
        if self.backend == "unshare":
            (root / "root").mkdir(mode=0o755)
            return limits + unshare_args(self.python, str(root / "root"), str(code), self.tmpfs_mb,
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

    def _execute(self, cmd: list[str], cwd: str, token: str, root: str, uid: int | None) -> RunResult:
        start = time.monotonic()
        kw = dict(user=uid, group=uid, extra_groups=[]) if uid is not None else {}
        try:
            proc = subprocess.Popen(cmd, cwd=cwd, env={}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True, close_fds=True, **kw)
        except OSError as e:  # e.g. a tool vanished since the probe: this run did not start
            return RunResult(b"", f"{type(e).__name__}: {e}".encode(), None, 0.0, False, False, token, root)
        out, err, timed_out, limited = read_bounded(proc, start + self.wall_seconds, self.max_output)
        kill_tree(proc)
        return RunResult(out, err, proc.returncode, time.monotonic() - start, timed_out, limited, token, root)


def read_bounded(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
    """Read stdout/stderr until both close, the deadline passes (timed_out) or more than `cap` bytes
    arrive on either (output_limited). Keeps at most `cap` bytes of each."""
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    sel = selectors.DefaultSelector()
    for f in bufs:
        os.set_blocking(f.fileno(), False)
        sel.register(f, selectors.EVENT_READ)
    timed_out = limited = False
    while sel.get_map():
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(timeout=min(left, 0.5)):
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            buf = bufs[key.fileobj]
            buf += chunk[: max(0, cap - len(buf))]
            if len(chunk) and len(buf) >= cap:
                limited = True
        if limited:
            break
    for key in list(sel.get_map().values()):  # what is already in the pipe (e.g. the harness's first line)
        try:
            buf = bufs[key.fileobj]
            buf += os.read(key.fileobj.fileno(), max(0, cap - len(buf)) or 1)[: max(0, cap - len(buf))]
        except BlockingIOError:
            pass
    sel.close()
    return bytes(bufs[proc.stdout]), bytes(bufs[proc.stderr]), timed_out, limited


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the sandbox's process group. With bwrap/unshare the sandboxed PID 1 is killed with its
    parent (die-with-parent / kill-child), and the kernel then kills everything in its pid namespace."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for f in (proc.stdout, proc.stderr):
        f.close()


def bwrap_args(python: str, code: str, tmpfs_mb: int) -> list[str]:
    args = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
            "--as-pid-1", "--die-with-parent", "--new-session", "--clearenv", "--cap-drop", "ALL",
            "--hostname", "sandbox", "--uid", str(NOBODY), "--gid", str(NOBODY)]
    for path in ro_paths(python):
        args += ["--ro-bind", path, path]
    for link, target in root_links().items():
        args += ["--symlink", target, link]
    size = str(tmpfs_mb * 1024 * 1024)
    return args + ["--ro-bind", code, "/harness", "--proc", "/proc", "--dev", "/dev",
                   "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/sandbox",
                   "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/sandbox"]


def unshare_args(python: str, root: str, code: str, tmpfs_mb: int, inner: list[str]) -> list[str]:
    cfg = {"root": root, "ro_binds": ro_paths(python), "links": root_links(), "code": code,
           "tmpfs_bytes": tmpfs_mb * 1024 * 1024, "argv": inner}
    return [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--mount", "--pid", "--net",
            "--ipc", "--uts", "--fork", "--kill-child", "--", python, "-I", "-S",
            f"{code}/sandbox_init.py", json.dumps(cfg)]


def ro_paths(python: str) -> list[str]:
    """/usr, the real dirs among /bin /lib /lib64 /lib32 /sbin, and the interpreter's prefix if elsewhere."""
    paths = ["/usr"] + [p for p in ("/bin", "/lib", "/lib64", "/lib32", "/sbin")
                        if os.path.isdir(p) and not os.path.islink(p)]
    prefix = str(Path(os.path.realpath(python)).parent.parent)
    if not any(prefix == p or prefix.startswith(p + "/") for p in paths):
        paths.append(prefix)
    return paths


def root_links() -> dict[str, str]:
    return {p: os.readlink(p) for p in ("/bin", "/lib", "/lib64", "/lib32", "/sbin") if os.path.islink(p)}


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


@functools.lru_cache(maxsize=None)
def probe(backend: str, python: str, as_root: bool) -> str | None:
    """None if `backend` runs a trivial program on this host, else why not (cached per process)."""
    for tool in (backend, "prlimit"):
        if not shutil.which(tool):
            return f"{tool} not found" + (" (util-linux)" if tool == "prlimit" else "")
    box = Sandbox.__new__(Sandbox)  # the real run path, with fixed small limits
    box.python, box.backend, box.as_root = python, backend, as_root
    box.cpu_seconds, box.memory_mb, box.max_processes, box.max_file_mb = 5, 512, 16, 1
    box.tmpfs_mb, box.wall_seconds, box.max_output = 1, 20, 4096
    result = box.run({"probe.py": "import os; print('ok', os.getuid())"}, ["probe.py"])
    if result.stdout.startswith(b"ok"):
        return None
    msg = result.stderr.decode(errors="replace").strip().splitlines()
    return f"exit {result.returncode}: {msg[-1] if msg else 'no output'}"
