"""The sandbox's processes, seen from the host: sandboxed code cannot signal its host-side launcher
(kill(0, ...)), it runs in namespaces of its own (cgroup too), and a killed run leaves no zombie in a
trainer that must reap orphans (a container's PID 1, or a child subreaper)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rewards.code_exec import CodeExecReward
from rewards.sandbox import Sandbox, default_python, probe
from tasks.base import Example

ROOT = Path(__file__).resolve().parents[2]
STRONG = [b for b in ("bwrap", "unshare") if probe(b, default_python(), os.geteuid() == 0) is None]
LIMITS = dict(python=None, cpu_seconds=2, memory_mb=512, max_processes=16, max_file_mb=8, tmpfs_mb=16,
              wall_seconds=4, max_output_kb=64)
pytestmark = pytest.mark.skipif(not STRONG, reason="no namespace sandbox (bwrap, unshare) works on this host")


@pytest.mark.parametrize("backend", STRONG)
def test_kill_zero_from_inside_leaves_the_launcher_alive(backend):
    """kill(0, SIGTERM) signals the caller's process group: with unshare it used to hold the launcher,
    which died (-15) and took the run with it. The sandbox's PID 1 ignores signals from inside."""
    box = Sandbox(backend, False, **LIMITS)
    prog = "import os, signal\nos.kill(0, signal.SIGTERM)\nos.kill(0, signal.SIGHUP)\nprint('alive')\n"
    result = box.run({"k.py": prog}, ["k.py"])
    assert (result.returncode, result.stdout) == (0, b"alive\n"), result.stderr[-300:]


@pytest.mark.parametrize("backend", STRONG)
def test_a_sample_signalling_its_group_is_scored_and_so_are_the_others(backend):
    rew = CodeExecReward("code_exec", lambda allow_weak: Sandbox(backend, allow_weak, **LIMITS), False,
                         per_test_seconds=1.0, workers=2, timeout_s=60)
    killer = "import os, signal\nos.kill(0, signal.SIGTERM)\ndef f(x):\n    return x + 1\n"
    honest = "def f(x):\n    return x + 1\n"
    ex = Example("", "", {"entry_point": "f", "tests": [{"args": [1], "expected": 2}, {"args": [2], "expected": 3}]})
    assert rew.score(["", "", ""], [killer, honest, honest], [ex] * 3) == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("backend", STRONG)
def test_the_sandbox_has_its_own_cgroup_namespace(backend):
    box = Sandbox(backend, False, **LIMITS)
    result = box.run({"ns.py": "import os\nprint(os.readlink('/proc/self/ns/cgroup'))\n"}, ["ns.py"])
    inside = result.stdout.decode().strip()
    assert inside.startswith("cgroup:[") and inside != os.readlink("/proc/self/ns/cgroup")


REAPER = """
import ctypes, json, os, sys, time
sys.path.insert(0, {root!r})
from rewards.sandbox import Sandbox
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come to us, as to PID 1
box = Sandbox(sys.argv[1], False, **json.loads(sys.argv[2]))
runs = [box.run({{"s.py": "import time\\ntime.sleep(100)\\n"}}, ["s.py"]),  # killed at wall_seconds
        box.run({{"p.py": "print('x', flush=True)\\nwhile True: pass\\n"}}, ["p.py"], idle_seconds=1),  # stalled
        box.run({{"q.py": "print('done')\\n"}}, ["q.py"])]  # ends by itself
time.sleep(1.0)  # time for any orphan to be handed to us and die
zombies = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        stat = open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    if int(stat[1]) == os.getpid() and stat[0] == "Z":
        zombies.append(int(pid))
print(json.dumps({{"timed_out": runs[0].timed_out, "stalled": runs[1].stalled, "zombies": zombies,
                  "pid1": os.getpid() == 1}}))
"""


def pid1_prefix() -> list[str]:
    """A command prefix that runs its command as PID 1 of a new pid namespace, as a container's init."""
    cmd = ["unshare", "--pid", "--fork", "--mount-proc"]
    try:
        ok = subprocess.run(cmd + ["true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    if not ok:
        pytest.skip("cannot make a pid namespace here (unshare --pid needs root): the subreaper case covers it")
    return cmd


@pytest.mark.parametrize("reaper", ["subreaper", "pid1"])
@pytest.mark.parametrize("backend", STRONG)
def test_killed_runs_leave_no_zombie_in_a_reaping_trainer(backend, reaper):
    """A trainer that is PID 1 (a container's init; here under `unshare --pid --fork`) or a child subreaper
    (PR_SET_CHILD_SUBREAPER, set by the script either way) inherits the sandbox's PID 1 when its launcher is
    killed; it must reap it. On main, bwrap left one zombie per killed run."""
    limits = LIMITS | {"wall_seconds": 2}
    prefix = pid1_prefix() if reaper == "pid1" else []
    out = subprocess.run(prefix + [sys.executable, "-c", textwrap.dedent(REAPER.format(root=str(ROOT))), backend,
                                   json.dumps(limits)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"timed_out": True, "stalled": True, "zombies": [], "pid1": reaper == "pid1"}
