"""A cpu cgroup per sandbox run, so that one sample's processes cannot take CPU from another's.

Without it, every sandboxed process is one task to the scheduler: a sample that forks 15 spinners gets
16 shares of the CPU to its group-mate's one (bare VMs hide this with autogroup, per session; inside a
cpu cgroup, as in most containers and job schedulers, there is no autogroup). With it, each run is one
group of equal weight (cgroup v1 `cpu.shares`, v2 `cpu.weight`, both left at their default), however
many processes it has.

Groups are made beside the trainer, under its own cpu cgroup: v1, the `cpu` hierarchy's directory of this
process; v2, the unified directory of this process, which must offer the cpu controller to its children
(the root, or a delegated cgroup whose `cgroup.subtree_control` has cpu). A v2 cgroup that holds this
process cannot enable controllers for children, so there this process first moves itself into a leaf
`policyshift-trainer-<pid>` beside them, which works in a delegated cgroup that it alone occupies.

Each group is named like the run's temp dir (owner pid namespace, pid, start time), so groups that a
killed trainer left are removed by the next start, as its temp dirs are.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from rewards.sandbox_proc import RUN_DIR, pid_namespace, start_time


class CpuGroups:
    """Makes, joins and removes per-run cpu cgroups; `base` is None (with `why`) where none can be made."""

    def __init__(self):
        self.base, self.version, self.why = None, None, None
        try:
            self.base, self.version = find_base()
        except OSError as e:
            self.why = f"{type(e).__name__}: {e}"
        if self.base is None and self.why is None:
            self.why = "no cpu controller this process may create cgroups under"
        if self.base is not None:
            self.remove_stale()

    @property
    def kind(self) -> str | None:
        return f"cgroup-v{self.version}" if self.base else None

    def create(self, name: str) -> Path | None:
        """A fresh group `name` under base, None if it cannot be made (that run goes without)."""
        if self.base is None:
            return None
        path = self.base / name
        try:
            path.mkdir()
        except OSError:
            return None
        return path

    def remove(self, path: Path | None) -> None:
        """SIGKILL whatever is left in the group, then remove it (retried while its processes exit)."""
        if path is None:
            return
        for _ in range(50):
            try:
                path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                kill_members(path)
                time.sleep(0.02)

    def remove_stale(self) -> None:
        """Groups of runs whose trainer is gone (killed mid-run), in this pid namespace only."""
        here = pid_namespace()
        try:
            names = os.listdir(self.base)
        except OSError:
            return
        for name in names:
            m = RUN_DIR.match(name)
            if m and int(m.group(1)) == here and start_time(int(m.group(2))) != int(m.group(3)):
                self.remove(self.base / name)


def join(path: Path) -> None:
    """Move the calling process into `path` (a Popen preexec_fn, before the uid change)."""
    with open(path / "cgroup.procs", "w") as f:
        f.write("0")


def kill_members(path: Path) -> None:
    try:
        pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def own_cgroups() -> dict[str, str]:
    """controller (or "" for v2) → this process's cgroup path, from /proc/self/cgroup."""
    found = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            found[c] = path
    return found


def mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount root, mount point, fs type, super options) of each cgroup mount, from mountinfo."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, right = line.split(" - ", 1)
        fields, (fstype, _, opts) = left.split(), right.split()[:3]
        if fstype in ("cgroup", "cgroup2"):
            out.append((fields[3], fields[4], fstype, set(opts.split(","))))
    return out


def find_base() -> tuple[Path | None, int | None]:
    """(dir to make run groups in, cgroup version) or (None, None)."""
    own = own_cgroups()
    for root, point, fstype, opts in mounts():
        if fstype == "cgroup" and "cpu" in opts and "cpu" in own:
            path = resolve(root, point, own["cpu"])
            if path and os.access(path, os.W_OK):
                return path, 1
    for root, point, fstype, _ in mounts():
        if fstype == "cgroup2" and "" in own:
            path = resolve(root, point, own[""])
            if path and "cpu" in (path / "cgroup.controllers").read_text().split():
                return v2_base(path), 2
    return None, None


def resolve(mount_root: str, mount_point: str, cgroup: str) -> Path | None:
    """The directory of `cgroup` (a path in its hierarchy) under a mount of that hierarchy's `mount_root`."""
    if not (cgroup + "/").startswith(mount_root.rstrip("/") + "/"):
        return None
    path = Path(mount_point + "/" + cgroup[len(mount_root.rstrip("/")):].lstrip("/"))
    return path if path.is_dir() else None


def v2_base(path: Path) -> Path | None:
    """`path` with cpu enabled for its children, this process moved into a leaf of its own if needed."""
    control = path / "cgroup.subtree_control"
    if "cpu" in control.read_text().split():
        return path
    leaf = path / f"policyshift-trainer-{os.getpid()}"
    leaf.mkdir(exist_ok=True)
    (leaf / "cgroup.procs").write_text(str(os.getpid()))
    try:
        control.write_text("+cpu")
    except OSError:
        (path / "cgroup.procs").write_text(str(os.getpid()))  # others share it: put this process back
        leaf.rmdir()
        raise
    return path
