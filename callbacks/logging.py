"""Log from any hook (Lightning forbids self.log in on_fit_start/on_train_end): straight to the loggers.
Console lines (rank 0, above the progress bar): hardware/console.py."""
from __future__ import annotations

import lightning as L


def log_now(trainer: L.Trainer, metrics: dict[str, float]) -> None:
    """Send scalar metrics to every logger at the current global step, from rank 0 only."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)


def find_callback(trainer: L.Trainer, name: str):
    """The trainer's callback of class `name` (by name: callbacks read each other without importing), or None."""
    return next((cb for cb in trainer.callbacks if type(cb).__name__ == name), None)
