"""correction=decoupled_ppo through the real stage runner (Lightning Trainer, CPU, tiny GRPO): π_prox is the
policy at the start of the round that serves a record; a fresh record takes its behaviour log-probs (so on
fresh data the run is ppo_clip's, weight for weight), a replayed one a forward of the round's first weights."""
from __future__ import annotations

import lightning as L
import torch
from hydra.utils import instantiate

from run import stages
from run.stages import plan_stages, run_stage, set_run_fields
from tests.helpers import TINY

GRPO = TINY + ["algorithm=grpo", "reward._target_=tests.helpers.LengthReward", "data.prompts_per_round=2",
               "algorithm.group_size=4", "data.batch_size=4", "trainer.max_steps=6", "generator.max_new_tokens=4",
               "callbacks.evaluate.every_n_steps=0", "algorithm.optimizer.lr=1e-2", "algorithm.scheduler=null",
               "algorithm.beta=0.0"]


class ProxProbe(L.Callback):
    """At each round's first step: every served record's π_prox log-probs against the policy's own (computed
    here, no grad, eval mode) and, for fresh records, against their behaviour log-probs."""

    def __init__(self):
        self.replayed = self.fresh = 0
        self.worst = 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if batch_idx:
            return
        records = batch.records
        module.policy.eval()
        with torch.no_grad():
            mine = module.frozen_logprobs(module.policy, module.collate(records))
        module.policy.train()
        for r, lp in zip(records, mine):
            assert r.prox_logprobs is not None and len(r.prox_logprobs) == len(r.completion_ids)
            if r.served_as == "fresh":
                self.fresh += 1
                assert r.prox_logprobs == r.behaviour_logprobs
            else:
                self.replayed += 1
            self.worst = max(self.worst, max(abs(a - b) for a, b in zip(r.prox_logprobs, lp)))


def run(hydra_conf, tmp_path, monkeypatch, overrides: list[str], probe=None):
    args = GRPO + overrides
    [stage] = plan_stages(hydra_conf(args), args)
    set_run_fields(stage.cfg, tmp_path, stage.name, "test", "test")
    if probe is not None:
        build_callbacks = stages.build_callbacks
        monkeypatch.setattr(stages, "build_callbacks", lambda *a: build_callbacks(*a) + [probe])
    policy, tokenizer = instantiate(stage.cfg.model)
    policy, _, metrics = run_stage(stage, policy, tokenizer)
    return policy, metrics


def test_on_fresh_data_with_two_passes_a_round_it_trains_the_weights_ppo_clip_trains(hydra_conf, tmp_path,
                                                                                    monkeypatch):
    """Two optimizer steps a round (epochs_per_round=2): the second step's π has moved from μ, and both
    corrections clip against μ = π_prox: the final weights are equal, bit for bit."""
    two = ["algorithm.epochs_per_round=2"]
    a, ma = run(hydra_conf, tmp_path / "a", monkeypatch, two + ["correction=decoupled_ppo"])
    b, mb = run(hydra_conf, tmp_path / "b", monkeypatch, two + ["correction=ppo_clip"])
    assert ma["train/steps"] == mb["train/steps"] == 6
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    assert ma["train/loss"] == mb["train/loss"]


def test_replayed_records_are_clipped_against_the_rounds_first_weights(hydra_conf, tmp_path, monkeypatch):
    probe = ProxProbe()
    _, metrics = run(hydra_conf, tmp_path, monkeypatch,
                     ["correction=decoupled_ppo", "data=replay_mix", "data.replay_ratio=0.5"], probe)
    assert metrics["train/steps"] == 6
    assert probe.fresh > 0 and probe.replayed > 0  # both kinds were served and checked
    assert probe.worst < 1e-5  # replayed: π_prox is the policy at the round's start
