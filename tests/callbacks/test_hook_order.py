"""One epoch is one round (DESIGN §4), pinned with a real Lightning Trainer and GRPO.

Rounds are made in on_fit_start and on_train_epoch_end; Lightning rebuilds the train dataloader
(reload_dataloaders_every_n_epochs=1) after those hooks and before on_train_epoch_start, so epoch k
serves exactly the records of round k. If Lightning changed that order, training would silently run on
the previous round's (stale) data: this test is the alarm.
"""
from __future__ import annotations

import lightning as L
import pytest
import torch
from hydra.utils import instantiate

from rewards.base import RewardSource
from run.stages import build, plan_stages, set_run_fields
from tests.helpers import TINY

STEPS_PER_ROUND, ROUNDS = 2, 3
OVERRIDES = ["algorithm=grpo", "data.prompts_per_round=2", "algorithm.group_size=4", "data.batch_size=4",
             f"trainer.max_steps={STEPS_PER_ROUND * ROUNDS}", "generator.max_new_tokens=4",
             "algorithm.scheduler.num_warmup_steps=0"] + TINY


class CharSumReward(RewardSource):
    """A reward that varies inside a group (so advantages, hence gradients, are non-zero)."""

    name, version = "char_sum", "test"

    def score(self, prompts, completions, examples):
        return [(sum(map(ord, c)) % 10) / 10 for c in completions]


class Recorder(L.Callback):
    def __init__(self, events):
        self.events = events

    def on_fit_start(self, trainer, pl_module):
        self.events.append(("on_fit_start",))

    def on_train_epoch_start(self, trainer, pl_module):
        self.events.append(("on_train_epoch_start", trainer.current_epoch))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.events.append(("batch", trainer.current_epoch, trainer.global_step, batch))
        self.events.append(("mode", "train", pl_module.policy.training))

    def on_train_epoch_end(self, trainer, pl_module):
        self.events.append(("on_train_epoch_end", trainer.current_epoch))


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """Fit GRPO for 3 rounds with train.py's wiring, recording hooks, dataloader builds and rounds."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from tests.conftest import CONF
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        [stage] = plan_stages(compose("train", overrides=OVERRIDES), OVERRIDES)
    GlobalHydra.instance().clear()
    out = tmp_path_factory.mktemp("hook_order")
    set_run_fields(stage.cfg, out, stage.name, "group", "name")
    cfg = stage.cfg
    L.seed_everything(cfg.seed, verbose=False)
    policy, tokenizer = instantiate(cfg.model)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    datamodule = build(cfg.data, task=stage.task, tokenizer=tokenizer)
    module = build(cfg.algorithm, policy=policy, tokenizer=tokenizer)
    generator = instantiate(cfg.generator)
    regenerate = build(cfg.callbacks.regenerate, generator=generator, reward=CharSumReward())

    events, rounds = [], []
    put, train_dataloader = datamodule.put, datamodule.train_dataloader

    def recording_put(records):
        rounds.append(list(records))
        events.append(("put", len(rounds)))
        put(records)

    def recording_train_dataloader():
        events.append(("train_dataloader",))
        return train_dataloader()

    sample = generator.sample

    def recording_sample(model, *args, **kwargs):
        # a module every path calls (the lean decode of models/lean_llama.py skips the decoder's forward)
        first = model.get_decoder().layers[0].self_attn.q_proj
        hook = first.register_forward_pre_hook(lambda m, a: events.append(("mode", "generate", m.training)))
        try:
            return sample(model, *args, **kwargs)
        finally:
            hook.remove()

    generator.sample = recording_sample
    datamodule.put, datamodule.train_dataloader = recording_put, recording_train_dataloader
    trainer = L.Trainer(**cfg.trainer, callbacks=[Recorder(events), regenerate], logger=False,
                        enable_progress_bar=False, default_root_dir=str(out))
    trainer.fit(module, datamodule=datamodule)
    return dict(events=events, rounds=rounds, before=before, policy=policy, trainer=trainer,
                regenerate=regenerate, module=module, datamodule=datamodule)


def test_lightning_hook_order(fitted):
    """on_fit_start → round 1 → train_dataloader → epoch 0 → on_train_epoch_end → round 2 →
    train_dataloader → epoch 1 → … ; no round after the last epoch (max_steps reached)."""
    names = []
    for e in (e for e in fitted["events"] if e[0] != "mode"):
        name = e[0] if e[0] != "put" else f"put{e[1]}"
        if name != "batch" or names[-1] != "batch":  # collapse runs of batches
            names.append(name)
    expected = ["on_fit_start", "put1"]
    for k in range(ROUNDS):
        expected += ["train_dataloader", "on_train_epoch_start", "batch", "on_train_epoch_end"]
        if k + 1 < ROUNDS:
            expected.append(f"put{k + 2}")
    assert names == expected
    assert fitted["trainer"].global_step == STEPS_PER_ROUND * ROUNDS
    assert fitted["regenerate"].rounds == ROUNDS


def test_epoch_k_serves_round_k(fitted):
    rounds = fitted["rounds"]
    assert len(rounds) == ROUNDS and all(len(r) == 8 for r in rounds)
    batches = [e for e in fitted["events"] if e[0] == "batch"]
    assert len(batches) == STEPS_PER_ROUND * ROUNDS
    for k, records in enumerate(rounds):
        epoch = [b for _, ep, _, b in (e for e in batches) if ep == k]
        assert len(epoch) == STEPS_PER_ROUND
        served = [r for b in epoch for r in b.records]
        assert sorted(map(id, served)) == sorted(map(id, records))  # exactly round k, each record once
        version = STEPS_PER_ROUND * k  # the optimizer step at which round k was generated
        for b in epoch:
            assert b.policy_versions.tolist() == [version] * len(b)
            assert set(b.group_ids.tolist()) <= {2 * k, 2 * k + 1}
        assert {r.provenance.policy_version for r in records} == {version}
        assert {r.provenance.created_step for r in records} == {version}
        assert {r.group_id for r in records} == {2 * k, 2 * k + 1}
    for _, epoch, step, _ in batches:  # and epoch k's batches run at steps 2k, 2k+1
        assert step // STEPS_PER_ROUND == epoch


def test_records_are_complete(fitted):
    for records in fitted["rounds"]:
        for r in records:
            assert len(r.behaviour_logprobs) == len(r.completion_ids) >= 1
            assert len(r.ref_logprobs) == len(r.completion_ids)  # beta > 0: annotated
            assert all(lp <= 0 for lp in r.behaviour_logprobs)
            assert r.provenance.source == "policy_rollout" and r.provenance.times_used == 1
            assert r.provenance.reward_source == "char_sum" and r.rewards == {"char_sum": r.reward}
            assert r.provenance.sampling["top_k"] == 0 and r.provenance.generator == "hf"
        by_group = {}
        for r in records:
            by_group.setdefault(r.group_id, []).append(r)
        for group in by_group.values():  # whole groups of group_size, advantages centred per group
            assert len(group) == 4 and len({tuple(r.prompt_ids) for r in group}) == 1
            assert abs(sum(r.advantage for r in group)) < 1e-4


def test_policy_trained_and_metrics_logged(fitted):
    after = fitted["policy"].state_dict()
    assert any(not torch.equal(after[k], v) for k, v in fitted["before"].items())
    metrics = fitted["trainer"].callback_metrics
    for key in ("train/loss", "train/kl", "train/clip_frac", "train/ratio_max", "train/entropy",
                "rollout/reward_mean"):
        assert key in metrics and torch.isfinite(metrics[key]), key
    summary = fitted["regenerate"].summary()
    assert summary["rollout/rounds"] == ROUNDS and summary["cost/generated_tokens"] > 0
    assert summary["cost/records_generated"] == 8 * ROUNDS and summary["cost/records_dropped"] == 0
    assert fitted["datamodule"].epochs_served == ROUNDS


def test_policy_trains_in_train_mode_and_generates_in_eval_mode(fitted):
    """Dropout is on while training (Lightning keeps the mode modules start in) and off while
    sampling; the mode is restored after each round."""
    modes = [e[1:] for e in fitted["events"] if e[0] == "mode"]
    assert {m for kind, m in modes if kind == "train"} == {True}
    generating = [m for kind, m in modes if kind == "generate"]
    assert generating and not any(generating)
