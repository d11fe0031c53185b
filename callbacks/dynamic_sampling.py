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

`algorithm.refill=measured` sizes each refill from the round's measured tie share (`refill_size`) instead of
a full batch; `algorithm.carry_surplus` returns the surplus groups with signal to be carried to the next round
(data_modules/carry.py), which takes them first. cost/records_filtered then counts a record in the round that
discards it (`rollout/dynamic_filtered_records`). The round is made by callbacks/round_economy.py.
"""
from __future__ import annotations

import math
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
    chosen, counts, _ = _split(records, target)
    return chosen, counts


def _split(records: list, target: int) -> tuple[list, dict[str, int], list[int]]:
    """select_groups, and the ids of the surplus groups with signal (in order of appearance)."""
    if not records:
        return [], {"signal": 0, "dropped": 0, "surplus": 0}, []
    keep = groups_with_signal(torch.tensor([float(r.reward) for r in records]),
                              torch.tensor([r.group_id for r in records])).tolist()
    order = list(dict.fromkeys(r.group_id for r in records))
    signal = list(dict.fromkeys(r.group_id for r, k in zip(records, keep) if k))
    chosen = set(signal[:target])
    return ([r for r in records if r.group_id in chosen],
            {"signal": len(signal), "dropped": len(order) - len(signal), "surplus": max(len(signal) - target, 0)},
            signal[target:])


def refill_size(missing: int, target: int, tied: int, generated: int, multiple: int = 1) -> int:
    """Groups to generate for the next refill (`algorithm.refill=measured`): the missing groups with signal
    over the share of groups with signal measured so far this round, z = tied / generated,

        n = min(target, max(missing, ⌈missing / (1 − z)⌉))      (n = target when z = 1: nothing measured yet)

    rounded up to a multiple of `multiple` (the ranks, so every rank samples a share)."""
    share = 1.0 - tied / generated if generated else 0.0
    n = target if share <= 0 else min(target, max(missing, math.ceil(missing / share - 1e-9)))
    return -(-n // multiple) * multiple


@dataclass
class Filled:
    """A dynamic-sampling round: its generation batches, the chosen (unannotated) records, the metrics and
    the surplus records with signal carried to the next round (empty unless carry is on)."""
    batches: list[GenBatch]
    chosen: list
    metrics: dict[str, float]
    surplus: list


def fill_round(first: list, more: Callable[[int], list], scored: Callable[[list], GenBatch],
               max_gen_batches: int, carried: list = (), refill: str = "full", carry: bool = False,
               multiple: int = 1) -> Filled:
    """Generate batches until `len(first)` groups with signal are in hand or `max_gen_batches` were made.
    first: the round's planned groups (prompt triples); more(n): the next n from the prompt stream;
    scored(groups): one GenBatch; carried: scored records of groups with signal the last round carried
    (taken first). refill: full (each refill a batch of len(first) groups) or measured (refill_size).
    carry: the surplus groups with signal generated this round are returned to be carried (at most
    len(first) groups), not discarded."""
    target, carried = len(first), list(carried)
    batches = [scored(first)]
    refills = 0
    while len(batches) < max_gen_batches and _signal(carried, batches) < target:
        n = target
        if refill == "measured":
            tied, made = _tied(batches)
            n = refill_size(target - _signal(carried, batches), target, tied, made, multiple)
        batches.append(scored(more(n)))
        refills += n
    fresh = [r for b in batches for r in b.records]
    chosen, counts, extra = _split(carried + fresh, target)
    no_signal = not chosen
    if no_signal:  # nothing to learn from anywhere: serve the last batch that has scored samples as it is
        chosen = next((b.records for b in reversed(batches) if b.records), [])
    born = {r.group_id for r in fresh}
    keep = set([g for g in extra if g in born][:target]) if carry else set()
    surplus = [r for r in fresh if r.group_id in keep]
    used = {id(r) for r in chosen} | {id(r) for r in surplus}
    stored = "stored_success"  # a reused stored success (data_modules/stored_success.py) was never generated
    filtered = sum(id(r) not in used and r.served_as != stored for r in carried + fresh)
    carried_groups = len({r.group_id for r in carried})
    metrics = {"rollout/gen_batches": float(len(batches)), "rollout/dynamic_dropped_groups": float(counts["dropped"]),
               "rollout/dynamic_kept_groups": float(len({r.group_id for r in chosen})),
               "rollout/dynamic_kept_records": float(len(chosen)),
               "rollout/dynamic_surplus_groups": float(counts["surplus"]),
               "rollout/dynamic_no_signal": float(no_signal),
               "rollout/dynamic_generated_groups": float(len(born)),
               "rollout/dynamic_refill_groups": float(refills),
               "rollout/dynamic_carried_in_groups": float(carried_groups),
               "rollout/dynamic_carried_out_groups": float(len(keep)),
               "rollout/dynamic_filtered_records": float(filtered)}
    return Filled(batches, chosen, metrics, surplus)


def _signal(carried: list, batches: list[GenBatch]) -> int:
    return _split(carried + [r for b in batches for r in b.records], 0)[1]["signal"]


def _tied(batches: list[GenBatch]) -> tuple[int, int]:
    """(groups whose rewards tie, groups) generated so far this round."""
    counts = _split([r for b in batches for r in b.records], 0)[1]
    return counts["dropped"], counts["dropped"] + counts["signal"]


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
