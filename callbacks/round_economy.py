"""Rounds that pay only for informative groups (issue 33 §2), made by RegenerateExperience when any of these
GRPO options is on (docs/experience.md, a section each):

    algorithm.dynamic_sampling      DAPO's refill loop (callbacks/dynamic_sampling.py), with
      algorithm.refill=measured     refills sized from the round's measured tie share, not a full batch
      algorithm.carry_surplus       surplus groups with signal carried to the next round (data_modules/carry.py)
    algorithm.screen.size           screen, then expand (data_modules/screening.py): s samples per prompt,
                                    the rest of the group only where the screen says it may pay
    algorithm.stored_success        an all-fail group of a revisited prompt gets one stored verified success
                                    (data_modules/stored_success.py)

A generation batch is made by `sample(groups, k)`: k samples of each group, scored, whole on every rank. Every
decision reads whole batches, so every rank decides alike; the chosen records are then annotated by rank.
Records made by a screen carry `provenance.phase = "screen"`, by an expansion "expand"; every sample of both
phases is in the batch's completions (the ledger's generated tokens) and rewards (rollout/reward_mean).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from callbacks.dynamic_sampling import GenBatch, annotate_by_rank, fill_round, merged
from data_modules.experience import ExperienceRecord
from data_modules.screening import ScreenSettings, to_expand
from data_modules.stored_success import STORED, positive_only
from generators.base import GenerationOutput
from hardware import distributed
from rewards.base import ScoreReport

GAUGES = ("rollout/stored_success_bank",)  # a level, not a count: not summed into summary.json's *_total
Sampler = Callable[[list, int], GenBatch]  # (groups, samples per group) → one scored batch, whole


@dataclass(frozen=True)
class Economy:
    """The options of a rollout module that change how a round is made (read from the module's attributes)."""
    dynamic: bool
    max_gen_batches: int
    refill: str
    carry: bool
    screen: ScreenSettings | None
    stored_success: bool
    pass_threshold: float
    group_size: int

    @classmethod
    def of(cls, module) -> "Economy":
        return cls(dynamic=getattr(module, "dynamic_sampling", False),
                   max_gen_batches=getattr(module, "max_gen_batches", 1), refill=getattr(module, "refill", "full"),
                   carry=getattr(module, "carry_surplus", False), screen=getattr(module, "screen", None),
                   stored_success=getattr(module, "stored_success", False),
                   pass_threshold=getattr(module, "pass_threshold", 0.5), group_size=getattr(module, "group_size", 1))

    @property
    def on(self) -> bool:
        return self.dynamic or self.screen is not None or self.stored_success


def empty_batch() -> GenBatch:
    return GenBatch([], [], GenerationOutput([], [], 0.0), ScoreReport([]), {}, 0)


def join(batches: list[GenBatch]) -> GenBatch:
    """Several batches as one (a screen and its expansion): records, rewards and completions in order."""
    rewards, out, report, mismatch, prompt_tokens = merged(batches)
    return GenBatch([r for b in batches for r in b.records], rewards, out, report, mismatch, prompt_tokens)


def screened(sample: Sampler, groups: list, screen: ScreenSettings) -> tuple[GenBatch, dict[str, float]]:
    """Screen every group with screen.size samples, expand the chosen ones by group_size − size: one batch
    (records stamped with their phase) and the counts of both phases."""
    first = sample(groups, screen.size)
    rewards: dict[int, list[float]] = {gid: [] for _, _, gid in groups}
    for r in first.records:
        r.provenance.phase = "screen"
        rewards[r.group_id].append(r.reward)
    chosen = set(to_expand(rewards, screen))
    wider = [g for g in groups if g[2] in chosen]
    second = sample(wider, screen.group_size - screen.size) if wider else empty_batch()
    for r in second.records:
        r.provenance.phase = "expand"
    tokens = [sum(map(len, b.out.completions)) for b in (first, second)]
    return join([first, second]), {
        "rollout/screen_groups": float(len(groups)), "rollout/screen_expanded_groups": float(len(wider)),
        "rollout/screen_samples": float(len(first.out.completions)),
        "rollout/expand_samples": float(len(second.out.completions)),
        "rollout/screen_tokens": float(tokens[0]), "rollout/expand_tokens": float(tokens[1])}


def economy_round(module, dm, planned: list, sample: Sampler) -> tuple[tuple, dict[str, float]]:
    """One round under the options on: (annotated records, rewards, generation output, score report,
    log-prob mismatch, prompt tokens) whole on every rank, and the round's rollout metrics."""
    eco = Economy.of(module)
    counts: dict[str, float] = {}

    def add(metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            counts[k] = counts.get(k, 0.0) + v

    if eco.stored_success:  # the bank learns from what the buffer holds: past rounds, harvested records
        dm.successes.observe([r for g in dm.buffer.groups.values() for r in g], eco.pass_threshold)

    def scored(groups: list) -> GenBatch:
        if eco.screen is not None:
            batch, screen_counts = screened(sample, groups, eco.screen)
            add(screen_counts)
        else:
            batch = sample(groups, eco.group_size)
        if eco.stored_success:
            copies = dm.successes.attach(batch.records, eco.pass_threshold)
            batch.records = batch.records + copies
            add({"rollout/stored_success_groups": float(len(copies))})
        return batch

    carried: list[ExperienceRecord] = []
    if eco.dynamic:
        carried = dm.carry.take() if eco.carry else []
        filled = fill_round(planned, dm.fresh_prompts, scored, eco.max_gen_batches, carried, eco.refill, eco.carry,
                            multiple=distributed.world_size())
        if eco.carry:
            dm.carry.hold(filled.surplus)
        batches, chosen, metrics = filled.batches, filled.chosen, filled.metrics
    else:
        batches = [scored(planned)]
        chosen, metrics = batches[0].records, {}
    # every group this round generated, the dropped ones too, as the data module's evidence (data=adaptive:
    # GRESO's runs of tied visits); a reused stored success is no visit, nor a carried group (its round counted it)
    getattr(dm, "generated", lambda records, carried_groups: None)(
        [r for b in batches for r in b.records if r.served_as != STORED], {r.group_id for r in carried})
    if eco.stored_success:
        counts["rollout/stored_success_bank"] = float(len(dm.successes))
    records = annotate_by_rank(lambda rs: positive_only(module.annotate(rs)), chosen)
    return (records, *merged(batches)), metrics | counts


def local_prompts(groups: list, k: int) -> list:
    """This rank's share of `groups` (whole groups), each repeated k times: the prompts it samples."""
    return [p for p in distributed.shard(groups) for _ in range(k)]


def no_samples() -> tuple[list[ExperienceRecord], list[float], GenerationOutput, ScoreReport, dict]:
    """A rank's share when it has no prompt in a batch (a small refill or expansion over several ranks)."""
    return [], [], GenerationOutput([], [], 0.0), ScoreReport([]), {}
