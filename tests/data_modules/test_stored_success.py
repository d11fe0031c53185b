"""Reuse of stored successes (data_modules/stored_success.py, trainers/rollout.py `stored_success_loss`): an
all-fail group of a revisited prompt gets exactly one stored success, under its own label, with its own
provenance; its advantage and loss weight by hand."""
from __future__ import annotations

import pytest
import torch

from data_modules.experience import ExperienceRecord, Provenance, collate
from data_modules.state_checks import StateError
from data_modules.stored_success import STORED, SuccessBank, positive_only
from tests.helpers import TINY, tiny_model


def sample(gid: int, prompt: str, reward: float, version: int = 5, logprob: float = -1.0) -> ExperienceRecord:
    prov = Provenance("policy_rollout", created_step=version, policy_version=version)
    return ExperienceRecord([1, 5], [7, 8], prov, group_id=gid, prompt_text=prompt, completion_text="x",
                            behaviour_logprobs=[logprob, logprob], reward=reward, advantage=0.3, ref_logprobs=[0.0, 0.0])


def test_an_all_fail_group_of_a_revisited_prompt_gets_exactly_one_stored_success():
    """Bank (threshold 0.5): "a" passed at version 2 then at version 4 (the latest is kept), "b" never passed.
    Round: group 10 ("a", all fail) gets one copy of the version-4 success; 11 ("b", all fail) none (no stored
    success); 12 ("a", one pass) none (it has signal of its own)."""
    bank = SuccessBank()
    bank.observe([sample(0, "a", 1.0, version=2), sample(0, "a", 0.0, version=2), sample(1, "b", 0.0, version=2)], 0.5)
    bank.observe([sample(3, "a", 1.0, version=4, logprob=-0.7)], 0.5)
    assert len(bank) == 1
    round_ = [sample(10, "a", 0.0, 9), sample(10, "a", 0.0, 9), sample(11, "b", 0.0, 9), sample(11, "b", 0.2, 9),
              sample(12, "a", 0.0, 9), sample(12, "a", 1.0, 9)]
    copies = bank.attach(round_, 0.5)
    assert len(copies) == 1
    reused = copies[0]
    assert reused.group_id == 10 and reused.served_as == STORED and reused.reward == 1.0
    assert reused.provenance.policy_version == 4 and reused.behaviour_logprobs == [-0.7, -0.7]
    assert reused.provenance.times_used == 0 and reused.ref_logprobs is None and reused.advantage == 0.0
    assert bank.attach(round_ + copies, 0.5) == []  # a group that holds a stored success gets no second one


def test_the_reused_success_s_advantage_by_hand_and_clipped_positive(hydra_conf):
    """GRPO's annotate on group 10 = three fails [0, 0, 0] + the stored success [1]: mean 1/4, std √(3/16):
    the success gets (1 − 1/4)/0.4330 = 1.7321, each fail −0.5774 (their baseline includes it). positive_only
    leaves 1.7321; a stored success whose shaped advantage came out negative is clipped to 0."""
    from run.stages import build
    policy, tok = tiny_model(seed=2)
    cfg = hydra_conf(TINY + ["algorithm=grpo", "algorithm.beta=0"])
    module = build(cfg.algorithm, policy=policy, tokenizer=tok)
    bank = SuccessBank()
    bank.observe([sample(0, "a", 1.0, version=1)], 0.5)
    group = [sample(10, "a", 0.0, 3) for _ in range(3)]
    records = positive_only(module.annotate(group + bank.attach(group, 0.5)))
    assert [r.advantage for r in records] == pytest.approx([-0.5774] * 3 + [1.7321], abs=1e-4)
    assert records[-1].served_as == STORED
    records[-1].advantage = -0.2
    assert positive_only(records)[-1].advantage == 0.0 and records[0].advantage == pytest.approx(-0.5774, abs=1e-4)


def test_a_stored_success_trains_by_truncated_is_whatever_the_correction(hydra_conf):
    """Two rows, 2 completion tokens each, current log π = −1 per token. Row 0 fresh (μ = π, ppo_clip: ratio 1,
    loss −A = −0.5 per token). Row 1 the stored success, μ = −2 per token: ρ = e^1 = 2.718, cap 1 → weight 1,
    A = 1.5: loss −1 · 1.5 · (−1) = 1.5 per token, gradient ∂/∂log π = −1.5 (not ppo_clip's 0: its ratio is
    above 1 + ε). cap 4 → weight e: loss 4.0774, gradient −4.0774."""
    from run.stages import build
    policy, tok = tiny_model(seed=2)
    for cap, weight in ((1.0, 1.0), (4.0, torch.e)):
        cfg = hydra_conf(TINY + ["algorithm=grpo", "algorithm.beta=0", f"algorithm.stored_success.cap={cap}",
                                 "algorithm.stored_success.enabled=true"])
        module = build(cfg.algorithm, policy=policy, tokenizer=tok)
        fresh, stored = sample(1, "a", 0.0, logprob=-1.0), sample(1, "a", 1.0, logprob=-2.0)
        stored.served_as = STORED
        batch = collate([fresh, stored], tok.pad_token_id)
        logp = torch.where(batch.completion_mask.bool(), -1.0, 0.0).requires_grad_()
        per_token, _ = module.policy_loss(batch, logp, torch.tensor([0.5, 1.5]))
        mask = batch.completion_mask.bool()
        assert per_token[0][mask[0]].tolist() == pytest.approx([-0.5, -0.5])
        assert per_token[1][mask[1]].tolist() == pytest.approx([1.5 * weight] * 2)
        (per_token * batch.completion_mask).sum().backward()
        assert logp.grad[1][mask[1]].tolist() == pytest.approx([-1.5 * weight] * 2)


def test_the_bank_round_trips_and_refuses_a_bad_state():
    bank = SuccessBank()
    bank.observe([sample(3, "a", 1.0)], 0.5)
    state = bank.state_dict()
    other = SuccessBank()
    other.check_state(state, "successes", group_ids=4)
    other.load_state_dict(state)
    assert other.by_prompt["a"].reward == 1.0 and other.by_prompt["a"].provenance.policy_version == 5
    with pytest.raises(StateError, match=r"successes\['a'\].group_id: 3 is out of range \[0, 2\]"):
        other.check_state(state, "successes", group_ids=3)
    state["a"]["reward"] = float("nan")
    with pytest.raises(StateError, match=r"successes\['a'\].reward: nan is not a finite number"):
        other.check_state(state, "successes", group_ids=4)


def test_data_adaptive_does_not_count_a_stored_success_as_new_evidence():
    """data=adaptive's evidence takes the round's groups at put: group 10's three fresh fails are evidence for
    its prompt; the stored success attached to it was counted when it was sampled, not again."""
    from types import SimpleNamespace

    from data_modules.adaptive import AdaptiveDataModule
    seen = []
    fake = SimpleNamespace(group_prompt={10: 0}, rounds_put=0,
                           policy=SimpleNamespace(observe=lambda idx, rewards, round_, *_: seen.append((idx, rewards))))
    reused = sample(10, "a", 1.0)
    reused.served_as = STORED
    AdaptiveDataModule._observe(fake, [sample(10, "a", 0.0) for _ in range(3)] + [reused], 0)
    assert seen == [(0, [0.0, 0.0, 0.0])]
