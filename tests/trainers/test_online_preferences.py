"""Online DPO and rejection sampling: `annotate` turns scored groups into pairs / kept samples (by hand),
and both fit through the regenerate callback with the DPO / SFT training steps unchanged."""
from __future__ import annotations

import lightning as L
import pytest
import torch
from hydra.utils import instantiate

from data_modules.experience import ExperienceRecord, Provenance
from data_modules.preferences import PreferenceRecord
from rewards.base import RewardSource
from run.stages import build, set_run_fields
from tests.helpers import TINY, tiny_model
from trainers.online_dpo import best_worst_pairs
from trainers.rejection_sampling import best_of_n

ROUNDS = 3
SMALL = TINY + ["data.prompts_per_round=4", "algorithm.group_size=4", "data.batch_size=2",
                "generator.max_new_tokens=4", "algorithm.scheduler.num_warmup_steps=0",
                "algorithm.epochs_per_round=1"]


def rec(gid: int, completion: str, reward: float, version: int = 7) -> ExperienceRecord:
    prov = Provenance("policy_rollout", created_step=version, policy_version=version, generator="hf",
                      sampling={"temperature": 1.0}, reward_source="verifier", reward_version="1")
    return ExperienceRecord([1, 5], [10 + ord(c) - ord("a") for c in completion] + [2], prov, group_id=gid, prompt_text="p",
                            completion_text=completion, answer="ok", behaviour_logprobs=[-1.0] * (len(completion) + 1),
                            rewards={"verifier": reward}, reward=reward)


GROUPS = [rec(0, "a", 0.0), rec(0, "b", 1.0), rec(0, "c", 1.0), rec(0, "d", 0.5),   # best b, worst a
          rec(1, "e", 1.0), rec(1, "f", 1.0),                                          # tie: no pair
          rec(2, "g", 0.2), rec(2, "h", 0.3)]                                          # gap 0.1


def test_best_worst_pairs_by_hand():
    pairs = best_worst_pairs(GROUPS, min_reward_gap=0.0)
    assert [(p.group_id, p.chosen_text, p.rejected_text) for p in pairs] == [(0, "b", "a"), (2, "h", "g")]
    p = pairs[0]
    assert (p.chosen_reward, p.rejected_reward) == (1.0, 0.0)
    assert p.provenance.source == "policy_rollout" and p.provenance.policy_version == 7
    assert p.provenance.reward_source == "verifier" and p.provenance is not GROUPS[1].provenance
    assert [(p.group_id) for p in best_worst_pairs(GROUPS, min_reward_gap=0.5)] == [0]


def test_best_of_n_by_hand():
    kept = best_of_n(GROUPS, threshold=1.0, keep_per_group=1)
    assert [(r.group_id, r.completion_text) for r in kept] == [(0, "b"), (1, "e")]
    kept = best_of_n(GROUPS, threshold=0.25, keep_per_group=2)
    assert [(r.group_id, r.completion_text) for r in kept] == [(0, "b"), (0, "c"), (1, "e"), (1, "f"), (2, "h")]
    twins = [rec(0, "x", 1.0), rec(0, "x", 1.0), rec(0, "y", 1.0)]
    assert [r.completion_text for r in best_of_n(twins, 1.0, 2)] == ["x", "y"]  # distinct completions


def test_online_dpo_annotate_caches_reference_and_reports_the_round(hydra_conf, tmp_path):
    cfg = hydra_conf(["algorithm=online_dpo", *SMALL])
    policy, tok = tiny_model()
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    pairs = module.annotate(GROUPS)
    assert len(pairs) == 2 and all(None not in p.ref_logps for p in pairs)
    assert module.last_round_stats == {"pairs": 2.0, "frac_groups_paired": 2 / 3}
    with pytest.raises(ValueError, match="precompute_reference"):
        build(hydra_conf(["algorithm=online_dpo", "algorithm.precompute_reference=true", *SMALL]).algorithm,
              policy=policy, tokenizer=tok)


class DigitReward(RewardSource):
    """Varies within a group, so most groups give a pair / a kept sample."""

    name, version = "digits", "test"

    def score(self, prompts, completions, examples):
        return [float(sum(c.isdigit() for c in text) % 3) / 2 for text in completions]


def fit_online(hydra_conf, tmp_path, algorithm: str):
    cfg = hydra_conf([f"algorithm={algorithm}", "data=filtered_rollouts", *SMALL])
    set_run_fields(cfg, tmp_path, algorithm, "g", "n")
    L.seed_everything(cfg.seed, verbose=False)
    policy, tok = instantiate(cfg.model)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    dm = build(cfg.data, task=instantiate(cfg.task), tokenizer=tok)
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    regenerate = build(cfg.callbacks.regenerate, generator=instantiate(cfg.generator), reward=DigitReward())
    rounds = []
    put = dm.put
    dm.put = lambda records: (rounds.append(list(records)), put(records))
    trainer = L.Trainer(**(dict(cfg.trainer) | {"max_steps": 6}), callbacks=[regenerate], logger=False,
                        enable_progress_bar=False, default_root_dir=str(tmp_path))
    trainer.fit(module, datamodule=dm)
    after = policy.state_dict()
    return dict(rounds=rounds, trainer=trainer, regenerate=regenerate, module=module,
                changed=any(not torch.equal(after[k], v) for k, v in before.items()))


def test_online_dpo_fits_on_its_own_pairs(hydra_conf, tmp_path):
    run = fit_online(hydra_conf, tmp_path, "online_dpo")
    assert run["changed"] and run["regenerate"].rounds >= 2
    served = [r for rnd in run["rounds"] for r in rnd]
    assert served and all(isinstance(p, PreferenceRecord) for p in served)
    versions = sorted({p.provenance.policy_version for p in served})
    assert versions[0] == 0 and len(versions) == len([rnd for rnd in run["rounds"] if rnd])
    assert all(p.chosen_reward > p.rejected_reward and p.provenance.source == "policy_rollout" for p in served)
    metrics = run["trainer"].callback_metrics
    for key in ("train/loss", "train/reward_acc", "train/reward_margin", "train/reward_chosen"):
        assert key in metrics, key


def test_rejection_sampling_fits_sft_on_kept_samples(hydra_conf, tmp_path):
    from trainers.sft import SFTModule
    run = fit_online(hydra_conf, tmp_path, "rejection_sampling")
    assert isinstance(run["module"], SFTModule) and run["changed"]
    kept = [r for rnd in run["rounds"] for r in rnd]
    assert kept and all(r.reward >= 1.0 and isinstance(r, ExperienceRecord) for r in kept)
    assert "train/target_prob" in run["trainer"].callback_metrics


def test_filtered_rollouts_serve_the_previous_round_when_one_keeps_nothing(hydra_conf):
    cfg = hydra_conf(["algorithm=online_dpo", "data=filtered_rollouts", *SMALL])
    _, tok = tiny_model()
    dm = build(cfg.data, task=instantiate(cfg.task), tokenizer=tok)
    with pytest.raises(RuntimeError, match="first round kept nothing"):
        dm.put([])
    pairs = best_worst_pairs(GROUPS, 0.0)
    dm.put(pairs)
    dm.put([])
    assert dm.epoch_records() == pairs and dm.empty_rounds == 2
    batch = next(iter(dm.train_dataloader()))
    assert batch.sequences.input_ids.shape[0] == 4  # 2 pairs → 4 sequences in one batch
