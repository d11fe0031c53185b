"""One owner per run or sweep folder, and a failed attempt that leaves no trace (run/run_folder.py), in
process: the lock against this process and against another live one, its release when the owner dies,
what `undo` removes and what it keeps, and the sweep dir's refusals before Hydra writes anything."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from run.run_folder import LOCK_NAME, OWNER_ENV, FolderInUse, FolderLock, RunFolder, owned
from run.run_record import RefuseUsedSweepDir

ROOT = Path(__file__).resolve().parents[2]


def test_a_second_owner_is_refused_naming_the_live_one_and_the_lock_file_goes_with_it(tmp_path):
    first = FolderLock(tmp_path / "run").acquire("hint")
    assert (tmp_path / "run" / LOCK_NAME).read_text().startswith(f"pid {os.getpid()} on ")
    with pytest.raises(FolderInUse, match=rf"{tmp_path / 'run'} is in use by a live run \(pid {os.getpid()} on "
                                          rf".*kill {os.getpid()}\)"):
        FolderLock(tmp_path / "run").acquire("stop it (kill {pid})")
    first.release()
    assert list((tmp_path / "run").iterdir()) == []  # the lock file left with its owner
    FolderLock(tmp_path / "run").acquire("hint").release()  # free again


def hold_lock_in_a_child(folder: Path) -> subprocess.Popen:
    code = ("import sys, time; from run.run_folder import FolderLock; FolderLock(sys.argv[1]).acquire('h'); "
            "print('held', flush=True); time.sleep(120)")
    child = subprocess.Popen([sys.executable, "-c", code, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_another_live_process_owns_the_folder_until_it_dies(tmp_path):
    child = hold_lock_in_a_child(tmp_path)
    try:
        with pytest.raises(FolderInUse, match=rf"live run \(pid {child.pid} on "):
            FolderLock(tmp_path).acquire("hint")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert (tmp_path / LOCK_NAME).exists()  # a killed owner leaves its file, not its lock
    FolderLock(tmp_path).acquire("hint").release()


def test_undo_removes_what_this_attempt_added_and_keeps_what_was_there(tmp_path):
    out = tmp_path / "run"
    (out / "checkpoints" / "sft").mkdir(parents=True)
    (out / "checkpoints" / "sft" / "final.ckpt").write_bytes(b"kept")
    (out / "train.log").write_text("an earlier attempt's log\n")
    os.utime(out / "train.log", (time.time() - 60, time.time() - 60))
    folder = RunFolder(out, [out / "train.log"], process_start=time.time())
    (out / "checkpoints" / "grpo").mkdir()
    (out / "checkpoints" / "grpo" / "epoch=0-step=0.ckpt").write_bytes(b"new")
    (out / "csv" / "grpo").mkdir(parents=True)
    (out / "config.resume-1.yaml").write_text("new")
    (out / "checkpoints" / "sft" / "last.ckpt").symlink_to("final.ckpt")
    with (out / "train.log").open("a") as log:
        log.write("this attempt's lines\n")
    assert not folder.started() and not folder.new
    removed = folder.undo()
    assert set(removed) == {"checkpoints/grpo", "checkpoints/grpo/epoch=0-step=0.ckpt", "csv", "csv/grpo",
                            "config.resume-1.yaml", "checkpoints/sft/last.ckpt"}
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "checkpoints", "checkpoints/sft", "checkpoints/sft/final.ckpt", "train.log"]
    assert (out / "train.log").read_text() == "an earlier attempt's log\n"


def test_the_run_record_marks_a_started_run(tmp_path):
    (tmp_path / "run.json").write_text('{"resumes": []}')
    folder = RunFolder(tmp_path, [], process_start=time.time())
    assert not folder.started()
    (tmp_path / "run.json").write_text('{"resumes": [{}]}')  # a resume's first step appends to it
    assert folder.started()


def test_owned_puts_a_new_folder_back_to_absent_after_a_failure_before_the_first_step(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "train.log").write_text("")  # what Hydra opened for this process
    with pytest.raises(ValueError, match="late"):
        with owned(out, [out / "train.log"], time.time() - 1, is_zero=True):
            (out / "csv").mkdir()
            (out / "wandb" / "offline-run-1").mkdir(parents=True)
            raise ValueError("late")
    assert not out.exists()


def test_owned_keeps_a_started_run_and_releases_the_folder(tmp_path):
    with pytest.raises(ValueError):
        with owned(tmp_path, [], time.time(), is_zero=True):
            (tmp_path / "run.json").write_text("{}")
            (tmp_path / "checkpoints").mkdir()
            raise ValueError("after the first step")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "run.json"]


def test_ranks_run_under_their_launcher_and_rank0(tmp_path, monkeypatch):
    lock = FolderLock(tmp_path).acquire("hint")
    try:
        monkeypatch.setenv(OWNER_ENV, f"{os.getpid()}:{tmp_path}")
        with owned(tmp_path, [], time.time(), is_zero=True) as folder:  # rank 0 of a launched job
            assert folder is None
        monkeypatch.delenv(OWNER_ENV)
        with owned(tmp_path, [], time.time(), is_zero=False) as folder:  # rank 1 under srun/torchrun
            assert folder is None
        with pytest.raises(FolderInUse):
            with owned(tmp_path, [], time.time(), is_zero=True):
                pass
    finally:
        lock.release()


def sweep_config(sweep: Path, resume: bool = False):
    return OmegaConf.create({"resume": resume, "hydra": {"sweep": {"dir": str(sweep)}}})


def test_a_sweep_owns_its_dir_and_a_used_one_is_refused_with_an_exit(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    first = RefuseUsedSweepDir()
    first.on_multirun_start(sweep_config(sweep))  # a new sweep dir: created and locked
    with pytest.raises(SystemExit) as e:  # not an exception: Hydra 1.3 would turn it into a warning
        RefuseUsedSweepDir().on_multirun_start(sweep_config(sweep, resume=True))
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: {sweep} is in use by a live sweep (pid {os.getpid()}" in err
    first.on_multirun_end(sweep_config(sweep))
    assert not sweep.exists()  # a new sweep dir in which no job took a step: removed with the lock
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("keep")
    with pytest.raises(SystemExit):
        RefuseUsedSweepDir().on_multirun_start(sweep_config(sweep))
    err = capsys.readouterr().err
    assert f"error: {sweep} already holds a sweep (multirun.yaml)" in err and "another hydra.sweep.dir" in err
    assert sorted(p.name for p in sweep.iterdir()) == ["multirun.yaml"]  # refused, lock file gone
    resumed = RefuseUsedSweepDir()
    resumed.on_multirun_start(sweep_config(sweep, resume=True))  # resume=true continues its jobs
    resumed.on_multirun_end(sweep_config(sweep, resume=True))


def test_a_new_sweep_dir_is_kept_once_a_job_has_taken_a_step_and_removed_when_none_has(tmp_path):
    for started in (True, False):
        sweep = tmp_path / f"sweep-{started}"
        callback = RefuseUsedSweepDir()
        callback.on_multirun_start(sweep_config(sweep))
        (sweep / "multirun.yaml").write_text("hydra's")
        (sweep / "0").mkdir()  # a job put back by run/run_folder.py, and one that trained
        if started:
            (sweep / "1").mkdir()
            (sweep / "1" / "run.json").write_text("{}")
        callback.on_multirun_end(sweep_config(sweep))
        if started:
            assert sorted(p.name for p in sweep.iterdir()) == ["0", "1", "multirun.yaml"]
        else:
            assert not sweep.exists()
