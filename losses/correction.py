"""Off-policy correction: how the policy-gradient loss weighs tokens sampled by a behaviour policy μ (the
weights that generated the record, whose log-probs the record carries) while training the current π.

Shapes: logprobs, behaviour_logprobs, mask [B, T]; advantages [B] (one per sequence) or [B, T].
log-ratio d = log π - log μ, importance ratio ρ = exp(d); sg(·) = stop-gradient.

`level` says what ratio a token gets:
    token     ρ_t, each token its own                                     (PPO, verl's default)
    sequence  one ratio per completion, broadcast to its tokens: the IS corrections use the full
              sequence weight Π_t ρ_t = exp(Σ_t d_t) (unbiased for the whole sample); ppo_clip uses
              GSPO's length-normalised exp(mean_t d_t) (Zheng et al. 2025), which stays near 1, in its
              "GSPO-token" form (value s_i, gradient s_i·∇log π_t) so per-token advantages work too

The corrections (each returns the unreduced per-token loss [B, T] and detached metrics; the caller
aggregates with losses.common.aggregate):
    none          L = -A · log π                         on-policy REINFORCE: ignores that μ ≠ π
    ppo_clip      L = -min(ρ A, clip(ρ, 1-ε_low, 1+ε_high) A)    (Schulman et al. 2017)
    truncated_is  L = -sg(min(ρ, C)) · A · log π         (IMPALA's ρ̄, Espeholt et al. 2018; "TIS",
                                                          Yao et al. 2025): bias for bounded variance
    masked_is     L = -sg(ρ · 1[low ≤ ρ ≤ high]) · A · log π   (tokens with extreme ratios are dropped,
                                                          the rest importance-weighted)
    decoupled_ppo L = -sg(min(π_prox/μ, C)) · min(r A, clip(r, 1-ε_low, 1+ε_high) A),  r = π/π_prox
                                                         (AReaL's decoupled PPO, Fu et al. 2025): the trust
                                                         region is anchored at the proximal policy π_prox (the
                                                         weights at the start of the round that serves the
                                                         record), and the behaviour gap μ → π_prox, however
                                                         many versions old, is importance-weighted, truncated
                                                         at C. With π_prox = μ (fresh data) it is ppo_clip.
On-policy (π = μ, ρ = 1) every one of them has the gradient of -A · log π.

`importance_diagnostics` measures how off-policy a batch is (ratio mean/max, ESS, KL(μ ‖ π)).
"""
from __future__ import annotations

import torch

from losses.common import masked_mean, weighted_share
from losses.kl import k3
from losses.policy_gradient import clipped_surrogate

LEVELS = ("token", "sequence")


def _broadcast(advantages: torch.Tensor) -> torch.Tensor:
    return advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages


def log_ratio(logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor, level: str,
              normalise: bool = False) -> torch.Tensor:
    """d [B, T] at `level`: token d_t, or per sequence Σ_t m_t d_t (÷ Σ_t m_t if `normalise`) broadcast."""
    if level not in LEVELS:
        raise ValueError(f"correction level {level!r}: choose one of {LEVELS}")
    d = (logprobs - behaviour_logprobs) * mask
    if level == "token":
        return d
    seq = d.sum(-1, keepdim=True)
    if normalise:
        seq = seq / mask.sum(-1, keepdim=True).clamp_min(1.0)
    return seq.expand_as(d)


def _metrics(weights: torch.Tensor, mask: torch.Tensor, dropped: torch.Tensor | None = None,
             advantages: torch.Tensor | None = None) -> dict:
    """ratio_mean/max of `weights`; with `dropped`, clip_frac (its share of tokens) and, with `advantages`,
    adv_clip_frac (its share weighted by |A|: Σ dropped·|A|·m / Σ |A|·m; 0 when no token has an advantage)."""
    w = torch.where(mask.bool(), weights.detach(), 0.0)  # an overflowed (inf) weight off the mask: no NaN
    m = {"ratio_mean": masked_mean(w, mask), "ratio_max": (w * mask).max() if mask.any() else w.new_zeros(())}
    if dropped is not None:
        m["clip_frac"] = masked_mean(dropped.float(), mask)
        if advantages is not None:
            weight = mask * _broadcast(advantages).detach().abs().expand_as(mask)
            m["adv_clip_frac"] = weighted_share(dropped.float(), weight)
    return m


def no_correction(logprobs, behaviour_logprobs, advantages, mask, level: str = "token"):
    """L = -A · log π. Metrics still report the ratio, so the staleness being ignored is visible."""
    rho = torch.exp(log_ratio(logprobs, behaviour_logprobs, mask, level)).detach()
    return -_broadcast(advantages) * logprobs, _metrics(rho, mask, torch.zeros_like(rho), advantages)


def ppo_clip(logprobs, behaviour_logprobs, advantages, mask, clip_low: float, clip_high: float,
             level: str = "token"):
    """PPO's clipped surrogate with ratio at `level` (sequence: GSPO's length-normalised ratio)."""
    if level == "token":
        return clipped_surrogate(logprobs, behaviour_logprobs, advantages, mask, clip_low, clip_high)
    # GSPO-token: the value of the sequence ratio s_i, the gradient of each token's own log π
    # (s_i · ∇log π_t), so per-token advantages (PPO's GAE) keep their per-token weights.
    seq = log_ratio(logprobs, behaviour_logprobs, mask, level, normalise=True).detach()
    d = seq + logprobs - logprobs.detach()
    return clipped_surrogate(d, torch.zeros_like(d), advantages, mask, clip_low, clip_high)


def decoupled_ppo(logprobs, behaviour_logprobs, advantages, mask, prox_logprobs, clip_low: float,
                  clip_high: float, cap: float, level: str = "token"):
    """Decoupled PPO: ppo_clip against π_prox (prox_logprobs [B, T], the proximal policy's log-probs of the
    same tokens), each token weighted by the truncated behaviour correction w = sg(min(exp(log π_prox -
    log μ), cap)). Fresh data (π_prox = μ) has w = 1 and the exact loss and gradient of ppo_clip. Metrics:
    the surrogate's clip_frac and ratio (π/π_prox), and behaviour_ratio_mean/max, behaviour_trunc_frac
    (share of tokens whose weight was truncated at cap)."""
    if cap < 1:
        raise ValueError(f"decoupled_ppo cap={cap} must be ≥ 1 (fresh tokens have weight 1)")
    gap = torch.exp(log_ratio(prox_logprobs, behaviour_logprobs, mask, level)).detach()
    weight = gap.clamp(max=cap)
    loss, metrics = ppo_clip(logprobs, prox_logprobs, advantages, mask, clip_low, clip_high, level)
    g = _metrics(gap, mask, gap > cap)
    metrics |= {"behaviour_ratio_mean": g["ratio_mean"], "behaviour_ratio_max": g["ratio_max"],
                "behaviour_trunc_frac": g["clip_frac"]}
    return weight * loss, metrics


decoupled_ppo.needs_proximal = True  # the trainer passes prox_logprobs (trainers/rollout.py)


def truncated_is(logprobs, behaviour_logprobs, advantages, mask, cap: float, level: str = "token"):
    """L = -sg(min(ρ, C)) · A · log π. clip_frac = share of tokens whose weight was truncated at C."""
    if cap <= 0:
        raise ValueError(f"truncated_is cap={cap} must be > 0")
    rho = torch.exp(log_ratio(logprobs, behaviour_logprobs, mask, level)).detach()
    weight = rho.clamp(max=cap)
    return -weight * _broadcast(advantages) * logprobs, _metrics(rho, mask, rho > cap, advantages)


def masked_is(logprobs, behaviour_logprobs, advantages, mask, low: float, high: float,
              level: str = "token"):
    """L = -sg(ρ · 1[low ≤ ρ ≤ high]) · A · log π. clip_frac = share of tokens masked out."""
    if not 0 <= low < 1 < high:
        raise ValueError(f"masked_is needs 0 ≤ low < 1 < high, got low={low}, high={high}")
    rho = torch.exp(log_ratio(logprobs, behaviour_logprobs, mask, level)).detach()
    keep = (rho >= low) & (rho <= high)
    weight = torch.where(keep, rho, 0.0)  # not rho * keep: an overflowed ρ = inf would give inf·0 = NaN
    return -weight * _broadcast(advantages) * logprobs, _metrics(rho, mask, ~keep, advantages)


def effective_sample_size_frac(log_weights: torch.Tensor) -> torch.Tensor:
    """Kish's ESS of importance weights w_i = exp(log_weights_i) as a fraction of N:
    (Σ w)² / (N Σ w²), in [1/N, 1]; 1 when all weights are equal (on-policy). Computed stably in log space."""
    if log_weights.numel() == 0:
        return torch.tensor(float("nan"))
    lw = log_weights.detach().float()
    lw = lw - lw.max()
    w = lw.exp()
    return w.sum() ** 2 / (lw.numel() * (w**2).sum())


@torch.no_grad()
def importance_diagnostics(logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor
                           ) -> dict[str, torch.Tensor]:
    """How far the batch's behaviour policy μ is from π (all detached scalars):
        ratio_mean, ratio_max   token ratios ρ_t under the mask
        ess_frac                ESS of the sequence weights exp(Σ_t d_t), as a fraction of B
        kl_behaviour            KL(μ ‖ π) per token, k3 estimate from μ's samples: ρ - 1 - log ρ
    """
    d = (logprobs - behaviour_logprobs) * mask
    rho = torch.exp(d)
    return {"ratio_mean": masked_mean(rho, mask),
            "ratio_max": (rho * mask).max() if mask.any() else rho.new_zeros(()),
            "ess_frac": effective_sample_size_frac(d.sum(-1)),
            "kl_behaviour": masked_mean(k3(behaviour_logprobs, logprobs), mask)}
