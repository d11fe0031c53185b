"""Per-round signal metrics (issue 33, measurement v2), logged by RegenerateExperience with each new round:

    rollout/z                              share of the round's generated groups whose rewards all tie (no
                                           signal: a group-relative advantage of 0); dynamic sampling counts
                                           the groups it dropped for it (rollout/dynamic_dropped_groups)
    rollout/tokens_per_informative_group   the round's generated tokens / its groups with signal
    rollout/pg_kl_weight                   the effective policy-gradient : KL weight per token, the root mean
                                           square advantage of the round's records over β (std-scaled
                                           advantages: √(1 − z) / β); absent at β = 0
    rollout/kl_after_update                KL(behaviour ‖ current) per token of the previous round's fresh
                                           records after that round's update(s), on up to KL_SAMPLE of them
                                           (k3; one no-grad forward; one process only): how far one update
                                           moves the policy off the data it just trained on

Nothing here changes training; a metric that cannot be computed is left out.
"""
from __future__ import annotations

import math

import torch

from data_modules.experience import ExperienceRecord
from hardware import distributed
from losses.kl import k3

KL_SAMPLE = 64  # records of the previous round in the KL-after-update forward


def round_signal(records: list[ExperienceRecord], generated_tokens: int, dynamic: dict[str, float],
                 beta: float | None) -> dict[str, float]:
    """z, tokens per informative group and the PG:KL weight of one round (`dynamic`: the round's dynamic
    sampling metrics, empty without it)."""
    groups: dict[int, set] = {}
    for r in records:
        groups.setdefault(r.group_id, set()).add(r.reward)
    if "rollout/dynamic_dropped_groups" in dynamic:
        tied = dynamic["rollout/dynamic_dropped_groups"]
        total = dynamic.get("rollout/dynamic_generated_groups",  # carried groups were generated last round
                            tied + dynamic["rollout/dynamic_kept_groups"] + dynamic.get("rollout/dynamic_surplus_groups", 0.0))
    else:
        tied, total = float(sum(len(v) == 1 for v in groups.values())), float(len(groups))
    out: dict[str, float] = {}
    if total > 0:
        out["rollout/z"] = tied / total
    if total > tied:
        out["rollout/tokens_per_informative_group"] = generated_tokens / (total - tied)
    if records and beta:
        rms = math.sqrt(sum(r.advantage ** 2 for r in records) / len(records))
        out["rollout/pg_kl_weight"] = rms / beta
    return out


@torch.no_grad()
def kl_after_update(pl_module, served: list[ExperienceRecord]) -> dict[str, float]:
    """KL(behaviour ‖ current) per token (k3) of up to KL_SAMPLE fresh records the last round served, with
    the weights it ended at; {} with ranks (a forward there is a collective), without records or a module
    that annotates."""
    fresh = [r for r in served if getattr(r, "served_as", None) == "fresh"
             and getattr(r, "behaviour_logprobs", None)][:KL_SAMPLE]
    if not fresh or distributed.world_size() > 1 or not all(hasattr(pl_module, a) for a in (
            "frozen_logprobs", "annotation_batches", "collate")):  # rejection sampling's SFT module has no collate
        return {}
    total, tokens = 0.0, 0
    was_training = pl_module.policy.training
    pl_module.policy.eval()
    try:
        for chunk, batch in pl_module.annotation_batches(fresh, pl_module.collate):
            for r, lp in zip(chunk, pl_module.frozen_logprobs(pl_module.policy, batch)):
                mask = r.loss_mask or [1] * len(lp)
                kept = [(b, c) for b, c, m in zip(r.behaviour_logprobs, lp, mask) if m]
                if kept:
                    b, c = torch.tensor(kept, dtype=torch.float64).T
                    total += float(k3(b, c).sum())
                    tokens += len(kept)
    finally:
        pl_module.policy.train(was_training)
    return {"rollout/kl_after_update": total / tokens} if tokens else {}


def previous_round(dm) -> list:
    """The fresh records of the round the data module serves now (called before the next round is made: the
    round that just ended), at most KL_SAMPLE, with behaviour log-probs; read from the data module, whose
    state is checkpointed, so a resumed stage measures the same round an uninterrupted one does."""
    served = getattr(dm, "epoch_records", lambda: [])() if getattr(dm, "online", False) else []
    return [r for r in served if getattr(r, "served_as", None) == "fresh"
            and getattr(r, "behaviour_logprobs", None)][:KL_SAMPLE]


def signal_metrics(regen, pl_module, records: list[ExperienceRecord], out, previous: list) -> dict[str, float]:
    """The new round's metrics for RegenerateExperience.regenerate (`out`: its GenerationOutput): the
    round's own, and the KL after update of `previous`, the round before it (previous_round)."""
    if not all(isinstance(r, ExperienceRecord) for r in records):  # online DPO's and SPIN's pairs: their
        return {}  # rounds have no group rewards to tie and no behaviour log-probs (rollout/* say theirs)
    tokens = sum(len(c) for c in getattr(out, "completions", []))
    return round_signal(records, tokens, regen.round_extra, getattr(pl_module, "beta", None)) | (
        kl_after_update(pl_module, previous) if previous else {})
