"""Run folders and resume through `python train.py`, as a user runs it (subprocesses, ~10 s each): a
refused run changes nothing in the folder it was refused from; SIGTERM writes a checkpoint, and
`resume=true hydra.run.dir=DIR` alone finishes the run with its own settings, continuing the CSV metrics
of the stopped attempt."""
from __future__ import annotations

import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from tests.test_train_e2e import ROOT, SMALL, train


def digests(out: Path) -> dict[str, str]:
    """sha256 of every file under `out` (symlinks by their target name), hidden ones included."""
    return {str(p.relative_to(out)): (f"-> {os.readlink(p)}" if p.is_symlink() else
                                      hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(out.rglob("*")) if p.is_file() or p.is_symlink()}


def test_a_refused_run_leaves_every_file_of_the_first_byte_identical(tmp_path):
    out = tmp_path / "run"
    first = train(*SMALL, "logger=csv", f"hydra.run.dir={out}")
    assert first.returncode == 0, first.stderr[-3000:]
    before = digests(out)
    assert ".hydra/config.yaml" in before and ".hydra/overrides.yaml" in before and "run.json" in before
    second = train(*SMALL, "logger=csv", "seed=7", "trainer.max_steps=5", f"hydra.run.dir={out}")
    assert second.returncode != 0
    err = second.stdout + second.stderr
    assert f"{out} already holds a run (summary.json)" in err and f"resume=true hydra.run.dir={out}" in err, err[-2000:]
    assert digests(out) == before  # .hydra/ included: Hydra no longer rewrites it before train.py runs


def start_train(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_PORT", "MASTER_ADDR", "LOCAL_RANK", "RANK",
                                                              "WORLD_SIZE", "WANDB_API_KEY")}
    env |= {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([sys.executable, "train.py", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"the run ended before {path} appeared:\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, f"{path} did not appear in {timeout} s"
        time.sleep(0.02)


def test_sigterm_checkpoints_and_resume_alone_finishes_the_run(tmp_path):
    """One GRPO stage of 30 steps (1 a round); SIGTERM once the first round-end checkpoint exists. The
    run writes last.ckpt at the step it stopped and exits 143; `resume=true hydra.run.dir=DIR` alone then
    continues with the recorded settings (30 steps, csv logger) in the same metrics.csv: the stopped
    attempt's rows up to its checkpoint, then the resumed part's."""
    out = tmp_path / "run"
    args = [*SMALL, "algorithm=grpo", "trainer.max_steps=30", "logger=csv", "checkpoint_every_n_rounds=1",
            f"hydra.run.dir={out}"]
    proc = start_train(*args)
    wait_for(out / "checkpoints" / "grpo" / "epoch=0-step=1.ckpt", proc)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "stopped by SIGTERM at step" in output and f"resume=true hydra.run.dir={out}" in output, output[-3000:]
    last = out / "checkpoints" / "grpo" / "last.ckpt"
    state = torch.load(last, weights_only=True, map_location="cpu")
    step, rows = state["global_step"], state["callbacks"]["ResumeState"]["log_rows"]
    assert f"stopped by SIGTERM at step {step}; checkpoint written to {last}" in output
    assert 1 <= step < 30 and not (out / "summary.json").exists()
    stopped = filled_rows(out / "csv" / "grpo" / "metrics.csv")
    assert len(stopped) == rows > 0

    resumed = train("resume=true", f"hydra.run.dir={out}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "(resuming from" in resumed.stdout and "before the stage (from the checkpoint)" in resumed.stdout
    summary = json.loads((out / "summary.json").read_text())["grpo"]
    assert summary["train/steps"] == 30 and summary["rollout/rounds"] == 30  # the run's own max_steps
    continued = filled_rows(out / "csv" / "grpo" / "metrics.csv")
    assert continued[:rows] == stopped and len(continued) > rows
    assert max(int(r["step"]) for r in continued) == 30 and sorted(p.name for p in (out / "csv").iterdir()) == ["grpo"]
    record = json.loads((out / "run.json").read_text())
    assert record["resumes"] == [{"started": record["resumes"][0]["started"],
                                  "overrides": ["resume=true"], "changes": []}]


def filled_rows(path: Path) -> list[dict]:
    """A metrics.csv's rows, their empty cells left out (a later header may add columns)."""
    with path.open(newline="") as f:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def test_a_run_that_fails_before_its_first_step_leaves_no_trace_and_the_corrected_command_runs_there(tmp_path):
    """AdamW refuses betas ≥ 1 only when the optimizer is built, after the model, the loggers and the
    folder: a failure no config check catches. The folder is left as it was found (absent), so the
    corrected command runs there as a new run, with nothing of the bad value in its record."""
    out = tmp_path / "run"
    args = [*SMALL, "algorithm=grpo", "logger=csv", f"hydra.run.dir={out}"]
    bad = train(*args, "+algorithm.optimizer.betas=[1.5,0.999]")
    assert bad.returncode == 1 and "Invalid beta parameter at index 0: 1.5" in bad.stderr, bad.stderr[-2000:]
    assert not out.exists(), sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    good = train(*args)
    assert good.returncode == 0, good.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["grpo"]["train/steps"] == 4
    assert "betas" not in (out / ".hydra" / "overrides.yaml").read_text()
    assert not (out / ".owner.lock").exists()


def test_a_live_run_owns_its_folder_and_a_resume_or_a_new_run_is_refused_naming_its_pid(tmp_path):
    out = tmp_path / "run"
    proc = start_train(*SMALL, "algorithm=grpo", "trainer.max_steps=400", "logger=csv",
                       "checkpoint_every_n_rounds=1", f"hydra.run.dir={out}")
    try:
        wait_for(out / "checkpoints" / "grpo" / "epoch=0-step=1.ckpt", proc)
        for extra in (["resume=true"], [*SMALL, "algorithm=grpo"]):
            refused = train(*extra, f"hydra.run.dir={out}")
            assert proc.poll() is None, "the live run ended before the check: the refusal proves nothing"
            assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
            assert f"error: {out} is in use by a live run (pid {proc.pid} on " in refused.stderr, refused.stderr[-2000:]
            assert f"kill {proc.pid}" in refused.stderr and "already holds a run" not in refused.stderr
        assert json.loads((out / "run.json").read_text())["resumes"] == []  # the refused resume left no entry
    finally:
        proc.kill()
        proc.communicate(timeout=60)


def test_a_sweep_into_a_used_sweep_dir_is_refused_before_hydra_writes_anything(tmp_path):
    """Hydra 1.3 turns a callback's exception into a warning and carries on: the refusal must end the
    process itself, before the sweeper rewrites multirun.yaml or makes a job's folder."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("keep")
    proc = train("-m", "seed=1,2", "print_config=true", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"error: {sweep} already holds a sweep (multirun.yaml), which this sweep would overwrite; choose another "
        f"hydra.sweep.dir, or resume=true hydra.sweep.dir={sweep} to continue its jobs"]
    assert sorted(p.name for p in sweep.iterdir()) == ["multirun.yaml"]
    assert (sweep / "multirun.yaml").read_text() == "keep"
