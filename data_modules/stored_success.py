"""Reuse of stored successes (`algorithm.stored_success.enabled`; AR3PO's response reuse, Zhang et al. 2025).

A prompt whose fresh group fails on every sample (each reward < `algorithm.pass_threshold`) gives GRPO no
gradient. If the prompt was seen before and one of its earlier samples passed, that verified success is
added to the group: one copy, served under its own label (`served_as = "stored_success"`), with its own
completion, behaviour log-probs and provenance (the policy version that sampled it; None for harvested
data), so the group now has signal without a new sample. Its advantage is computed with the group (the
fails' baseline includes it) and then clipped to ≥ 0 (positive-only: the stored sample can only be
pulled up), and its loss is truncated importance sampling, −sg(min(π/μ, C))·A·log π (losses/correction.py
`truncated_is`, C = `algorithm.stored_success.cap`), whatever the stage's correction (trainers/rollout.py).

The bank keeps one success per training prompt (by prompt text): the latest seen in the data module's buffer
(this run's rounds, and a harvested store's records when `data.harvest` is set). It is part of the data
module's checkpoint. Stored copies are never generated: they add no generated token and no record to
cost/records_generated; they are trained on, so their tokens are in cost/trained_tokens.
"""
from __future__ import annotations

import copy
import math

from data_modules.experience import ExperienceRecord
from data_modules.state_checks import StateError, field, integer, mapping, sequence
from data_modules.store import record_to_row, row_to_record

STORED = "stored_success"  # the label a reused success is served under (ExperienceRecord.served_as)
_RESET = ("ref_logprobs", "values", "returns", "token_advantages", "prox_logprobs")


class SuccessBank:
    def __init__(self):
        self.by_prompt: dict[str, ExperienceRecord] = {}

    def observe(self, records: list[ExperienceRecord], threshold: float) -> None:
        """Keep each prompt's latest verified success (reward ≥ threshold) among `records` (a stored copy is
        not a new success: skipped)."""
        for r in records:
            if r.served_as != STORED and r.reward >= threshold and r.prompt_text and r.behaviour_logprobs is not None:
                self.by_prompt[r.prompt_text] = _clean(r)

    def attach(self, records: list[ExperienceRecord], threshold: float) -> list[ExperienceRecord]:
        """One stored success for each group of `records` whose every reward is < threshold and whose prompt
        has one in the bank: the copies (group id of the group they join, served_as "stored_success",
        times_used 0), in the groups' order of appearance."""
        groups: dict[int, list[ExperienceRecord]] = {}
        for r in records:
            groups.setdefault(r.group_id, []).append(r)
        out = []
        for gid, group in groups.items():
            stored = self.by_prompt.get(group[0].prompt_text)
            if stored is None or any(r.reward >= threshold or r.served_as == STORED for r in group):
                continue
            reused = _clean(stored)
            reused.group_id, reused.served_as = gid, STORED
            out.append(reused)
        return out

    def __len__(self) -> int:
        return len(self.by_prompt)

    def state_dict(self) -> dict:
        return {prompt: record_to_row(r) for prompt, r in self.by_prompt.items()}

    def check_state(self, state, where: str, group_ids: int) -> None:
        for prompt, row in mapping(state, where).items():
            key = f"{where}[{prompt!r}]"
            if field(row, "prompt_text", key) != prompt:
                raise StateError(f"{key}.prompt_text", f"{row['prompt_text']!r} is not the prompt it is filed under")
            integer(field(row, "group_id", key), f"{key}.group_id", high=group_ids - 1)
            reward = field(row, "reward", key)
            if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
                raise StateError(f"{key}.reward", f"{reward!r} is not a finite number")
            tokens = len(sequence(field(row, "completion_ids", key), f"{key}.completion_ids"))
            logprobs = row.get("behaviour_logprobs")
            if logprobs is None or len(sequence(logprobs, f"{key}.behaviour_logprobs")) != tokens:
                raise StateError(f"{key}.behaviour_logprobs", f"not one log-prob per completion token ({tokens})")

    def load_state_dict(self, state: dict) -> None:
        self.by_prompt = {prompt: row_to_record(row) for prompt, row in state.items()}


def _clean(record: ExperienceRecord) -> ExperienceRecord:
    """A copy with its sample and provenance, and nothing a round's annotation or serving set."""
    out = copy.deepcopy(record)
    for name in _RESET:
        setattr(out, name, None)
    out.advantage, out.provenance.times_used = 0.0, 0
    return out


def positive_only(records: list[ExperienceRecord]) -> list[ExperienceRecord]:
    """Clip each stored success's advantage (and per-token advantages) to ≥ 0, after annotation."""
    for r in records:
        if r.served_as == STORED:
            r.advantage = max(r.advantage, 0.0)
            if r.token_advantages is not None:
                r.token_advantages = [max(a, 0.0) for a in r.token_advantages]
    return records
