"""The sampling distribution, defined once: what the generators draw from and what the trainers score.

A rollout's token is drawn from the *processed* distribution

    π_proc(a | s) = softmax(z / T)_a / Σ_{j∈S} softmax(z / T)_j   for a ∈ S,   0 outside S,

where z are the logits, T the temperature and S the tokens kept by top-k (the k highest scores, ties
kept, as transformers' TopKLogitsWarper) then top-p (the smallest set of the top-k-renormalised
distribution whose mass reaches p, the most likely token always kept, as TopPLogitsWarper and vLLM's
`apply_top_k_top_p`). The behaviour log-probs the generators record are log π_proc, so the trainers
score log π_proc too (`processed_logprobs`): on fresh data the two agree and the importance ratio is 1
whatever the sampler settings. The KL to the reference is then between processed distributions too.

S is a discrete function of the logits: it carries no gradient (as the sampler's choice does not), so
the gradient of log π_proc(a) is (1[j = a] − π_proc(j)) / T over j ∈ S and 0 outside. A target outside
the current S (a replayed token the current policy would no longer sample) has π_proc = 0; it is scored
with its untruncated log-prob instead, detached: finite, so importance ratios and KL stay finite and
tiny for it, and without gradient, as the true (zero) probability has none.
"""
from __future__ import annotations

import torch


def truncates(top_k: int, top_p: float) -> bool:
    """Whether these settings cut the distribution at all (top_k ≤ 0 and top_p ≥ 1: off)."""
    return top_k > 0 or top_p < 1.0


@torch.no_grad()
def kept_tokens(scores: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Bool [N, V]: the tokens top-k then top-p keep from tempered scores [N, V]."""
    keep = torch.ones_like(scores, dtype=torch.bool)
    if top_k > 0 and top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]
        keep = scores >= kth
    if top_p < 1.0:
        masked = scores.masked_fill(~keep, float("-inf"))
        sorted_scores, order = torch.sort(masked, descending=False)
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        remove = cumulative <= (1 - top_p)
        remove[..., -1:] = False
        keep = keep & ~remove.scatter(-1, order, remove)
    return keep


def truncate(scores: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Tempered scores [N, V] with the tokens outside S set to -inf (the sampler's input)."""
    if not truncates(top_k, top_p):
        return scores
    return scores.masked_fill(~kept_tokens(scores, top_k, top_p), float("-inf"))


def processed_logprobs(scores: torch.Tensor, targets: torch.Tensor, top_k: int = 0,
                       top_p: float = 1.0) -> torch.Tensor:
    """log π_proc(target) for tempered float32 scores [N, V] and targets [N], differentiable in scores;
    a target outside S gets its untruncated log-prob, detached (see the module docstring)."""
    full = scores.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(scores, dim=-1)
    if not truncates(top_k, top_p):
        return full
    keep = kept_tokens(scores, top_k, top_p)
    inside = keep.gather(-1, targets[:, None]).squeeze(-1)
    kept = scores.masked_fill(~keep, float("-inf"))
    # an outside target would read -inf here: its score is taken from `scores` (finite) and the row's
    # value replaced below, so no -inf (or its NaN gradient) reaches the result
    proc = scores.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(kept, dim=-1)
    return torch.where(inside, proc, full.detach())
