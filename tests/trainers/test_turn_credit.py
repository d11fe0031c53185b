"""algorithm.turn_credit=per_turn (issue 23: credit turns when the environment rewards them): the pure
functions against hand-worked values, and GRPO's annotate/micro_loss on episodes: each policy turn's tokens
get their turn's advantage, observation tokens 0, and with no per-turn rewards (γ = 1, equal lengths) the
loss is exactly the outcome-credit loss."""
from __future__ import annotations

import functools

import pytest
import torch

from data_modules.experience import ExperienceRecord, Provenance, collate
from losses.advantages import group_relative_advantages, turn_advantages, turn_returns
from tests.trainers.test_micro_batches import module_for

GRPO_ADV = functools.partial(group_relative_advantages, scale_by_std=False)  # Dr.GRPO: easy to work by hand


def test_turn_returns_are_the_discounted_reward_to_go():
    assert turn_returns([1.0, 0.0, 2.0], 0.5) == [1.0 + 0.5 * 0 + 0.25 * 2, 0.0 + 0.5 * 2, 2.0]
    assert turn_returns([0.0, 0.0, 1.0], 1.0) == [1.0, 1.0, 1.0]
    assert turn_returns([], 0.9) == []


def test_turn_advantages_compare_a_turn_with_the_same_turn_of_its_group():
    # group 0: episodes with returns [3, 1] and [1]; group 1: [2, 2] and [0, 4]
    returns = [[3.0, 1.0], [1.0], [2.0, 2.0], [0.0, 4.0]]
    adv = turn_advantages(GRPO_ADV, returns, [0, 0, 1, 1])
    # turn 0 of group 0: mean 2 → +1, −1; turn 1 of group 0: episode 0 alone → 0
    # turn 0 of group 1: mean 1 → +1, −1; turn 1 of group 1: mean 3 → −1, +1
    assert adv == [[1.0, 0.0], [-1.0], [1.0, -1.0], [-1.0, 1.0]]


def record(completion, mask, turns, reward, group):
    return ExperienceRecord([1, 2], completion, Provenance("policy_rollout", created_step=0, policy_version=0),
                            behaviour_logprobs=[-1.0] * len(completion), loss_mask=mask, turns=turns,
                            reward=reward, group_id=group)


def episode(reward, group, turn_rewards=(None, None)):
    """A | O | B: policy turn A (3 ids), observation O (2 ids), policy turn B (2 ids)."""
    turns = [{"kind": "policy", "start": 0, "length": 3, "reward": turn_rewards[0]},
             {"kind": "observation", "start": 3, "length": 2},
             {"kind": "policy", "start": 5, "length": 2, "reward": turn_rewards[1]}]
    return record([10, 11, 12, 20, 21, 13, 14], [1, 1, 1, 0, 0, 1, 1], turns, reward, group)


@pytest.fixture
def modules(hydra_conf):
    base = ["algorithm=grpo", "algorithm.beta=0", "algorithm.loss_agg_mode=token_mean"]
    outcome, _ = module_for(hydra_conf, base)
    per_turn, _ = module_for(hydra_conf, [*base, "algorithm.turn_credit=per_turn"])
    return outcome, per_turn


def test_without_turn_rewards_per_turn_credit_is_the_outcome_loss(modules):
    outcome, per_turn = modules
    a = [episode(1.0, 0), episode(0.0, 0), episode(1.0, 1), episode(1.0, 1)]
    b = [episode(1.0, 0), episode(0.0, 0), episode(1.0, 1), episode(1.0, 1)]
    outcome.annotate(a)
    per_turn.annotate(b)
    for ra, rb in zip(a, b):
        assert rb.token_advantages == [ra.advantage] * 3 + [0.0] * 2 + [ra.advantage] * 2
    loss_a, _ = outcome.micro_loss(collate(a, 0))
    loss_b, _ = per_turn.micro_loss(collate(b, 0))
    assert torch.allclose(loss_a, loss_b, atol=1e-6)


def test_a_turn_reward_moves_only_the_turns_up_to_it(modules):
    _, per_turn = modules
    per_turn.advantage_fn = GRPO_ADV  # unscaled, so the values below are worked by hand
    # both episodes succeed (scored reward 1 = outcome 0.5 + their turn rewards); only episode 0's first
    # turn was rewarded (0.5), episode 1's second turn was (0.5). Reward-to-go (γ = 1): episode 0 [1, 0.5],
    # episode 1 [1, 1]. Turn 0: equal (advantage 0 both); turn 1: 0.5 vs 1 → −0.25, +0.25.
    eps = [episode(1.0, 0, (0.5, None)), episode(1.0, 0, (None, 0.5))]
    per_turn.annotate(eps)
    assert eps[0].token_advantages == [0.0] * 3 + [0.0] * 2 + [-0.25] * 2
    assert eps[1].token_advantages == [0.0] * 3 + [0.0] * 2 + [0.25] * 2
    assert [e.advantage for e in eps] == [0.0, 0.0]


def test_single_turn_records_are_one_turn(modules):
    _, per_turn = modules
    recs = [record([5, 6], [1, 1], None, 1.0, 0), record([7], [1], None, 0.0, 0)]
    per_turn.annotate(recs)
    assert [r.token_advantages for r in recs] == [[recs[0].advantage] * 2, [recs[1].advantage]]
    assert recs[0].advantage == pytest.approx(1.0, abs=1e-5) and recs[1].advantage == pytest.approx(-1.0, abs=1e-5)
