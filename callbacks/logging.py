"""Log from any hook (Lightning forbids self.log in on_fit_start/on_train_end): straight to the loggers."""
from __future__ import annotations

import sys

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from tqdm import tqdm


def log_now(trainer: L.Trainer, metrics: dict[str, float]) -> None:
    """Send scalar metrics to every logger at the current global step, from rank 0 only."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)


def find_callback(trainer: L.Trainer, name: str):
    """The trainer's callback of class `name` (by name: callbacks read each other without importing), or None."""
    return next((cb for cb in trainer.callbacks if type(cb).__name__ == name), None)


def say(trainer: L.Trainer, message: str) -> None:
    """Print a line on rank 0 without breaking the progress bar. TQDMProgressBar.print drops the line
    while no bar is open (at fit start, before the first epoch): tqdm.write prints it above open bars,
    or as a plain line when there are none."""
    if not trainer.is_global_zero:
        return
    bar = trainer.progress_bar_callback
    if isinstance(bar, TQDMProgressBar) and bar.is_enabled:
        tqdm.write(message, file=sys.stdout)
        sys.stdout.flush()
    elif bar is not None and getattr(bar, "is_enabled", False) and hasattr(bar, "print"):
        bar.print(message)
    else:
        print(message, flush=True)
