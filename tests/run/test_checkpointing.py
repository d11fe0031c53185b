"""Checkpoints that survive a kill or a full disk, RNG states and signals (run/checkpointing.py),
in-process with a real Lightning Trainer on Lightning's BoringModel (seconds)."""
from __future__ import annotations

import errno
import hashlib
import os
import random
import signal
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
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 2


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
