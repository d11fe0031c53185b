"""Non-finite losses and gradients: the optimizer step is skipped and counted (the weights do not move);
past algorithm.max_nonfinite the run stops with a checkpoint of the weights before the first bad step
and a message naming that step."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.data_modules.test_replay_mix import build_parts, stage_cfg
from trainers.base import NonFiniteLossError


def fit_with(tmp_path, poison):
    stage = stage_cfg(tmp_path, ["algorithm.max_nonfinite=2", "data.replay_ratio=0", "data.batch_size=16",
                                 "algorithm.epochs_per_round=1"])
    trainer, module, dm, _ = build_parts(stage, 10)
    policy = module.policy
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    poison(module)
    with pytest.raises(NonFiniteLossError) as err:
        trainer.fit(module, datamodule=dm)
    after = policy.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())  # no bad step was applied
    assert trainer.global_step == 0 and module.nonfinite == 3
    message = str(err.value)
    saved = message.rsplit("are in ", 1)[1]
    assert saved.endswith("nonfinite.ckpt") and Path(saved).is_file()
    return message


def test_nan_gradients_skip_the_step_and_stop_past_the_limit(tmp_path):
    def poison(module):
        param = next(module.policy.parameters())
        param.register_hook(lambda grad: grad * float("nan"))
    message = fit_with(tmp_path, poison)
    assert "first was a non-finite gradient at step 0" in message and "max_nonfinite=2" in message


def test_nan_losses_skip_the_step_and_stop_past_the_limit(tmp_path):
    def poison(module):
        real = module.micro_loss
        module.micro_loss = lambda batch: (lambda loss, m: (loss * float("nan"), m))(*real(batch))
    message = fit_with(tmp_path, poison)
    assert "first was a non-finite loss at step 0" in message and "nonfinite.ckpt" in message
