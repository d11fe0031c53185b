"""Console lines from any layer, printed once whatever the number of ranks: `say0` from plain code,
`say` from inside a fit (above the progress bar, without breaking it). Each line also goes to the run's
log file (Hydra's `<run>/train.log`, its job-logging FileHandler), so the folder keeps the run's story."""
from __future__ import annotations

import logging
import sys

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from tqdm import tqdm

from hardware import distributed


def to_log_file(message: str) -> None:
    """`message` into the log files of the root logger's file handlers (Hydra's train.log) only, not to
    the console again; looked up each call, as Hydra sets up logging anew for each job of a sweep."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            for line in message.strip("\n").splitlines():
                handler.handle(logging.LogRecord("policyshift", logging.INFO, __file__, 0, line, None, None))


def say0(message: str) -> None:
    """print on rank 0 only (every line once, whatever the number of ranks)."""
    if distributed.is_zero():
        print(message, flush=True)
        to_log_file(message)


def say(trainer: L.Trainer, message: str) -> None:
    """Print a line on rank 0 without breaking the progress bar. TQDMProgressBar.print drops the line
    while no bar is open (at fit start, before the first epoch): tqdm.write prints it above open bars,
    or as a plain line when there are none."""
    if not trainer.is_global_zero:
        return
    to_log_file(message)
    bar = trainer.progress_bar_callback
    if isinstance(bar, TQDMProgressBar) and bar.is_enabled:
        tqdm.write(message, file=sys.stdout)
        sys.stdout.flush()
    elif bar is not None and getattr(bar, "is_enabled", False) and hasattr(bar, "print"):
        bar.print(message)
    else:
        print(message, flush=True)
