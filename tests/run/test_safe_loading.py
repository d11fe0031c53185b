"""Every file a resume reads is loaded with the safe loader: a pickle payload planted in a run folder's
final.ckpt or last.ckpt is refused in one line naming the file, and never runs (through `train.py
resume=true`, as a user resumes a run folder from shared storage or a download)."""
from __future__ import annotations

import builtins
import json
import shutil

import pytest
import torch

from tests.test_train_e2e import SMALL, train


class Payload:
    """Unpickling it calls open(marker, "w"): the file appears if any loader runs pickled code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (builtins.open, (self.marker, "w"))


def plant(path, marker) -> None:
    """Replace checkpoint `path` with one that carries the payload beside real-looking keys."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    state["callbacks"] = {"payload": Payload(marker)}
    path.unlink()  # last.ckpt is a link: replace the link, not the file it points to
    torch.save(state, path)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A two-stage run (SFT → GRPO) with a checkpoint every round."""
    out = tmp_path_factory.mktemp("safe") / "run"
    done = train(*SMALL, "logger=none", "checkpoint_every_n_rounds=1", f"hydra.run.dir={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def resume_refused(out, planted, marker) -> str:
    resumed = train("resume=true", f"hydra.run.dir={out}")
    assert not marker.exists(), "the planted pickle ran"
    assert resumed.returncode == 1, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    lines = [line for line in resumed.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(f"error: resume: {planted} holds a pickled object"), lines
    assert "io.open" in lines[0] and "Traceback" not in resumed.stderr
    return lines[0]


def test_a_finished_stages_final_ckpt_with_a_payload_is_refused_naming_it(finished_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out, symlinks=True)
    summary = json.loads((out / "summary.json").read_text())
    (out / "summary.json").write_text(json.dumps({"sft": summary["sft"]}))  # GRPO to run: SFT's weights are read
    planted, marker = out / "checkpoints" / "sft" / "final.ckpt", tmp_path / "marker"
    plant(planted, marker)
    resume_refused(out, planted, marker)


def test_a_resume_checkpoint_with_a_payload_is_refused_naming_it(finished_run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out, symlinks=True)
    summary = json.loads((out / "summary.json").read_text())
    (out / "summary.json").write_text(json.dumps({"sft": summary["sft"]}))
    planted, marker = out / "checkpoints" / "grpo" / "last.ckpt", tmp_path / "marker"
    plant(planted, marker)
    resume_refused(out, planted, marker)
