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


def test_kl_to_the_reference_ignores_extreme_logprobs_off_the_completion_mask():
    """A policy can put the pad after a stop id at log-prob -157 (found on the BPE chat model); off the
    mask the reference log-probs are a 0 fill, so k3's exp(-d) = exp(157) overflowed and inf · 0 made the
    loss NaN. Off the mask the KL is now 0; on it, k3 as before; loss and gradient finite."""
    from types import SimpleNamespace

    from losses.correction import no_correction
    from losses.kl import k3
    from trainers.rollout import RolloutModule

    mask = torch.tensor([[1.0, 1.0, 0.0]])
    logp = torch.tensor([[-0.5, -1.0, -157.0]], requires_grad=True)
    batch = SimpleNamespace(completion_mask=mask, behaviour_logprobs=torch.tensor([[-0.5, -1.0, 0.0]]),
                            ref_logprobs=torch.tensor([[-0.7, -1.0, 0.0]]))
    module = SimpleNamespace(correction=no_correction, use_reference=True, kl_fn=k3, beta=0.1, _step_advs=[])
    per_token, metrics = RolloutModule.policy_loss(module, batch, logp, torch.tensor([1.0]))
    loss = (per_token * mask).sum()
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all() and logp.grad[0, 2] == 0
    assert metrics["kl"] == pytest.approx(k3(torch.tensor([-0.5, -1.0]), torch.tensor([-0.7, -1.0])).mean().item())
