"""The sandbox shows only what the interpreter needs (not all of /usr): a project checked out under
/usr/src/app keeps its task file (the expected outputs) out of reach, and a sandbox that would expose
the project or a protected file refuses to start."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from rewards.code_exec import CodeExecReward
from rewards.sandbox import Sandbox, SandboxUnavailable, default_python, probe
from tasks.base import Example
from rewards.sandbox_mounts import (PROJECT, Mounts, MountError, exposed, interpreter_mounts, parse_ldd,
                                    refuse_if_exposed)

STRONG = [b for b in ("bwrap", "unshare") if probe(b, default_python(), os.geteuid() == 0) is None]
needs_sandbox = pytest.mark.skipif(not STRONG, reason="no namespace sandbox on this host")
LIMITS = dict(python=None, cpu_seconds=2, memory_mb=512, max_processes=16, max_file_mb=8, tmpfs_mb=16,
              wall_seconds=4, max_output_kb=64)
TASKS = PROJECT / "tasks" / "code_tasks.jsonl"


def stdlib_file() -> str:
    """A file under a dir the sandbox mounts for the interpreter: its os.py."""
    out = subprocess.run([default_python(), "-I", "-S", "-c", "import os; print(os.__file__)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert exposed([out], interpreter_mounts(default_python()).paths)
    return out


# ---------------------------------------------------------------- what is mounted (pure)
def test_mounts_only_the_interpreter_and_its_libraries():
    mounts = interpreter_mounts(default_python())
    assert mounts.executable == os.path.realpath(mounts.executable)
    assert any(mounts.executable == p or mounts.executable.startswith(p + "/") for p in mounts.paths)
    for hidden in ("/usr", "/usr/src", "/usr/local", "/usr/share", "/usr/bin", "/etc", "/root", str(PROJECT)):
        assert not exposed([hidden + "/x"], mounts.paths), f"{hidden} would be visible inside"
    assert not exposed([str(TASKS)], mounts.paths)


def test_exposed_matches_whole_path_components_after_resolving_links(tmp_path):
    assert exposed(["/usr/src/app/tasks.jsonl"], ("/usr",)) == [("/usr/src/app/tasks.jsonl", "/usr")]
    assert exposed(["/usr/lib"], ("/usr/lib",)) and not exposed(["/usr/lib2/x"], ("/usr/lib",))
    (tmp_path / "mounted").mkdir()
    (tmp_path / "mounted" / "tasks.jsonl").write_text("{}")
    (tmp_path / "link").symlink_to(tmp_path / "mounted")
    assert exposed([str(tmp_path / "link" / "tasks.jsonl")], (str(tmp_path / "mounted"),))


def test_refuse_if_exposed_names_the_path_and_the_mount():
    mounts = Mounts("/usr/bin/python3", ("/usr",), ())
    with pytest.raises(MountError, match=r"/usr/src/app/code_tasks.jsonl lies under /usr.*reward\.sandbox\.python"):
        refuse_if_exposed(["/usr/src/app/code_tasks.jsonl"], mounts)
    refuse_if_exposed(["/usr/src/app/code_tasks.jsonl"], Mounts("/usr/bin/python3", ("/usr/lib",), ()))


def test_parse_ldd():
    out = ("/usr/bin/python3.11:\n\tlinux-vdso.so.1 (0x00007f)\n\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 "
           "(0x00007f)\n\tlibgone.so => not found\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n")
    assert parse_ldd(out) == ["/lib/x86_64-linux-gnu/libm.so.6", "/lib64/ld-linux-x86-64.so.2"]


# ---------------------------------------------------------------- refusing to start
@needs_sandbox
@pytest.mark.parametrize("backend", STRONG)
def test_refuses_to_start_when_a_protected_file_lies_under_a_mount(backend):
    with pytest.raises(SandboxUnavailable, match="lies under"):
        Sandbox(backend=backend, allow_weak=False, protect=[stdlib_file()], **LIMITS)
    Sandbox(backend=backend, allow_weak=False, protect=[str(TASKS), None], **LIMITS)  # the default: fine


@needs_sandbox
def test_the_config_protects_the_task_file(hydra_conf):
    conf = hydra_conf(["task=code", "reward=code_exec", f"task.path={stdlib_file()}"])
    with pytest.raises(InstantiationException, match="lies under"):
        instantiate(conf.reward)


# ---------------------------------------------------------------- a checkout under /usr, for real
@pytest.fixture
def checkout_under_usr():
    """The task file copied to /usr/src/<fresh>/ (the tester's container layout), removed afterwards."""
    top = Path("/usr/src") / f"policyshift-test-{uuid.uuid4().hex[:8]}"
    try:
        (top / "tasks").mkdir(parents=True)
    except OSError as e:
        pytest.skip(f"cannot write under /usr/src here: {e}")
    target = top / "tasks" / "code_tasks.jsonl"
    shutil.copy(TASKS, target)
    for p in (top, *top.rglob("*")):
        p.chmod(0o755 if p.is_dir() else 0o644)
    yield target
    shutil.rmtree(top, ignore_errors=True)


@needs_sandbox
@pytest.mark.parametrize("backend", STRONG)
def test_a_checkout_under_usr_is_out_of_reach(backend, checkout_under_usr):
    head = checkout_under_usr.read_text()[:100]
    attack = f"""
import os
def attack():
    for path in ({str(checkout_under_usr)!r}, "/proc/1/root{checkout_under_usr}"):
        try:
            return open(path).read()[:100]
        except OSError:
            pass
    for top in ("/usr/src", "/usr", "/usr/share", "/usr/local"):
        try:
            if any(name.startswith("policyshift-test-") for name in os.listdir(top)):
                return {head!r}
        except OSError:
            pass
"""
    box = functools.partial(Sandbox, backend=backend, protect=[str(checkout_under_usr)], **LIMITS)  # no refusal
    reward = CodeExecReward("code_exec", box, False, per_test_seconds=1.0, workers=1, timeout_s=60)
    example = Example("", "", {"entry_point": "attack", "tests": [{"args": [], "expected": head}]})
    assert reward.score([""], [attack], [example]) == [0.0]


# ---------------------------------------------------------------- task files however loaded (issue 20)
@needs_sandbox
@pytest.mark.parametrize("key", ["task.train_path", "task.heldout_path"])
def test_the_config_protects_jsonl_task_files(hydra_conf, key):
    conf = hydra_conf(["task=jsonl", "task.train_path=/nonexistent.jsonl", f"{key}={stdlib_file()}",
                       "reward=code_exec"])
    with pytest.raises(InstantiationException, match="lies under"):
        instantiate(conf.reward)


@pytest.fixture
def task_file_in_a_mount():
    """A code task file written next to the interpreter's os.py (a dir every namespace sandbox mounts)."""
    target = Path(stdlib_file()).parent / f"policyshift-test-{uuid.uuid4().hex[:8]}.jsonl"
    line = {"prompt": "p", "answer": "a", "entry_point": "attack", "tests": [{"args": [], "expected": "s3cret"}]}
    try:
        target.write_text(__import__("json").dumps(line) + "\n")
    except OSError as e:
        pytest.skip(f"cannot write into the interpreter's stdlib dir here (needs root): {e}")
    target.chmod(0o644)
    yield target
    target.unlink(missing_ok=True)


@needs_sandbox
@pytest.mark.parametrize("backend", STRONG)
def test_a_task_file_is_protected_however_it_was_loaded(backend, task_file_in_a_mount):
    """A task read by tasks.jsonl (task=jsonl, or any loader using it) with nothing in `protect`: the
    sample that would read its expected outputs is never run (abstains, naming the file), not scored 1.0."""
    from tasks.jsonl import read_examples
    [example] = read_examples(str(task_file_in_a_mount))
    attack = f"""
import json
def attack():
    return json.loads(open({str(task_file_in_a_mount)!r}).readline())["tests"][0]["expected"]
"""
    box = functools.partial(Sandbox, backend=backend, protect=[], **LIMITS)
    reward = CodeExecReward("code_exec", box, False, per_test_seconds=1.0, workers=1, timeout_s=60)
    report = reward.score_report([""], [attack], [example])
    assert report.scores == [None] and "lies under" in report.first_error
    assert str(task_file_in_a_mount) in report.first_error
