"""Model-written code tries to break out of the sandbox (DESIGN §7, issue 5). Each attack is a completion
defining `attack()`, whose one unit test expects the value the attack returns only if it SUCCEEDED: so a
score of 1.0 means a breakout. Every attack must score 0 or None, within the timeout, leave no process,
temp dir or file behind on the host, and leave this process (the "trainer") alive.

Run for every sandbox backend with isolation that works on this host (bwrap, unshare); a host with
neither skips them, and tests/rewards/test_code_exec.py checks that such a host refuses to start.
"""
from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from rewards.code_exec import CodeExecReward
from rewards.sandbox import Sandbox, default_python, probe
from tasks.base import Example

ROOT = Path(__file__).resolve().parents[2]
BACKENDS = [b for b in ("bwrap", "unshare") if probe(b, default_python(), os.geteuid() == 0) is None]
LIMITS = dict(python=None, cpu_seconds=1, memory_mb=512, max_processes=16, max_file_mb=8, tmpfs_mb=16,
              wall_seconds=3, max_output_kb=64)
DEADLINE = LIMITS["wall_seconds"] + 3.0  # seconds an attack may take, start-up and teardown included
WIN = "pwned"


def attacks(port: int, secret_name: str, host_file: str) -> dict[str, str]:
    """name → completion source. Each returns WIN only if the attack worked."""
    me, source = os.getpid(), str(ROOT / "rewards" / "sandbox.py")
    return {
        "socket": f"""
import socket
def attack():
    for host, p in (("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)):
        try:
            socket.create_connection((host, p), timeout=1).close()
            return "{WIN}"
        except OSError:
            pass
""",
        "write_outside_tmp": f"""
def attack():  # /tmp and /sandbox inside are the sandbox's own: writing there is allowed
    written = False
    for path in ({str(ROOT / ("pwned-" + uuid.uuid4().hex))!r}, "/pwned", "/usr/pwned", "/harness/pwned",
                 "/proc/pwned", "/dev/pwned", {host_file!r}):
        try:
            open(path, "w").write("x")
            written = written or not path.startswith("/tmp/")
        except OSError:
            pass
    return "{WIN}" if written else None
""",
        "read_project_source": f"""
def attack():
    for path in ({source!r}, "/proc/{me}/cwd/rewards/sandbox.py", "/proc/{me}/root{source}"):
        try:
            return open(path).read()[:200]
        except OSError:
            pass
""",
        "read_parent_env_secret": f"""
import os
def attack():
    if {secret_name!r} in os.environ:
        return "{WIN}"
    for path in ("/proc/{me}/environ", "/proc/1/environ", "/proc/self/environ"):
        try:
            if {secret_name!r}.encode() in open(path, "rb").read():
                return "{WIN}"
        except OSError:
            pass
""",
        "fork_bomb": f"""
import os, signal
def attack():
    signal.signal(signal.SIGALRM, signal.SIG_IGN)  # run until the sandbox is killed
    while True:
        try:
            os.fork()
        except BaseException:
            pass
""",
        "allocate_10gib": f"""
def attack():
    block = bytearray(10 * 2**30)
    return "{WIN}" if len(block) else None
""",
        "infinite_loop": """
import signal
def attack():
    signal.signal(signal.SIGALRM, signal.SIG_IGN)  # ignore the per-test alarms too (wall backstop, CPU)
    signal.signal(signal.SIGPROF, signal.SIG_IGN)
    while True:
        pass
""",
        "print_1gb": """
import os, sys
def attack():
    chunk = b"x" * 2**20
    for _ in range(1024):  # 1 GiB on stdout, stderr and the harness's own channel
        for fd in (1, 2, 3):
            try:
                os.write(fd, chunk)
            except OSError:
                pass
        sys.stdout.write("y" * 2**20)
""",
        "kill_parent": f"""
import os, signal
def attack():
    for pid in ({me}, os.getppid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(os.getpgid({me}), signal.SIGKILL)
    except OSError:
        pass
""",
        "ctypes_libc": f"""
import ctypes
def attack():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.kill({me}, 9)
    libc.system(b"touch {host_file}")
    if libc.setuid(0) == 0 and libc.unshare(0x10000000) == 0:  # root + a new user namespace
        return "{WIN}"
    buf = ctypes.create_string_buffer(64)
    fd = libc.open({source.encode()!r}, 0)
    if fd >= 0 and libc.read(fd, buf, 64) > 0:
        return "{WIN}"
""",
    }


@pytest.fixture(scope="module")
def host():
    """A listening socket, a planted secret in the environment, and a host file path nobody may create."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    connections = []

    def accept():
        while True:
            try:
                connections.append(srv.accept())
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    name = f"POLICYSHIFT_FAKE_SECRET_{uuid.uuid4().hex[:8]}"
    os.environ[name] = "s3cr3t-" + uuid.uuid4().hex
    host_file = f"/tmp/policyshift-pwned-{uuid.uuid4().hex}"
    yield srv.getsockname()[1], name, host_file, connections
    os.environ.pop(name, None)
    srv.close()


class Recording(Sandbox):
    """A sandbox that remembers its runs (token and temp dir) so the test can look for leftovers."""

    runs: list

    def run(self, files, argv, **kw):
        result = super().run(files, argv, **kw)
        self.runs.append(result)
        return result


def leftovers(token: str) -> list[int]:
    """PIDs (other than ours) whose command line carries the run's token."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes() and int(pid) != os.getpid():
                found.append(int(pid))
        except OSError:
            pass
    return found


ATTACKS = list(attacks(0, "X", "/x"))


def test_this_host_has_a_namespace_sandbox():
    """The attacks below need one; a host without it fails here, loudly, instead of skipping them."""
    if os.environ.get("POLICYSHIFT_ALLOW_NO_SANDBOX") == "1":
        pytest.skip("POLICYSHIFT_ALLOW_NO_SANDBOX=1: security tests knowingly skipped")
    reasons = {b: probe(b, default_python(), os.geteuid() == 0) for b in ("bwrap", "unshare")}
    assert BACKENDS, (f"no namespace sandbox works on this host ({reasons}): apt-get install -y bubblewrap "
                      "(docs/rewards.md), or set POLICYSHIFT_ALLOW_NO_SANDBOX=1 to skip the security tests")


@pytest.mark.skipif(not BACKENDS, reason="no namespace sandbox on this host (see test_code_exec refusal tests)")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ATTACKS)
def test_attack_scores_zero_and_leaves_nothing(backend, name, host):
    port, secret, host_file, connections = host
    source = attacks(port, secret, host_file)[name]
    box = lambda allow_weak: Recording(backend=backend, allow_weak=allow_weak, **LIMITS)  # noqa: E731
    reward = CodeExecReward("code_exec", box, False, per_test_seconds=1.0, workers=1, timeout_s=60)
    reward.sandbox.runs = []
    expected = open(ROOT / "rewards" / "sandbox.py").read()[:200] if name == "read_project_source" else WIN
    example = Example("", "", {"entry_point": "attack", "tests": [{"args": [], "expected": expected}]})
    start = time.monotonic()
    [score] = reward.score([""], [source], [example])
    elapsed = time.monotonic() - start
    assert score in (0.0, None), f"{name}: the attack succeeded under {backend}"
    assert elapsed < DEADLINE, f"{name} took {elapsed:.1f}s (limit {DEADLINE}s)"
    [run] = reward.sandbox.runs
    deadline = time.monotonic() + 2.0  # the kernel tears a pid namespace down asynchronously
    while leftovers(run.token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not leftovers(run.token), f"{name}: processes left behind"
    assert not Path(run.root).exists(), f"{name}: temp dir {run.root} left behind"
    assert not Path(host_file).exists() and not list(ROOT.glob("pwned-*")), f"{name}: wrote on the host"
    assert not connections, f"{name}: reached a host socket"
    if name == "read_parent_env_secret":  # the secret itself is not in anything we read back
        assert os.environ[secret].encode() not in run.stdout + run.stderr
    if name == "print_1gb":
        assert run.output_limited and len(run.stdout) <= LIMITS["max_output_kb"] * 1024
    if name == "infinite_loop":  # ignores the per-test alarm: the CPU limit or the wall clock ends it
        assert run.timed_out or run.returncode not in (0, None)
