"""losses/sampling.py: the truncated distribution is transformers' (top-k then top-p), its log-probs and
their gradient are the hand-worked ones, and the chunked trainer path scores the same thing."""
from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from losses.common import head_token_logprobs, token_logprobs
from losses.sampling import kept_tokens, processed_logprobs, truncate


def hf_truncate(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """transformers' own warpers, in generate()'s order: top-k, then top-p."""
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores


@pytest.mark.parametrize("top_k,top_p", [(0, 0.7), (20, 1.0), (20, 0.7), (5, 0.3), (1, 0.9), (0, 0.05)])
def test_kept_tokens_are_those_of_transformers_warpers(top_k, top_p):
    g = torch.Generator().manual_seed(top_k)
    scores = 3 * torch.randn(64, 500, generator=g)
    ours = kept_tokens(scores, top_k, top_p)
    theirs = torch.isfinite(hf_truncate(scores.clone(), top_k, top_p))
    assert torch.equal(ours, theirs)
    assert torch.equal(torch.isfinite(truncate(scores, top_k, top_p)), theirs)
    assert ours.sum(-1).min() >= 1  # the most likely token is always kept


def test_ties_at_the_kth_score_are_kept():
    scores = torch.tensor([[3.0, 2.0, 2.0, 1.0]])
    assert kept_tokens(scores, 2).tolist() == [[True, True, True, False]]


def test_processed_logprob_and_gradient_by_hand():
    """Logits [ln 4, ln 3, ln 2, ln 1] at T = 1: softmax (0.4, 0.3, 0.2, 0.1); top_p = 0.6 keeps the two
    first (0.4 < 0.6 ≤ 0.7), renormalised to (4/7, 3/7). Target 1: log(3/7), gradient 1[j=1] − p_S(j)
    = (−4/7, 4/7, 0, 0).
    Target 3 (outside): its full log-prob log 0.1, no gradient."""
    z = torch.tensor([[math.log(4), math.log(3), math.log(2), 0.0]] * 2, requires_grad=True)
    lp = processed_logprobs(z, torch.tensor([1, 3]), top_k=0, top_p=0.6)
    assert lp[0].item() == pytest.approx(math.log(3 / 7), abs=1e-6)
    assert lp[1].item() == pytest.approx(math.log(0.1), abs=1e-6)
    lp.sum().backward()
    assert torch.allclose(z.grad[0], torch.tensor([-4 / 7, 4 / 7, 0.0, 0.0]), atol=1e-6)
    assert torch.equal(z.grad[1], torch.zeros(4))


def test_temperature_and_top_k_gradient_by_hand():
    """At T = 2 the scores are z / 2; top_k = 3 keeps tokens 0-2. d log p_a / dz_j = (1[j=a] − p_j) / T."""
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0]], requires_grad=True)
    lp = token_logprobs(z[:, None, :], torch.tensor([[2]]), temperature=2.0, top_k=3)
    kept = torch.tensor([1.0, 0.5, 0.0]).softmax(-1)
    assert lp.item() == pytest.approx(kept[2].log().item(), abs=1e-6)
    lp.sum().backward()
    want = torch.cat([(torch.tensor([0.0, 0.0, 1.0]) - kept) / 2, torch.zeros(1)])
    assert torch.allclose(z.grad[0], want, atol=1e-6)


def test_no_truncation_is_the_plain_log_softmax():
    z = torch.randn(8, 50)
    t = torch.randint(0, 50, (8,))
    assert torch.equal(processed_logprobs(z, t), z.gather(-1, t[:, None])[:, 0] - z.logsumexp(-1))


@pytest.mark.parametrize("chunk_elements", [1 << 23, 700])  # one piece; chunks recomputed in backward
def test_head_path_scores_the_truncated_distribution_with_its_gradient(chunk_elements):
    """A plain linear head with top-k/top-p set leaves the fused full-softmax path: values and gradients
    (hidden and head weight) equal a direct computation on the warped logits."""
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 100, bias=False)
    hidden = torch.randn(2, 6, 16, requires_grad=True)
    targets = torch.randint(0, 100, (2, 6))  # row 1: mostly outside S
    with torch.no_grad():
        targets[0] = head(hidden[0]).argmax(-1)  # row 0: the most likely tokens, always inside S
    lp = head_token_logprobs(hidden, head, targets, 0.7, chunk_elements=chunk_elements, top_k=20, top_p=0.7)
    lp.sum().backward()
    got_h, got_w = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    scores = head(hidden) / 0.7
    warped = hf_truncate(scores.reshape(-1, 100), 20, 0.7)
    inside = torch.isfinite(warped.gather(-1, targets.reshape(-1, 1)))[:, 0]
    ref = torch.where(inside, warped.log_softmax(-1).gather(-1, targets.reshape(-1, 1))[:, 0],
                      scores.reshape(-1, 100).log_softmax(-1).gather(-1, targets.reshape(-1, 1))[:, 0].detach())
    assert 0 < int(inside.sum()) < inside.numel()  # both kinds of target are exercised
    assert torch.allclose(lp.reshape(-1), ref, atol=1e-5)
    torch.where(inside, ref, 0.0).sum().backward()
    assert torch.allclose(got_h, hidden.grad, atol=1e-5) and torch.allclose(got_w, head.weight.grad, atol=1e-5)
