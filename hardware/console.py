"""Console lines from any layer, printed once whatever the number of ranks: `say0` from plain code,
`say` from inside a fit (above the progress bar, without breaking it)."""
from __future__ import annotations

import sys

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from tqdm import tqdm

from hardware import distributed


def say0(message: str) -> None:
    """print on rank 0 only (every line once, whatever the number of ranks)."""
    if distributed.is_zero():
        print(message, flush=True)


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
