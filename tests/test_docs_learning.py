"""The documented commands that promise learning show it when pasted (`-m slow`: minutes each on a CPU).

Each entry of PROMISES is a command exactly as README.md or a docs page shows it (tests/test_docs.py checks
that every documented command plans; this file checks what the learning ones promise), run through train.py
as a subprocess with only the output folder, the logger and the progress bar added, and its promise read
back from summary.json."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.documented_commands import ROOT, commands

QUIET = ["logger=none", "callbacks.progress.refresh_rate=0"]


def _gain(stage: str, before: str = "val/accuracy_before", after: str = "val/accuracy_after",
          at_least: float = 0.0) -> Callable:
    def check(summary: dict) -> tuple[bool, str]:
        s = summary[stage]
        return s[after] > s[before] and s[after] >= at_least, f"{stage}: {before} {s[before]} → {after} {s[after]}"
    return check


def _over_previous(stage: str, previous: str) -> Callable:
    """The stage ends above where the previous stage left the policy (RL lifts the SFT policy)."""
    def check(summary: dict) -> tuple[bool, str]:
        start, end = summary[previous]["val/accuracy_after"], summary[stage]["val/accuracy_after"]
        return end > start, f"{previous} ended {start}, {stage} ended {end}"
    return check


PROMISES: dict[str, Callable] = {  # the command as shown (continuations joined) → what it promises
    "python train.py experiment=short_sft_grpo": _over_previous("grpo", "sft"),
    "python train.py experiment=sft_then_dpo": _gain("dpo", "val/pref_accuracy_before", "val/pref_accuracy_after"),
    "python train.py experiment=tool_use": _gain("grpo"),
    "python train.py algorithm=sft trainer.max_steps=1500 hydra.run.dir=runs/sft": _gain("sft", at_least=0.8),  # "0 → ~0.9"
}


def test_every_promise_is_a_documented_command():
    shown = {c.text for c in commands()}
    assert [p for p in PROMISES if p not in shown] == [], "a command here is no longer in README.md or docs/"


@pytest.mark.slow
@pytest.mark.parametrize("command", list(PROMISES))
def test_a_documented_command_shows_what_it_promises(command, tmp_path):
    args = [a for a in command.split()[2:] if not a.startswith("hydra.run.dir=")]
    env = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "train.py", *args, *QUIET, f"hydra.run.dir={tmp_path}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ok, what = PROMISES[command](json.loads((tmp_path / "summary.json").read_text()))
    assert ok, f"`{command}` does not show what its page promises: {what}"


def test_promise_checks_read_summary_json():
    summary = {"sft": {"val/accuracy_before": 0.0, "val/accuracy_after": 0.6},
               "grpo": {"val/accuracy_before": 0.6, "val/accuracy_after": 0.58}}
    assert _gain("sft")(summary)[0] and not _over_previous("grpo", "sft")(summary)[0]
    assert Path(ROOT / "train.py").is_file()
