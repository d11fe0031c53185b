"""Issue 23's proof: an episode's observation tokens get zero gradient, and its policy tokens get exactly
the gradient they would get as single-turn samples. A two-turn episode P | A O B (prompt P, policy turn A,
observation O, policy turn B; loss_mask 0 on O, behaviour log-prob 0.0 there) is trained by GRPO's real
training step against its hand-built equivalent: the two single-turn records P → A and P A O → B with the
same advantage and the same behaviour log-probs. Under token_mean both batches hold |A| + |B| trained
tokens, so the losses and every parameter's gradient must agree; the per-token gradient of the loss with
respect to each token's log-prob must be exactly 0 on O and equal to the single-turn one on A and B."""
from __future__ import annotations

import copy

import pytest
import torch

from data_modules.experience import ExperienceRecord, Provenance, collate
from tests.trainers.test_micro_batches import module_for, step_gradients

P, A, O, B = [1, 20, 21, 22], [30, 31, 32], [40, 41, 42, 43], [50, 51]


def records():
    """(the episode, its single-turn equivalent): same tokens, same behaviour log-probs, same advantage."""
    g = torch.Generator().manual_seed(0)
    lp_a, lp_b = (-1 - torch.rand(len(A), generator=g)).tolist(), (-1 - torch.rand(len(B), generator=g)).tolist()
    prov = lambda: Provenance("policy_rollout", created_step=0, policy_version=0)  # noqa: E731
    episode = ExperienceRecord(P, A + O + B, prov(), behaviour_logprobs=lp_a + [0.0] * len(O) + lp_b,
                               loss_mask=[1] * len(A) + [0] * len(O) + [1] * len(B), advantage=0.7, reward=1.0)
    first = ExperienceRecord(P, A, prov(), behaviour_logprobs=lp_a, advantage=0.7, reward=1.0)
    second = ExperienceRecord(P + A + O, B, prov(), behaviour_logprobs=lp_b, group_id=0, advantage=0.7, reward=1.0)
    return episode, [first, second]


@pytest.fixture
def module(hydra_conf):
    module, _ = module_for(hydra_conf, ["algorithm=grpo", "algorithm.loss_agg_mode=token_mean"])
    return module


def token_gradients(module, batch):
    """d loss / d log-prob of every target position [B, T] (the loss of GRPO's micro_loss, reference KL on)."""
    logp = module.sequence_logprobs(module.policy, batch).detach().requires_grad_()
    module.sequence_logprobs = lambda policy, b: logp
    try:
        loss, _ = module.micro_loss(batch)
    finally:
        del module.sequence_logprobs
    loss.backward()
    return loss.detach(), logp.grad


def test_observation_tokens_get_zero_gradient_and_policy_tokens_the_single_turn_gradient(module):
    episode, singles = records()
    module.annotate_reference([episode, *singles])  # β > 0: each record's reference log-probs
    assert len(episode.ref_logprobs) == len(A + O + B)
    ep_batch, single_batch = collate([episode], 0), collate(singles, 0)
    ep_loss, ep_grad = token_gradients(module, ep_batch)
    single_loss, single_grad = token_gradients(module, single_batch)
    assert torch.allclose(ep_loss, single_loss, atol=1e-6)
    start = len(P) - 1  # target position t predicts token t + 1
    a, o, b = (slice(start, start + len(A)), slice(start + len(A), start + len(A) + len(O)),
               slice(start + len(A) + len(O), start + len(A) + len(O) + len(B)))
    assert torch.equal(ep_grad[0, o], torch.zeros(len(O)))  # exactly zero on the observation
    assert (ep_grad[0, a] != 0).all() and (ep_grad[0, b] != 0).all()
    assert torch.allclose(ep_grad[0, a], single_grad[0, start: start + len(A)], atol=1e-7)
    second = len(P + A + O) - 1
    assert torch.allclose(ep_grad[0, b], single_grad[1, second: second + len(B)], atol=1e-7)
    assert ep_batch.completion_mask[0, o].sum() == 0 and ep_batch.behaviour_logprobs[0, o].abs().sum() == 0


def test_one_optimizer_step_on_the_episode_equals_one_on_its_single_turn_records(module):
    episode, singles = records()
    module.annotate_reference([episode, *singles])
    twin = copy.deepcopy(module)
    ep_loss, ep_grads = step_gradients(module, collate([episode], 0), None)
    single_loss, single_grads = step_gradients(twin, collate(singles, 0), None)
    assert torch.allclose(ep_loss, single_loss, atol=1e-6)
    assert sum(g is not None and bool(g.abs().sum() > 0) for g in ep_grads) > 0
    for x, y in zip(ep_grads, single_grads):
        assert (x is None) == (y is None)
        if x is not None:
            assert torch.allclose(x, y, atol=1e-6), (x - y).abs().max()


def test_observation_ids_still_condition_the_later_turn(module):
    """Masking O removes its loss, not its tokens: the episode with other observation ids trains B on a
    different context, so its gradient differs (the mask is not a deletion)."""
    episode, _ = records()
    other = copy.deepcopy(episode)
    other.completion_ids = A + [60, 61, 62, 63] + B
    module.annotate_reference([episode, other])
    _, g1 = token_gradients(module, collate([episode], 0))
    _, g2 = token_gradients(module, collate([other], 0))
    start = len(P) - 1 + len(A) + len(O)
    assert not torch.allclose(g1[0, start: start + len(B)], g2[0, start: start + len(B)])
