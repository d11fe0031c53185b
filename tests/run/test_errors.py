"""A reward that raises (or hangs: a timeout drops the sample the same way) on every sample stops the run
with one line and, when a checkpoint was written, the command that continues it: no Hydra traceback
(issue 31, item 16). Two real `python train.py` runs (≈8 s each) and the pieces in-process."""
from __future__ import annotations

import os
import subprocess
import sys

from callbacks.regenerate import DroppedRoundsError
from run.errors import format_error, resume_line, user_error
from tests.bad_inputs import ROOT
from tests.helpers import TINY

SMALL = ["algorithm=grpo", "reward=function", "data.prompts_per_round=4", "algorithm.group_size=4",
         "data.batch_size=16", "generator.max_new_tokens=4", "callbacks.evaluate.every_n_steps=0",
         "trainer.max_steps=10"] + TINY
CALLS = [0]  # this process's reward calls (each train.py run is a fresh process)


def down_after_first_round(prompts, completions, examples):
    """Scores the first round, then raises on every call, as a reward server that went down would."""
    CALLS[0] += 1
    if CALLS[0] > 1:
        raise RuntimeError("reward server down")
    return [(sum(map(ord, c)) % 10) / 10 for c in completions]


def always_down(prompts, completions, examples):
    raise RuntimeError("reward server down")


def train(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "WANDB_API_KEY")}
    env |= {"WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "train.py", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def error_lines(stderr: str) -> list[str]:
    """stderr from the first `error:` line on (Lightning's start-up lines come before it)."""
    lines = stderr.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("error: ")), len(lines))
    return lines[first:]


def test_a_reward_that_goes_down_stops_with_one_line_and_the_resume_command(tmp_path):
    """Round 1 is scored; rounds 2-4 drop every sample; the third such round stops the run at step 3 with
    last.ckpt written. Before: the error line, then ~40 lines of traceback and Hydra's 'Error executing job'."""
    out = tmp_path / "run"
    proc = train(*SMALL, f"reward.fn._target_={__name__}.down_after_first_round", f"hydra.run.dir={out}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr, proc.stderr[-3000:]
    ckpt = out / "checkpoints" / "grpo" / "last.ckpt"
    assert error_lines(proc.stderr) == [
        "error: 3 rounds in a row had every sample dropped (function: RuntimeError: reward server down); stopping "
        "(callbacks.regenerate.max_dropped_rounds=3)",
        f"[checkpoint] {ckpt} written; once the cause is fixed, continue with: python train.py resume=true "
        f"hydra.run.dir={out}"], proc.stderr[-3000:]
    assert ckpt.is_file()


def test_a_reward_down_from_the_start_stops_with_one_line(tmp_path):
    """No round is ever scored: one line, and no resume command (no step ran, no checkpoint)."""
    proc = train(*SMALL, f"reward.fn._target_={__name__}.always_down", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr, proc.stderr[-3000:]
    assert error_lines(proc.stderr) == [
        "error: round 1 has no scored sample (function: RuntimeError: reward server down) and there is no earlier "
        "round to serve again; check the reward source (reward=...) and the task"], proc.stderr[-3000:]


def test_resume_line_follows_the_checkpoint_through_a_wrapper():
    err = DroppedRoundsError("3 rounds in a row had every sample dropped")
    assert resume_line(err, "/runs/a") is None and user_error(err) is err
    err.checkpoint = "/runs/a/checkpoints/grpo/last.ckpt"
    try:
        try:
            raise err
        except DroppedRoundsError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as wrapped:
        assert user_error(wrapped) is err
        assert resume_line(wrapped, "/runs/a") == (
            "[checkpoint] /runs/a/checkpoints/grpo/last.ckpt written; once the cause is fixed, continue with: "
            "python train.py resume=true hydra.run.dir=/runs/a")
    assert format_error(err) == "error: 3 rounds in a row had every sample dropped"
