"""SFT's held-out loss (callbacks/heldout_loss.py, SFTModule.heldout_metrics): the training loss's own
token-mean NLL on demonstrations of the task's held-out examples; a no-op for other stages."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from callbacks.heldout_loss import HeldOutLoss
from data_modules.experience import collate
from run.stages import build
from tasks.base import Example, Task
from tests.helpers import TINY, tiny_model

TASK = Task("t", train=[Example(f"{i}+1=", str(i + 1)) for i in range(4)],
            heldout=[Example("7+5=", "12"), Example("30+3=", "33"), Example("9+9=", "18")])


def sft(hydra_conf, extra=()):
    policy, tok = tiny_model(seed=3)
    cfg = hydra_conf(TINY + ["algorithm=sft", "data=demonstrations", "algorithm.loss_agg_mode=token_mean", *extra])
    return build(cfg.algorithm, policy=policy, tokenizer=tok), build(cfg.data, task=TASK, tokenizer=tok)


def test_the_heldout_loss_is_the_training_loss_on_the_heldout_demonstrations(hydra_conf):
    module, data = sft(hydra_conf)
    assert [r.completion_text for r in data.heldout_records] == ["12", "33", "18"]
    assert not {r.prompt_text for r in data.heldout_records} & {r.prompt_text for r in data.records}
    module.policy.eval()
    with torch.no_grad():
        expected, metrics = module.micro_loss(collate(data.heldout_records, module.tokenizer.pad_token_id))
    got = module.heldout_metrics(data.heldout_records, batch_size=2)  # 2 + 1: batching changes nothing
    assert got["loss"] == pytest.approx(float(expected), rel=1e-5)
    assert got["target_prob"] == pytest.approx(float(metrics["target_prob"]), rel=1e-5)
    assert got["loss"] > 0 and 0 < got["target_prob"] < 1 and math.isfinite(got["loss"])


def test_the_callback_reports_before_and_after_and_is_a_noop_without_demonstrations(hydra_conf, monkeypatch):
    module, data = sft(hydra_conf)
    said = []
    monkeypatch.setattr("callbacks.heldout_loss.say", lambda trainer, text: said.append(text))
    monkeypatch.setattr("callbacks.heldout_loss.log_now", lambda trainer, metrics: None)
    trainer = SimpleNamespace(datamodule=data, global_step=0, max_steps=4)
    cb = HeldOutLoss(every_n_steps=2, batch_size=8, num_examples=2)
    cb.on_fit_start(trainer, module)
    trainer.global_step = 4
    cb.on_train_end(trainer, module)
    summary = cb.summary()
    assert set(summary) == {"val/loss_before", "val/target_prob_before", "val/loss_after", "val/target_prob_after"}
    assert "held-out loss" in said[0] and "on 2 demonstrations" in said[0]
    other = HeldOutLoss(every_n_steps=2, batch_size=8, num_examples=None)  # e.g. DPO: no heldout_metrics
    other.on_fit_start(SimpleNamespace(datamodule=data, global_step=0, max_steps=4), object())
    assert other.summary() == {}
