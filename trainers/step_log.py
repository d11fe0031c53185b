"""One optimizer step's metrics, logged in one piece.

Lightning's `self.log` costs about 0.3 ms a key on a CPU (each key is a `_ResultMetric` moved to the
device and walked by `apply_to_collection` on every call): the ~50 keys of a GRPO step (loss, KL,
ratio statistics, ESS, the staleness histogram, per-slice diagnostics) were 13 ms of a 100 ms step.
So a step's metrics are turned into floats with one host sync, put where `self.log` puts them
(`trainer.callback_metrics`, `logged_metrics`, `progress_bar_metrics`: Lightning's logger connector's
dicts, in every Lightning 2.x) and sent to the loggers once, as Lightning sends its own rows: every
`trainer.log_every_n_steps` steps (and on the stop), at Lightning's step count for training rows,
with the `epoch` column.
"""
from __future__ import annotations

import torch


def to_floats(metrics: dict) -> dict[str, float]:
    """Scalars (tensors or numbers) as Python floats, the tensors read in one host sync."""
    tensors = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in metrics.items() if k not in tensors}
    if tensors:
        values = torch.stack([metrics[k].detach().float().reshape(()) for k in tensors]).tolist()
        out |= dict(zip(tensors, values))
    return {k: out[k] for k in metrics}  # the caller's order (the CSV's columns)


def emit(module, metrics: dict, prog_bar: tuple[str, ...] = ()) -> dict[str, float]:
    """Log one step's `metrics` (name → scalar) from `module`'s training step, as `self.log` would have:
    into `trainer.callback_metrics` (what callbacks and summary.json read), `trainer.logged_metrics`,
    `trainer.progress_bar_metrics` for the `prog_bar` keys, and a row to every logger. Returns the floats."""
    floats = to_floats(metrics)
    trainer = module._trainer
    if trainer is None:
        return floats
    connector = trainer._logger_connector
    if not all(hasattr(connector, a) for a in ("_callback_metrics", "_logged_metrics", "_progress_bar_metrics")):
        module.log_dict(floats)  # a Lightning without these dicts: the slow path, same result
        return floats
    tensors = {k: torch.tensor(v) for k, v in floats.items()}
    connector._callback_metrics.update(tensors)
    connector._logged_metrics.update(tensors)
    connector._progress_bar_metrics.update({k: floats[k] for k in prog_bar if k in floats})  # floats, as Lightning's
    if not trainer.is_global_zero or not trainer.loggers or not trainer.log_every_n_steps:
        return floats
    step = trainer.fit_loop.epoch_loop._batches_that_stepped  # the step of Lightning's training rows
    if (step + 1) % trainer.log_every_n_steps == 0 or trainer.should_stop:
        for logger in trainer.loggers:
            logger.log_metrics(floats | {"epoch": float(trainer.current_epoch)}, step=step)
    return floats
