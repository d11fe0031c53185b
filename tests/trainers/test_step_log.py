"""trainers/step_log.emit: one step's metrics where self.log would put them, and one logger row."""
from types import SimpleNamespace

import torch

from trainers import step_log


class Logger:
    def __init__(self):
        self.rows = []

    def log_metrics(self, metrics, step):
        self.rows.append((step, metrics))


def test_emit_fills_lightnings_dicts_and_writes_one_row():
    connector = SimpleNamespace(_callback_metrics={}, _logged_metrics={}, _progress_bar_metrics={})
    logger = Logger()
    trainer = SimpleNamespace(_logger_connector=connector, is_global_zero=True, loggers=[logger],
                              log_every_n_steps=1, should_stop=False, current_epoch=2,
                              fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=7)))
    module = SimpleNamespace(_trainer=trainer)
    floats = step_log.emit(module, {"train/loss": torch.tensor(0.5), "train/kl": 0.25}, prog_bar=("train/loss",))
    assert floats == {"train/loss": 0.5, "train/kl": 0.25}
    assert float(connector._callback_metrics["train/kl"]) == 0.25
    assert connector._progress_bar_metrics == {"train/loss": 0.5}  # floats: the bar prints them plainly
    assert type(connector._progress_bar_metrics["train/loss"]) is float
    assert logger.rows == [(7, {"train/loss": 0.5, "train/kl": 0.25, "epoch": 2.0})]
