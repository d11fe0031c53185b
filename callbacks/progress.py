"""One progress bar per stage, in optimizer steps: `sft round 3: 40%|████ | 1200/3000 [02:10<03:15, ...]`.

Lightning's TQDMProgressBar starts a new bar every epoch, and one epoch is one round here (a few steps),
so it showed neither the stage's progress nor a time estimate. This bar counts optimizer steps
(`trainer.global_step`) up to `trainer.max_steps` over the whole stage, resumes at the checkpoint's
step (the ETA from the steps this process made), and shows the metrics logged with prog_bar=True
(loss, reward, KL) under short names. `refresh_rate=0` turns it off.

Warnings silenced here, at import (the progress node is built before the Trainer), each because it
reports what the project does on purpose:
- "Found N module(s) in eval mode at the start of training": the frozen reference policy (and other
  frozen models) stay in eval mode for the whole stage, by design (trainers/base.py frozen_copy);
- "You have overridden `transfer_batch_to_device` ... but have passed in a `LightningDataModule`":
  trainers/base.py moves ExperienceBatch itself, whatever data module serves it;
- "Checkpoint directory ... exists and is not empty": a resumed stage saves beside the checkpoint it
  resumed from (a new run refuses a folder that holds one, run/run_record.py);
- Lightning's "`isinstance(treespec, LeafSpec)` is deprecated" (its own code calls the old torch API).

Lightning's informational lines that say nothing a user can act on are dropped too (`QuietLightning`):
"GPU available: ...", "TPU available: ...", "HPU available: ...", its "💡 Tip" advert for its cloud
logger, and "`Trainer.fit` stopped: `max_steps=N` reached" (the stage's own lines say where it stopped);
its other lines and every warning stay. transformers' progress bars ("Writing model shards") go as well:
the run prints what it wrote.
"""
from __future__ import annotations

import logging
import warnings

from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import _update_n


def quiet_known_warnings() -> None:
    """Ignore the warnings the module docstring names (by their messages; all others stay)."""
    warnings.filterwarnings("ignore", message=r"Found \d+ module\(s\) in eval mode at the start of training")
    warnings.filterwarnings("ignore", message=r"You have overridden `transfer_batch_to_device` in `LightningModule`")
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")
    quiet = QuietLightning()
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        target = logging.getLogger(name)
        if not any(isinstance(f, QuietLightning) for f in target.filters):
            target.addFilter(quiet)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()


class QuietLightning(logging.Filter):
    """Drops Lightning's info lines the module docstring names; every other record passes."""
    NOISE = ("GPU available:", "TPU available:", "HPU available:", "💡 Tip", "`Trainer.fit` stopped:")

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno <= logging.INFO and str(record.msg).startswith(self.NOISE))


quiet_known_warnings()


class StageProgressBar(TQDMProgressBar):
    def __init__(self, refresh_rate: int = 1, stage: str | None = None, process_position: int = 0):
        super().__init__(refresh_rate=refresh_rate, process_position=process_position)
        self.stage = stage

    @property
    def train_description(self) -> str:
        return self.stage or "train"

    def on_train_start(self, trainer, pl_module):
        bar = self.init_train_tqdm()
        bar.reset(total=trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None)
        bar.initial = bar.n = trainer.global_step  # a resumed stage: its step, and an ETA from here on
        self.train_progress_bar = bar

    def on_train_epoch_start(self, trainer, *_):
        online = getattr(trainer.datamodule, "online", False)
        unit = "round" if online else "epoch"
        self.train_progress_bar.set_description(f"{self.train_description} {unit} {trainer.current_epoch + 1}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        bar, n = self.train_progress_bar, trainer.global_step
        if self._should_update(n, bar.total):
            _update_n(bar, n)
            bar.set_postfix(self.get_metrics(trainer, pl_module))

    def on_train_epoch_end(self, trainer, pl_module):
        bar = self.train_progress_bar
        if not bar.disable:
            bar.n = trainer.global_step
            bar.set_postfix(self.get_metrics(trainer, pl_module))

    def get_metrics(self, trainer, pl_module) -> dict:
        """The prog_bar metrics under short names (train/loss → loss, rollout/reward_mean → reward);
        no `v_num` (the logger's version)."""
        metrics = dict(trainer.progress_bar_metrics)
        short = {k: k.rsplit("/", 1)[-1].removesuffix("_mean") for k in metrics}
        if len(set(short.values())) < len(short):  # two would read the same: keep the full names
            return metrics
        return {short[k]: v for k, v in metrics.items()}
