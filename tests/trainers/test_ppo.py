"""PPO: `annotate` by hand (zero critic → advantages are the KL-shaped reward-to-go), then real Lightning
fits with a shared and a separate critic (policy AND critic learn, metrics logged), and target_kl ending
rounds early."""
from __future__ import annotations

import lightning as L
import pytest
import torch
from hydra.utils import instantiate

from data_modules.experience import ExperienceRecord, Provenance
from models.value_head import SeparateCritic, SharedCritic, build_critic
from rewards.base import RewardSource
from run.stages import build
from tests.helpers import TINY, tiny_model

SMALL = TINY + ["algorithm=ppo", "data.prompts_per_round=4", "algorithm.group_size=2", "data.batch_size=4",
                "generator.max_new_tokens=4", "algorithm.scheduler.num_warmup_steps=0",
                "algorithm.epochs_per_round=2"]  # 8 records a round, 2 batches × 2 passes = 4 steps a round


class CharSumReward(RewardSource):
    """Varies from sample to sample, so advantages (hence gradients) are non-zero."""

    name, version = "char_sum", "test"

    def score(self, prompts, completions, examples):
        return [(sum(map(ord, c)) % 10) / 10 for c in completions]


def rec(completion_ids: list[int], reward: float, behaviour: float) -> ExperienceRecord:
    prov = Provenance("policy_rollout", created_step=0, policy_version=0)
    return ExperienceRecord([1, 5, 6], completion_ids, prov, behaviour_logprobs=[behaviour] * len(completion_ids),
                            rewards={"r": reward}, reward=reward)


def test_annotate_by_hand(hydra_conf):
    """The critic's head starts at zero (V ≡ 0), so with γ = λ = 1 and no whitening A_t = R_t = the
    reward-to-go: score - kl_coef · Σ_{t' ≥ t} (log μ_t' - log π_ref,t'), with π_ref = the policy itself."""
    cfg = hydra_conf(SMALL + ["algorithm.gamma=1.0", "algorithm.lam=1.0", "algorithm.whiten_advantages=false",
                              "algorithm.kl_coef=0.1", "algorithm.beta=0.0"])
    policy, tok = tiny_model()
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    assert module.reference is not None  # KL in the reward needs the reference even with β = 0
    records = [rec([10, 11, 12], 1.0, -1.0), rec([13, 14], 0.5, -2.0)]
    module.annotate(records)
    for r in records:
        n = len(r.completion_ids)
        assert len(r.values) == len(r.returns) == len(r.token_advantages) == len(r.ref_logprobs) == n
        assert r.values == [0.0] * n
        kl = [b - ref for b, ref in zip(r.behaviour_logprobs, r.ref_logprobs)]
        expected = [r.reward - 0.1 * sum(kl[t:]) for t in range(n)]
        assert torch.allclose(torch.tensor(r.token_advantages), torch.tensor(expected), atol=1e-5)
        assert torch.allclose(torch.tensor(r.returns), torch.tensor(expected), atol=1e-5)
    assert set(module.last_round_stats) >= {"value_mean", "return_mean", "advantage_mean", "kl_ref"}

    cfg = hydra_conf(SMALL + ["algorithm.kl_in_reward=false", "algorithm.beta=0.0"])
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    assert module.reference is None
    records = [rec([10, 11, 12], 1.0, -1.0), rec([13, 14], 0.0, -2.0)]
    module.annotate(records)  # whitened over the round's 5 tokens: mean 0, variance 1
    adv = torch.tensor([a for r in records for a in r.token_advantages])
    assert abs(adv.mean()) < 1e-5 and abs(adv.pow(2).mean() - 1) < 1e-3
    assert records[0].ref_logprobs is None


def test_critic_choice(hydra_conf):
    policy, _ = tiny_model()
    shared, separate = build_critic("shared", policy), build_critic("separate", policy)
    assert isinstance(shared, SharedCritic) and isinstance(separate, SeparateCritic)
    assert [n for n, _ in shared.named_parameters()] == ["head.linear.weight", "head.linear.bias"]
    policy_ids = {id(p) for p in policy.parameters()}
    assert not policy_ids & {id(p) for p in separate.parameters()}
    ids = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    assert shared(ids, mask).shape == separate(ids, mask).shape == (2, 3)
    with pytest.raises(ValueError, match="algorithm.critic='both'"):
        build_critic("both", policy)


class RoundEnds(L.Callback):
    def __init__(self):
        self.steps, self.reasons = [], []

    def on_train_epoch_start(self, trainer, pl_module):
        self._start = trainer.global_step

    def on_train_epoch_end(self, trainer, pl_module):
        self.steps.append(trainer.global_step - self._start)
        self.reasons.append(pl_module.round_end_reason)


def fit(hydra_conf, tmp_path, *overrides, max_steps=6):
    cfg = hydra_conf(SMALL + list(overrides))
    L.seed_everything(cfg.seed, verbose=False)
    policy, tok = instantiate(cfg.model)
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    before = {k: v.detach().clone() for k, v in module.named_parameters()}
    dm = build(cfg.data, task=instantiate(cfg.task), tokenizer=tok)
    regenerate = build(cfg.callbacks.regenerate, generator=instantiate(cfg.generator), reward=CharSumReward())
    ends = RoundEnds()
    trainer = L.Trainer(**(dict(cfg.trainer) | {"max_steps": max_steps}), callbacks=[regenerate, ends],
                        logger=False, enable_progress_bar=False, default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    changed = {k for k, v in module.named_parameters() if not torch.equal(v.detach(), before[k])}
    return dict(module=module, trainer=trainer, changed=changed, ends=ends, dm=dm)


@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_ppo_fits_policy_and_critic(hydra_conf, tmp_path, critic):
    run = fit(hydra_conf, tmp_path, f"algorithm.critic={critic}", "algorithm.beta=0.01")
    module, changed = run["module"], run["changed"]
    assert any(k.startswith("policy.") for k in changed)
    assert {"critic.head.linear.weight", "critic.head.linear.bias"} <= changed
    if critic == "separate":
        assert any(k.startswith("critic.backbone.") for k in changed)
    trainable = {id(p) for p in module.trainable_parameters()}
    assert {id(p) for p in module.critic.parameters()} <= trainable
    assert {id(p) for p in module.policy.parameters()} <= trainable
    metrics = run["trainer"].callback_metrics
    for key in ("train/loss", "train/pg_loss", "train/vf_loss", "train/vf_clip_frac", "train/value_mean",
                "train/explained_variance", "train/ess_frac", "train/clip_frac", "train/kl", "train/entropy",
                "rollout/reward_mean"):
        assert key in metrics and torch.isfinite(metrics[key]), key
    assert run["ends"].steps == [4, 2] and run["ends"].reasons == [None, None]  # no target_kl: full rounds
    served = run["dm"].epoch_records()
    assert all(len(r.token_advantages) == len(r.returns) == len(r.values) == len(r.completion_ids)
               for r in served)


def test_target_kl_ends_rounds_early(hydra_conf, tmp_path):
    """A tiny target_kl: by the second step of a round the policy has moved, so every round stops
    before its 4 planned steps, and says why."""
    run = fit(hydra_conf, tmp_path, "algorithm.target_kl=1e-12", "algorithm.critic=shared")
    steps, reasons = run["ends"].steps, run["ends"].reasons
    assert run["trainer"].global_step == 6
    assert len(steps) >= 3 and all(s <= 2 for s in steps[:-1])
    assert reasons[0] == "target_kl" and run["module"].round_end_reason in ("target_kl", None)
