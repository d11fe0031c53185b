"""Checkpoints that survive a kill or a full disk, RNG states and signals (run/checkpointing.py),
in-process with a real Lightning Trainer on Lightning's BoringModel (seconds)."""
from __future__ import annotations

import errno
import hashlib
import os
import random
import shutil
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel

from run.checkpointing import (AtomicCheckpointIO, CheckpointWriteError, ResumeState, RunInterrupted,
                               resume_checkpoint)


def digests(folder: Path) -> dict[str, str]:
    """sha256 of every checkpoint in `folder` (the temporary file being written excluded)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file() and not p.name.startswith(".")}


def fit_with_checkpoints(folder: Path, epochs: int) -> L.Trainer:
    ckpt = ModelCheckpoint(dirpath=folder, save_last="link", save_top_k=1, every_n_epochs=1,
                           save_on_train_epoch_end=True, enable_version_counter=False)
    trainer = L.Trainer(max_epochs=epochs, limit_train_batches=2, limit_val_batches=0, logger=False,
                        callbacks=[ckpt], plugins=[AtomicCheckpointIO()], enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(BoringModel())
    return trainer


def test_a_full_disk_keeps_the_previous_checkpoint_and_names_the_file(tmp_path, monkeypatch):
    """The second round-end save hits ENOSPC halfway through writing: the error names the file and the
    cause, the first checkpoint (and last.ckpt, linking to it) is byte-identical, no temp file is left."""
    real_save, seen = torch.save, {}

    def save(obj, f, *args, **kwargs):
        if "before" not in seen and list(tmp_path.glob("epoch=*.ckpt")):
            seen["before"] = digests(tmp_path)
            f.write(b"half a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(CheckpointWriteError) as e:
        fit_with_checkpoints(tmp_path, epochs=3)
    message = str(e.value)
    assert "could not write checkpoint" in message and "epoch=1-step=4.ckpt" in message, message
    assert "No space left on device" in message and "is intact" in message and "resume=true" in message
    assert e.value.errno == errno.ENOSPC
    assert digests(tmp_path) == seen["before"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=0-step=2.ckpt", "last.ckpt"]
    assert (tmp_path / "last.ckpt").resolve().name == "epoch=0-step=2.ckpt"
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 2


def test_resume_takes_last_ckpt_or_else_the_newest_periodic_checkpoint(tmp_path):
    assert resume_checkpoint(tmp_path) is None
    for step in (2, 10, 4):
        (tmp_path / f"epoch={step}-step={step}.ckpt").write_bytes(b"x")
    assert resume_checkpoint(tmp_path).name == "epoch=10-step=10.ckpt"  # killed between unlink and relink
    (tmp_path / "last.ckpt").symlink_to("epoch=4-step=4.ckpt")
    assert resume_checkpoint(tmp_path).name == "last.ckpt"


def restarted_trainer(at_round_end: bool):
    loop = SimpleNamespace(restarted_on_epoch_end=at_round_end,
                           epoch_loop=SimpleNamespace(val_loop=SimpleNamespace(_has_run=False), restarting=True))
    return SimpleNamespace(fit_loop=loop, datamodule=None, global_step=7, num_training_batches=4)


def test_rng_states_are_checkpointed_and_restored_at_train_start():
    saved = ResumeState("last.ckpt").state_dict()
    expected = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    resumed = ResumeState("last.ckpt")
    trainer = restarted_trainer(at_round_end=False)
    resumed.on_load_checkpoint(trainer, None, {})
    resumed.load_state_dict(saved)
    torch.rand(5), random.random(), np.random.rand()  # what building the stage draws before training
    try:
        resumed.on_train_start(trainer, BoringModel())
        assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected
    finally:
        resumed.teardown(trainer, None, "fit")


def test_a_round_end_restart_reapplies_the_data_state_and_runs_no_extra_step():
    class Data:
        state = None

        def load_state_dict(self, state):
            self.state = state

    trainer = restarted_trainer(at_round_end=True)
    trainer.datamodule = Data()
    cb = ResumeState("last.ckpt")
    cb.on_load_checkpoint(trainer, None, {Data.__qualname__: {"epochs_served": 5}})  # Lightning's key
    cb.load_state_dict(cb.state_dict())
    try:
        cb.on_train_start(trainer, L.LightningModule())  # no validation_step, as every algorithm here
    finally:
        cb.teardown(trainer, None, "fit")
    assert trainer.datamodule.state == {"epochs_served": 5}
    assert trainer.fit_loop.epoch_loop.val_loop._has_run is True
    cb.on_train_epoch_end(trainer, None)  # the replayed round end clears Lightning's restart flag
    assert trainer.fit_loop.epoch_loop.restarting is False


def test_a_signal_stops_after_the_step_and_a_second_one_at_once():
    cb, trainer = ResumeState("last.ckpt"), restarted_trainer(at_round_end=False)
    previous = signal.getsignal(signal.SIGTERM)
    cb.on_train_start(trainer, BoringModel())
    try:
        assert signal.getsignal(signal.SIGTERM) == cb._on_signal
        cb._on_signal(signal.SIGTERM, None)
        cb.on_train_batch_end(trainer, None, None, None, 3)  # the round's last step: on to its end
        with pytest.raises(RunInterrupted, match="stopped by SIGTERM at step 7"):
            cb.on_train_epoch_end(trainer, None)
        with pytest.raises(RunInterrupted, match="stopped by SIGTERM at step 7"):
            cb.on_train_batch_end(trainer, None, None, None, 0)  # mid-round: after this step
        with pytest.raises(KeyboardInterrupt):
            cb._on_signal(signal.SIGINT, None)
    finally:
        cb.teardown(trainer, None, "fit")
    assert signal.getsignal(signal.SIGTERM) == previous


def test_the_last_train_metrics_travel_in_the_checkpoint():
    """summary.json's train/* values are the last logged value of each key; a resumed fit logs only
    some keys again, so the checkpoint carries the others."""
    cb = ResumeState("last.ckpt")
    cb.setup(SimpleNamespace(callback_metrics={"train/loss": torch.tensor(0.5), "val/accuracy": 1.0,
                                               "train/ess_frac/staleness_4_7": torch.tensor(0.25)}), None, "fit")
    state = cb.state_dict()
    assert state["train_metrics"] == {"train/loss": 0.5, "train/ess_frac/staleness_4_7": 0.25}
    resumed = ResumeState("last.ckpt")
    resumed.load_state_dict(state)
    assert resumed.summary() == state["train_metrics"]


WRITER_FAILURE = ("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file data/0: "
                  "file write failed")


def test_a_runtime_error_from_torchs_writer_is_named_and_leaves_no_temp_file(tmp_path, monkeypatch):
    """torch's zip writer reports a failed write as RuntimeError, not OSError: the second round-end save
    fails inside torch.save after some bytes reached the temporary file. One message naming the file,
    the temporary file removed, the first checkpoint and last.ckpt as they were."""
    real, seen = torch.serialization._save, {}

    def save(obj, zip_file, *args, **kwargs):
        if "before" not in seen and list(tmp_path.glob("epoch=*.ckpt")):
            seen["before"] = digests(tmp_path)
            zip_file.write_record("data/0", b"x" * 4096, 4096)
            raise RuntimeError(WRITER_FAILURE)
        return real(obj, zip_file, *args, **kwargs)

    monkeypatch.setattr(torch.serialization, "_save", save)
    with pytest.raises(CheckpointWriteError) as e:
        fit_with_checkpoints(tmp_path, epochs=3)
    message = str(e.value)
    assert message.startswith(f"could not write checkpoint {tmp_path / 'epoch=1-step=4.ckpt'}: "), message
    assert "PytorchStreamWriter failed writing file data/0: file write failed" in message and "is intact" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=0-step=2.ckpt", "last.ckpt"]  # no .tmp
    assert digests(tmp_path) == seen["before"]


def test_an_unrelated_runtime_error_in_torch_save_is_not_called_a_write_failure(tmp_path, monkeypatch):
    def save(obj, zip_file, *args, **kwargs):
        raise RuntimeError("a tensor could not be read")
    monkeypatch.setattr(torch.serialization, "_save", save)
    from run.checkpointing import atomic_save
    with pytest.raises(RuntimeError, match="a tensor could not be read") as e:
        atomic_save({"x": 1}, tmp_path / "a.ckpt")
    assert not isinstance(e.value, CheckpointWriteError) and list(tmp_path.iterdir()) == []


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 4 MiB tmpfs (root only; skipped where mount is not allowed)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({(done.stderr or done.stdout).strip() or done.returncode})")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


class WideModel(BoringModel):
    """A checkpoint of about 0.5 MB: larger than a file's write buffer, so the disk fills inside torch's
    zip writer (a RuntimeError), not at the final flush (an OSError)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(32, 4096)


class FillTheDisk(L.Callback):
    """After the first round-end checkpoint: fill the disk holding `folder`, leaving 200 kB free."""

    def __init__(self, folder: Path):
        self.folder = folder

    def on_train_epoch_start(self, trainer, pl_module):
        if trainer.current_epoch == 1:
            free = shutil.disk_usage(self.folder).free
            (self.folder.parent / "filler").write_bytes(b"\0" * (free - 200_000))


def test_a_real_full_disk_names_the_file_keeps_the_previous_checkpoint_and_resumes(tiny_tmpfs):
    folder = tiny_tmpfs / "ckpt"
    ckpt = ModelCheckpoint(dirpath=folder, save_last="link", save_top_k=1, every_n_epochs=1,
                           save_on_train_epoch_end=True, enable_version_counter=False)
    trainer = L.Trainer(max_epochs=3, limit_train_batches=2, limit_val_batches=0, logger=False,
                        callbacks=[ckpt, FillTheDisk(folder)], plugins=[AtomicCheckpointIO()],
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    with pytest.raises(CheckpointWriteError) as e:
        trainer.fit(WideModel())
    message = str(e.value)
    print(f"\n[full disk] torch raised {type(e.value.__cause__).__name__}: {e.value.__cause__}\n[full disk] {message}")
    assert isinstance(e.value.__cause__, RuntimeError)  # what torch's writer raises: the case OSError missed
    assert f"could not write checkpoint {folder / 'epoch=1-step=4.ckpt'}: No space left on device" in message
    assert "free some disk space and resume with resume=true" in message and e.value.errno == errno.ENOSPC
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=0-step=2.ckpt", "last.ckpt"]  # no .tmp left
    (tiny_tmpfs / "filler").unlink()
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 2
    resumed = L.Trainer(max_epochs=3, limit_train_batches=2, limit_val_batches=0, logger=False,
                        plugins=[AtomicCheckpointIO()], enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, default_root_dir=tiny_tmpfs)
    resumed.fit(WideModel(), ckpt_path=folder / "last.ckpt")
    assert resumed.global_step == 6


class FailAtStep(L.Callback):
    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise ValueError(f"a bug at step {self.step}")


@pytest.mark.parametrize("fail_at", [3, 0])
def test_an_error_after_the_first_step_writes_last_ckpt_first(tmp_path, fail_at):
    """An error after an optimizer step keeps the work in last.ckpt (at the step it stopped); before the
    first step (here: a failing first step) there is nothing to keep and nothing is written."""
    trainer = L.Trainer(max_epochs=5, limit_train_batches=2, limit_val_batches=0, logger=False,
                        callbacks=[FailAtStep(fail_at), ResumeState(tmp_path / "last.ckpt")],
                        plugins=[AtomicCheckpointIO()], enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    model = BoringModel()
    if fail_at == 0:
        model.training_step = lambda batch, batch_idx: (_ for _ in ()).throw(ValueError("a bug at step 0"))
    with pytest.raises(ValueError, match=f"a bug at step {fail_at}"):
        trainer.fit(model)
    if fail_at == 0:
        assert list(tmp_path.iterdir()) == []
    else:
        assert torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == fail_at
