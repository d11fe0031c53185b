"""DAPO's dynamic sampling (Yu et al. 2025, §3.2), `algorithm.dynamic_sampling=true` of GRPO: a round
keeps only groups whose rewards are not all equal (a group whose rewards tie has zero group-relative
advantage: no policy gradient), and refills with more prompts' groups until it holds as many groups
with signal as it planned fresh ones, or `algorithm.max_gen_batches` generation batches were made
(DAPO's max_num_gen_batches; then it trains on what it has).

A generation batch is as many fresh prompts as the round planned (data.prompts_per_round, less the
replayed groups with data=replay_mix), × group_size samples, taken from the data module's prompt
stream. Groups are kept in generation order and cut to the target; the surplus and the dropped groups
are never trained on, but every token they cost is in cost/generated_tokens and their rewards are in
rollout/reward_mean (all scored samples, as for an on-policy round). If no batch yields a group with
signal, the last batch is served as it is (its policy gradient is 0; rollout/dynamic_no_signal = 1,
and the learning guards warn). The filter reads the scored reward (DAPO's default `acc` metric), before
the overlong penalty. Every rank sees every batch whole (gathered), so the loop makes the same
decisions on every rank; the kept groups are then annotated by rank, as a plain round is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from generators.base import GenerationOutput
from hardware import distributed
from losses.advantages import groups_with_signal
from rewards.base import ScoreReport


@dataclass
class GenBatch:
    """One generation batch, scored and not yet annotated, whole on every rank."""
    records: list
    rewards: list[float]
    out: GenerationOutput
    report: ScoreReport
    mismatch: dict[str, float]
    prompt_tokens: int


def select_groups(records: list, target: int) -> tuple[list, dict[str, int]]:
    """The records of the first `target` groups (in order of appearance) whose rewards are not all equal,
    and the counts: groups with signal, groups dropped (rewards all equal), surplus (signal beyond target)."""
    if not records:
        return [], {"signal": 0, "dropped": 0, "surplus": 0}
    keep = groups_with_signal(torch.tensor([float(r.reward) for r in records]),
                              torch.tensor([r.group_id for r in records])).tolist()
    order = list(dict.fromkeys(r.group_id for r in records))
    signal = list(dict.fromkeys(r.group_id for r, k in zip(records, keep) if k))
    chosen = set(signal[:target])
    return ([r for r in records if r.group_id in chosen],
            {"signal": len(signal), "dropped": len(order) - len(signal), "surplus": max(len(signal) - target, 0)})


def fill_round(first: list, more: Callable[[int], list], scored: Callable[[list], GenBatch],
               max_gen_batches: int) -> tuple[list[GenBatch], list, dict[str, float]]:
    """Generate batches until `len(first)` groups with signal are in hand or `max_gen_batches` were made.
    first: the round's planned groups (prompt triples); more(n): the next n from the prompt stream;
    scored(groups): one GenBatch. Returns the batches, the chosen (unannotated) records and the metrics."""
    target = len(first)
    batches = [scored(first)]
    while len(batches) < max_gen_batches and _signal(batches) < target:
        batches.append(scored(more(target)))
    records = [r for b in batches for r in b.records]
    chosen, counts = select_groups(records, target)
    no_signal = not chosen
    if no_signal:  # nothing to learn from anywhere: serve the last batch that has scored samples as it is
        chosen = next((b.records for b in reversed(batches) if b.records), [])
    metrics = {"rollout/gen_batches": float(len(batches)), "rollout/dynamic_dropped_groups": float(counts["dropped"]),
               "rollout/dynamic_kept_groups": float(len({r.group_id for r in chosen})),
               "rollout/dynamic_kept_records": float(len(chosen)),
               "rollout/dynamic_surplus_groups": float(counts["surplus"]),
               "rollout/dynamic_no_signal": float(no_signal)}
    return batches, chosen, metrics


def _signal(batches: list[GenBatch]) -> int:
    return select_groups([r for b in batches for r in b.records], 0)[1]["signal"]


def merged(batches: list[GenBatch]) -> tuple[list[float], GenerationOutput, ScoreReport, dict[str, float], int]:
    """The round's batches as one: every scored reward, every completion (the cost), the summed
    generation seconds, one score report, the token-weighted log-prob mismatch and the prompt tokens."""
    out = GenerationOutput([c for b in batches for c in b.out.completions],
                           [lp for b in batches for lp in b.out.logprobs], sum(b.out.seconds for b in batches))
    tokens = [sum(map(len, b.out.completions)) for b in batches]
    mismatch = distributed.combine(list(zip(tokens, [b.mismatch for b in batches])))
    return ([x for b in batches for x in b.rewards], out, ScoreReport.merge([b.report for b in batches]),
            mismatch, sum(b.prompt_tokens for b in batches))


def annotate_by_rank(annotate: Callable[[list], list], records: list) -> list:
    """Annotate the chosen records with groups whole per rank (each rank its share), then every rank
    gets them all, in rank order (as a plain round's records are)."""
    groups = list(dict.fromkeys(r.group_id for r in records))
    mine = set(distributed.shard(groups))
    local = [r for r in records if r.group_id in mine]
    annotated = annotate(local) if local else []
    return distributed.gather_lists(annotated) if distributed.world_size() > 1 else annotated
