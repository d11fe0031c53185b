"""Log from any hook (Lightning forbids self.log in on_fit_start/on_train_end): straight to the loggers."""
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


def say(trainer: L.Trainer, message: str) -> None:
    """Print a line on rank 0 without breaking the progress bar."""
    if not trainer.is_global_zero:
        return
    bar = trainer.progress_bar_callback
    if bar is not None and getattr(bar, "is_enabled", False) and hasattr(bar, "print"):
        bar.print(message)
    else:
        print(message, flush=True)
