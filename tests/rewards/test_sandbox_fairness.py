"""One sample cannot lower another's score by taking the CPU (issue 20): a sample that forks 15 spinners
and answers its tests in closed form (sleeping, to keep them alive) is scored beside a correct sample that
needs real CPU (a 3M-iteration loop per test). Per-test limits count the harness's own CPU time, and each
run is a cpu cgroup of its own, so both score 1.0. On main, inside a cpu cgroup (no autogroup there), the
loop scored 0.33 (0.0 with 16 spinners).

The scoring runs in a child process moved into a fresh cpu cgroup, as a trainer in a container or a job
scheduler's cgroup would be; the test skips only where no cgroup can be made here, saying so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rewards.sandbox import Sandbox, default_python, probe
from rewards.sandbox_cgroup import find_base

ROOT = Path(__file__).resolve().parents[2]
STRONG = [b for b in ("bwrap", "unshare") if probe(b, default_python(), os.geteuid() == 0) is None]
LIMITS = dict(python=None, cpu_seconds=5, memory_mb=512, max_processes=16, max_file_mb=8, tmpfs_mb=16,
              wall_seconds=10, max_output_kb=256)
SCORER = """
import functools, json, os, sys
sys.path.insert(0, {root!r})
with open(os.path.join(sys.argv[2], "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))  # from here on this "trainer" and all it starts live in that cpu cgroup
from rewards.code_exec import CodeExecReward
from rewards.sandbox import Sandbox
from tasks.base import Example
SPIN = '''
import os, time
for _ in range(15):
    try:
        if os.fork() == 0:
            while True:
                pass
    except OSError:
        pass
def f(n):
    time.sleep(0.8)
    return n * (n - 1) // 2
'''
LOOP = "def f(n):\\n    s = 0\\n    for i in range(n):\\n        s += i\\n    return s\\n"
tests = [{{"args": [n], "expected": n * (n - 1) // 2}} for n in (3_000_000, 3_000_001, 3_000_002)]
example = Example("", "", {{"entry_point": "f", "tests": tests}})
box = functools.partial(Sandbox, backend=sys.argv[1], **json.loads(sys.argv[3]))
rew = CodeExecReward("code_exec", box, False, per_test_seconds=1.0, workers=2, timeout_s=60)
scores = rew.score(["", ""], [SPIN, LOOP], [example, example])
print(json.dumps({{"scores": scores, "cpu_isolation": rew.stats()["sandbox/cpu_isolation"]}}))
"""


@pytest.fixture
def cpu_cgroup():
    """A fresh cpu cgroup under this process's own (v1 or v2), removed afterwards."""
    try:
        base, version = find_base()
    except OSError as e:
        pytest.skip(f"no cpu cgroup can be made on this host: {e}")
    if base is None:
        pytest.skip("no cpu cgroup can be made on this host (no writable cpu controller: not root, or no "
                    "delegated cgroup)")
    path = base / f"policyshift-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as e:
        pytest.skip(f"no cpu cgroup can be made on this host: mkdir {path}: {e}")
    yield path
    for child in path.iterdir():
        if child.is_dir():
            child.rmdir()
    path.rmdir()


@pytest.mark.skipif(not STRONG, reason="no namespace sandbox (bwrap, unshare) works on this host")
@pytest.mark.parametrize("backend", STRONG)
def test_forked_spinners_do_not_lower_a_group_mates_score(backend, cpu_cgroup):
    out = subprocess.run([sys.executable, "-c", SCORER.format(root=str(ROOT)), backend, str(cpu_cgroup),
                          json.dumps(LIMITS)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["scores"] == [1.0, 1.0]
    assert report["cpu_isolation"].startswith("cgroup-v")
    assert not [p for p in cpu_cgroup.iterdir() if p.is_dir()]  # every run's group was removed


@pytest.mark.skipif(not STRONG, reason="no namespace sandbox (bwrap, unshare) works on this host")
def test_without_a_cgroup_sandboxes_run_one_at_a_time(monkeypatch):
    import rewards.sandbox_cgroup as sandbox_cgroup
    from rewards.code_exec import CodeExecReward
    monkeypatch.setattr(sandbox_cgroup, "find_base", lambda: (None, None))
    box = lambda allow_weak: Sandbox(STRONG[0], allow_weak, **LIMITS)  # noqa: E731
    rew = CodeExecReward("code_exec", box, False, per_test_seconds=1.0, workers=4, timeout_s=60)
    assert rew.workers == 1 and rew.stats()["sandbox/cpu_isolation"] == "serial"
