"""callbacks/progress.py: one bar per stage in optimizer steps (not one per epoch), short metric names."""
from __future__ import annotations

import warnings

import lightning as L
import torch
from torch.utils.data import DataLoader

from callbacks.progress import StageProgressBar, quiet_known_warnings


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).pow(2).mean()
        self.log("train/loss", loss, prog_bar=True)
        self.log("rollout/reward_mean", 0.5, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(torch.randn(3, 2), batch_size=1)  # 3 steps an epoch ("round")


class Watch(L.Callback):
    """What the bar showed at each epoch's start and end."""

    def __init__(self):
        self.seen = []

    def on_train_epoch_start(self, trainer, pl_module):
        bar = trainer.progress_bar_callback.train_progress_bar
        self.seen.append(("start", bar.n, bar.total, bar.desc))

    def on_train_epoch_end(self, trainer, pl_module):
        bar = trainer.progress_bar_callback
        self.seen.append(("end", bar.train_progress_bar.n, bar.get_metrics(trainer, pl_module)))


def fit(bar, max_steps=7):
    watch = Watch()
    trainer = L.Trainer(max_steps=max_steps, callbacks=[bar, watch], logger=False, enable_checkpointing=False,
                        enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(Tiny())
    return trainer, watch.seen


def test_one_bar_over_the_stage_in_optimizer_steps(capsys):
    bar = StageProgressBar(refresh_rate=1, stage="grpo")
    trainer, seen = fit(bar)
    starts = [s for s in seen if s[0] == "start"]
    assert [s[1] for s in starts] == [0, 3, 6]  # never reset to 0 at a new epoch
    assert {s[2] for s in starts} == {7}  # the stage's max_steps, not the epoch's batches
    assert starts[-1][3].startswith("grpo epoch 3")
    ends = [s for s in seen if s[0] == "end"]
    assert ends[-1][1] == trainer.global_step == 7
    assert set(ends[-1][2]) == {"loss", "reward"}  # short names, no v_num
    assert "7/7" in capsys.readouterr().out


def test_refresh_rate_zero_shows_no_bar(capsys):
    bar = StageProgressBar(refresh_rate=0, stage="sft")
    fit(bar, max_steps=4)
    assert not bar.is_enabled
    assert "sft" not in capsys.readouterr().out


def test_known_warnings_of_the_projects_own_doing_are_silenced():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_known_warnings()
        warnings.warn("Found 20 module(s) in eval mode at the start of training. This may lead to ...")
        warnings.warn("You have overridden `transfer_batch_to_device` in `LightningModule` but have passed in a"
                      " `LightningDataModule`. It will use the implementation from `LightningModule` instance.")
        warnings.warn("Checkpoint directory /run/checkpoints/grpo exists and is not empty.")
        warnings.warn("something the user must see")
    assert [str(w.message) for w in caught] == ["something the user must see"]
