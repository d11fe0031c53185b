"""A sandbox never outlives its trainer: a trainer killed mid-scoring (SIGKILL, SIGTERM) takes the
sandboxed process with it on every backend, and the temp dir it left (the model's code) is removed by
the next start, never one whose owner is still alive."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from rewards.sandbox import Sandbox, default_python, probe
from rewards.sandbox_proc import PREFIX, pid_namespace, remove_stale_run_dirs, start_time

ROOT = Path(__file__).resolve().parents[2]
STRONG = [b for b in ("bwrap", "unshare") if probe(b, default_python(), os.geteuid() == 0) is None]
WALL = 6.0
LIMITS = dict(python=None, cpu_seconds=2, memory_mb=512, max_processes=16, max_file_mb=8, tmpfs_mb=16,
              wall_seconds=WALL, max_output_kb=64)
TRAINER = f"""
import functools, sys
sys.path.insert(0, {str(ROOT)!r})
from rewards.code_exec import CodeExecReward
from rewards.sandbox import Sandbox
from tasks.base import Example
box = functools.partial(Sandbox, backend=sys.argv[1], **{LIMITS!r})
rew = CodeExecReward("code_exec", box, sys.argv[1] == "rlimits", per_test_seconds=1.0, workers=1, timeout_s=600)
sleeper = ("import signal, time\\ndef f():\\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\\n"
           "    time.sleep(1000)\\n")
example = Example("", "", {{"entry_point": "f", "tests": [{{"args": [], "expected": 1}}]}})
print(rew.score([""], [sleeper], [example]))
"""  # the sleeper ignores the alarm and uses no CPU: only the wall clock, or its trainer's death, ends it


def children() -> dict[int, int]:
    """pid → parent pid, for every process."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        out[int(pid)] = int(stat.rsplit(")", 1)[1].split()[1])
    return out


def descendants(root: int) -> dict[int, int]:
    """pid → start time of every live process below `root`."""
    parents, found, frontier = children(), {}, [root]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier and p not in found]
        found |= {p: start_time(p) for p in kids}
        frontier = kids
    return {p: t for p, t in found.items() if t is not None}


def harness_running(pids) -> bool:
    for pid in pids:
        try:
            if b"harness.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            pass
    return False


@pytest.fixture
def shared_tmp(monkeypatch):
    """A temp parent for run dirs that other uids can traverse (pytest's tmp_path is 0700)."""
    path = tempfile.mkdtemp(prefix="policyshift-test-tmp-")
    os.chmod(path, 0o755)
    monkeypatch.setattr(tempfile, "tempdir", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(not STRONG, reason="no namespace sandbox on this host")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
@pytest.mark.parametrize("backend", STRONG + ["rlimits"])
def test_killing_the_trainer_mid_scoring_kills_the_sandbox(backend, sig, shared_tmp):
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, backend], cwd=ROOT,
                               env=os.environ | {"TMPDIR": shared_tmp, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 30
        while not harness_running(descendants(trainer.pid)) and time.monotonic() < deadline:
            assert trainer.poll() is None, "the trainer ended before its sandbox started"
            time.sleep(0.05)
        assert harness_running(descendants(trainer.pid)), "the sandboxed program never started"
        time.sleep(1.0)  # past the harness's first line: now only the sleeper runs (no write to die on)
        sandboxed = descendants(trainer.pid)
        os.kill(trainer.pid, sig)
        killed_at = time.monotonic()
        trainer.wait()
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    while any(start_time(p) == t for p, t in sandboxed.items()) and time.monotonic() < killed_at + WALL + 2:
        time.sleep(0.05)
    alive = [p for p, t in sandboxed.items() if start_time(p) == t]
    for pid in alive:  # do not leave them running if the test fails
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"{backend}: sandbox processes {alive} outlived their trainer past the wall clock"
    left = [n for n in os.listdir(shared_tmp) if n.startswith(f"{PREFIX}{pid_namespace()}-{trainer.pid}-")]
    assert left, "a killed trainer cannot remove its run dir: the next start must"
    Sandbox(backend=backend, allow_weak=backend == "rlimits", **LIMITS)  # the next start
    assert not [n for n in os.listdir(shared_tmp) if n.startswith(PREFIX)]


def test_only_run_dirs_of_dead_owners_are_removed(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    ns, me, born = pid_namespace(), os.getpid(), start_time(os.getpid())
    names = {"dead": f"{PREFIX}{ns}-{gone.pid}-123-abc", "reused_pid": f"{PREFIX}{ns}-{me}-{born + 1}-abc",
             "mine": f"{PREFIX}{ns}-{me}-{born}-abc", "other_namespace": f"{PREFIX}{ns + 1}-{gone.pid}-123-abc",
             "old_style": f"{PREFIX}k2j4_x9a", "other": "unrelated-1-2-3-"}
    for name in names.values():
        (tmp_path / name / "code").mkdir(parents=True)
        (tmp_path / name / "code" / "solution.py").write_text("x = 1\n")
    removed = remove_stale_run_dirs(str(tmp_path))
    assert sorted(removed) == sorted(str(tmp_path / names[k]) for k in ("dead", "reused_pid"))
    kept = ("mine", "other_namespace", "old_style", "other")
    assert sorted(os.listdir(tmp_path)) == sorted(names[k] for k in kept)
