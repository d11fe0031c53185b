"""Packed (model.packing=true) against padded: one `training_step` of every loss family on records of
random lengths gives the same loss and the same gradient of every trainable parameter (float tolerance):
SFT, DPO, GRPO (reference KL on), PPO with a shared and with a separate critic (value loss included), and
GRPO on multi-turn episodes whose loss_mask masks observation tokens. The batches do pack (asserted), so
a packed forward that let rows see each other, shifted a position or dropped a target would fail here."""
from __future__ import annotations

import copy

import pytest
import torch

from data_modules.experience import ExperienceRecord, Provenance, collate
from data_modules.preferences import PreferenceRecord, collate_preferences
from models import packing
from tests.trainers.test_micro_batches import experience, module_for, step_gradients


def random_records(n: int, seed: int) -> list[ExperienceRecord]:
    """Records with prompts of 2-13 and completions of 1-10 tokens (wide spread: they pack)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = [1] + torch.randint(4, 60, (int(torch.randint(1, 13, (1,), generator=g)),), generator=g).tolist()
        completion = torch.randint(4, 60, (int(torch.randint(1, 11, (1,), generator=g)),), generator=g).tolist()
        prov = Provenance("policy_rollout", created_step=0, policy_version=0)
        out.append(ExperienceRecord(prompt, completion, prov, group_id=i // 2,
                                    behaviour_logprobs=(-4.0 - torch.rand(len(completion), generator=g)).tolist(),
                                    reward=float(i % 3), advantage=float(i % 3) - 1.0))
    return out


def episodes(n: int, seed: int) -> list[ExperienceRecord]:
    """Multi-turn records: a middle stretch of each completion is an observation (loss_mask 0)."""
    records = random_records(n, seed)
    for r in records:
        r.completion_ids = r.completion_ids + [40, 41, 42] + r.completion_ids[:2]
        k = len(r.completion_ids)
        r.loss_mask = [1] * (k - 5) + [0, 0, 0] + [1, 1]
        r.behaviour_logprobs = (r.behaviour_logprobs + [0.0, 0.0, 0.0] + r.behaviour_logprobs[:2])[:k]
    return records


def packed_module(module):
    """A copy of `module` whose policy (and any separate critic backbone) runs the packed forward."""
    other = copy.deepcopy(module)
    for model in (other.policy, getattr(other, "reference", None)):
        if model is not None:
            packing.enable(model, True)
    critic = getattr(other, "critic", None)
    if critic is not None and hasattr(critic, "backbone"):
        packing.enable(critic.backbone, True)
    return other


def assert_packed_equals_padded(module, batch, micro=None):
    rows = getattr(batch, "sequences", batch)  # DPO: chosen and rejected rows in one batch
    assert packing.layout(rows.attention_mask).packs < len(rows)  # the batch does pack
    assert not packing.enabled(module.policy)
    fast = packed_module(module)
    padded_loss, padded = step_gradients(module, batch, micro)
    packed_loss, packed = step_gradients(fast, batch, micro)
    assert torch.allclose(padded_loss, packed_loss, atol=1e-5), (padded_loss, packed_loss)
    assert sum(g is not None and bool(g.abs().sum() > 0) for g in packed) > 0
    for a, b in zip(padded, packed):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a - b).abs().max()


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_grpo(hydra_conf, agg):
    module, tok = module_for(hydra_conf, ["algorithm=grpo", f"algorithm.loss_agg_mode={agg}"])
    records = random_records(9, seed=1)
    module.annotate_reference(records)
    assert_packed_equals_padded(module, collate(records, tok.pad_token_id), micro=5)


def test_grpo_episodes_with_loss_masks(hydra_conf):
    module, tok = module_for(hydra_conf, ["algorithm=grpo"])
    records = episodes(8, seed=2)
    module.annotate_reference(records)
    batch = collate(records, tok.pad_token_id)
    assert float(batch.completion_mask.sum()) < sum(len(r.completion_ids) for r in records)  # masks in force
    assert_packed_equals_padded(module, batch)


def test_sft(hydra_conf):
    module, tok = module_for(hydra_conf, ["algorithm=sft"])
    assert_packed_equals_padded(module, collate(random_records(8, seed=3), tok.pad_token_id))


def test_dpo(hydra_conf):
    module, tok = module_for(hydra_conf, ["algorithm=dpo", "data=static_preferences"])
    recs = random_records(12, seed=4)
    pairs = [PreferenceRecord(a.prompt_ids, a.completion_ids, b.completion_ids[:2], a.provenance)  # short rejected
             for a, b in zip(recs[::2], recs[1::2])]
    batch = collate_preferences(pairs, tok.pad_token_id)
    assert_packed_equals_padded(module, batch, micro=4)


@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_ppo_value_head(hydra_conf, critic):
    module, tok = module_for(hydra_conf, ["algorithm=ppo", f"algorithm.critic={critic}",
                                          "algorithm.kl_in_reward=true"])
    records = random_records(8, seed=5)
    module.annotate(records)
    for r in records:  # a non-zero critic target so the value loss has a gradient too
        r.returns = [x + 1.0 for x in r.returns]
    assert_packed_equals_padded(module, collate(records, tok.pad_token_id))


def test_annotation_log_probs_equal(hydra_conf):
    """The no-grad forwards (reference and behaviour log-probs of a round) give the same lists packed."""
    module, tok = module_for(hydra_conf, ["algorithm=grpo"])
    batch = collate(episodes(7, seed=6) + experience(3), tok.pad_token_id)
    padded = module.frozen_logprobs(module.policy, batch)
    fast = packed_module(module)
    packed = fast.frozen_logprobs(fast.policy, batch)
    assert [len(x) for x in packed] == [len(x) for x in padded]
    assert torch.allclose(torch.tensor(sum(packed, [])), torch.tensor(sum(padded, [])), atol=1e-5)
