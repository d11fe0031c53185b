"""Online DPO's reference refresh (`algorithm.ref_update_every`), with a real Trainer and the tiny model:
the reference takes the policy's weights before the rounds it should and stays put in between; without
it the reference is the stage's initial policy; a refreshed round's pairs carry the refreshed policy's
log-probs; the refresh survives a checkpoint; LoRA is refused, naming the key."""
from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from hydra.utils import instantiate

from data_modules.preferences import collate_preferences
from models.lora import apply_lora
from run.errors import ConfigError
from run.stages import build, set_run_fields
from run.validation.config import validate
from tests.helpers import tiny_model
from tests.trainers.test_lora_reference import LORA
from tests.trainers.test_online_preferences import SMALL, DigitReward
from trainers.base import blend_weights


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Watch(L.Callback):
    """The reference's weights at every step's start, by the round (epoch) it serves."""

    def __init__(self):
        self.seen: dict[int, list[dict]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.setdefault(trainer.current_epoch, []).append(weights(pl_module.reference))


def fit(hydra_conf, tmp_path, *overrides: str, max_steps: int = 6):
    """Fit online DPO; record, at each round's start, the policy and reference weights just after
    `round_start` (and a copy of the policy then), and each round's pairs."""
    cfg = hydra_conf(["algorithm=online_dpo", "data=filtered_rollouts", *SMALL, *overrides])
    set_run_fields(cfg, tmp_path, "online_dpo", "g", "n")
    L.seed_everything(cfg.seed, verbose=False)
    policy, tok = instantiate(cfg.model)
    initial = weights(policy)
    dm = build(cfg.data, task=instantiate(cfg.task), tokenizer=tok)
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    starts, rounds = [], []
    round_start, put = module.round_start, dm.put

    def record_start(index):
        round_start(index)
        starts.append(dict(index=index, policy=weights(module.policy), reference=weights(module.reference),
                           snapshot=copy.deepcopy(module.policy).eval(), updates=module.ref_updates))

    module.round_start = record_start
    dm.put = lambda records: (rounds.append(list(records)), put(records))
    regenerate = build(cfg.callbacks.regenerate, generator=instantiate(cfg.generator), reward=DigitReward())
    watch = Watch()
    trainer = L.Trainer(**(dict(cfg.trainer) | {"max_steps": max_steps}), callbacks=[regenerate, watch],
                        logger=False, enable_progress_bar=False, default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    return dict(module=module, trainer=trainer, initial=initial, starts=starts, rounds=rounds, watch=watch)


def test_every_round_the_reference_becomes_the_policy_and_stays_put_in_between(hydra_conf, tmp_path):
    run = fit(hydra_conf, tmp_path, "algorithm.ref_update_every=1")
    starts, module = run["starts"], run["module"]
    assert len(starts) >= 3 and [s["index"] for s in starts] == list(range(len(starts)))
    assert same(starts[0]["reference"], run["initial"])  # round 0: the initial policy, no refresh
    for s in starts[1:]:
        assert same(s["reference"], s["policy"]), s["index"]  # refreshed: the policy at that moment
        assert not same(s["reference"], run["initial"])
    assert not same(starts[1]["reference"], starts[2]["reference"])  # the policy moved between refreshes
    for epoch, seen in run["watch"].seen.items():  # every step of round k saw the reference of k's start
        assert all(same(w, starts[epoch]["reference"]) for w in seen), epoch
    assert module.ref_updates == len(starts) - 1 == [s["updates"] for s in starts][-1]
    assert run["trainer"].callback_metrics["train/ref_updates"] == module.ref_updates


def test_every_second_round_only(hydra_conf, tmp_path):
    run = fit(hydra_conf, tmp_path, "algorithm.ref_update_every=2", max_steps=8)
    starts = run["starts"]
    assert len(starts) >= 4
    assert [s["updates"] for s in starts[:4]] == [0, 0, 1, 1]
    assert same(starts[1]["reference"], run["initial"]) and same(starts[2]["reference"], starts[2]["policy"])
    assert same(starts[3]["reference"], starts[2]["reference"]) and not same(starts[3]["policy"], starts[2]["policy"])


def test_without_refresh_the_reference_is_the_initial_policy(hydra_conf, tmp_path):
    run = fit(hydra_conf, tmp_path)
    module = run["module"]
    assert module.ref_update_every is None and module.ref_updates == 0
    assert not same(weights(module.policy), run["initial"])  # trained
    assert same(weights(module.reference), run["initial"])
    assert run["trainer"].callback_metrics["train/ref_updates"] == 0
    run["trainer"].save_checkpoint(tmp_path / "last.ckpt")  # the starting policy: built again on resume
    state = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert state and not any(k.startswith("reference.") for k in state)


def test_a_refreshed_rounds_pairs_carry_the_policys_log_probs_at_the_refresh(hydra_conf, tmp_path):
    run = fit(hydra_conf, tmp_path, "algorithm.ref_update_every=1")
    module, starts, rounds = run["module"], run["starts"], run["rounds"]
    k = next(i for i in range(1, len(rounds)) if rounds[i])  # a refreshed round with pairs
    pair = rounds[k][0]
    batch = collate_preferences([pair], module.tokenizer.pad_token_id)
    with torch.no_grad():
        at_refresh = module.batch_logps(starts[k]["snapshot"], batch)  # [chosen, rejected]
        initial = copy.deepcopy(starts[k]["snapshot"])
        initial.load_state_dict(run["initial"], strict=False)
        before = module.batch_logps(initial, batch)
    assert torch.allclose(torch.tensor(pair.ref_logps), at_refresh, atol=1e-5)
    assert not torch.allclose(torch.tensor(pair.ref_logps), before, atol=1e-4)  # the refresh changed them


def test_the_refresh_is_restored_from_a_checkpoint(hydra_conf, tmp_path):
    run = fit(hydra_conf, tmp_path, "algorithm.ref_update_every=1")
    path = tmp_path / "last.ckpt"
    run["trainer"].save_checkpoint(path)
    ckpt = torch.load(path, map_location="cpu", weights_only=True)  # as Lightning loads a resume checkpoint
    assert any(k.startswith("reference.") for k in ckpt["state_dict"])  # refreshed: kept (run/checkpointing.py)
    run["trainer"].save_checkpoint(tmp_path / "final.ckpt", weights_only=True)  # never resumed: not kept
    final = torch.load(tmp_path / "final.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    assert final and not any(k.startswith("reference.") for k in final)
    cfg = hydra_conf(["algorithm=online_dpo", *SMALL, "algorithm.ref_update_every=1"])
    policy, tok = instantiate(cfg.model)
    fresh = build(cfg.algorithm, policy=policy, tokenizer=tok)  # its reference: the stage's start weights
    fresh.load_state_dict(ckpt["state_dict"])
    fresh.on_load_checkpoint(ckpt)
    assert same(weights(fresh.reference), weights(run["module"].reference))
    assert not same(weights(fresh.reference), run["initial"])
    assert (fresh.ref_updates, fresh.ref_updated_round) == (run["module"].ref_updates, len(run["starts"]) - 1)


def test_lora_with_a_refresh_is_refused_naming_the_key(hydra_conf):
    overrides = ["algorithm=online_dpo", "data=filtered_rollouts", *SMALL, "algorithm.ref_update_every=2"]
    base, tok = tiny_model()
    with pytest.raises(ValueError, match=r"algorithm\.ref_update_every=2 with model\.lora"):
        build(hydra_conf(overrides).algorithm, policy=apply_lora(base, LORA), tokenizer=tok)
    with pytest.raises(ConfigError, match=r"algorithm\.ref_update_every=2 with model\.lora"):
        validate(hydra_conf([*overrides, "model.lora={r: 4, lora_alpha: 8, target_modules: all-linear}"]), "s")
    with pytest.raises(ConfigError, match=r"algorithm\.ref_update_alpha=0 must be in \(0, 1\]"):
        validate(hydra_conf([*overrides, "algorithm.ref_update_alpha=0"]), "s")
    with pytest.raises(ConfigError, match=r"algorithm\.ref_update_every=0 must be a positive integer"):
        validate(hydra_conf([*overrides[:-1], "algorithm.ref_update_every=0"]), "s")
    build(hydra_conf(overrides[:-1]).algorithm, policy=apply_lora(tiny_model()[0], LORA), tokenizer=tok)  # null: fine


def test_blend_weights_by_hand():
    """α = 0.25: target 4, source 8 → 0.25·8 + 0.75·4 = 5; α = 1 copies exactly."""
    source, target = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with torch.no_grad():
        source.weight.fill_(8.0), target.weight.fill_(4.0)
    blend_weights(source, target, 0.25)
    assert torch.equal(target.weight, torch.full((2, 2), 5.0))
    blend_weights(source, target, 1.0)
    assert torch.equal(target.weight, source.weight) and torch.equal(target.bias, source.bias)
