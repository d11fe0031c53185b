"""Surplus groups carried to the next round (`algorithm.carry_surplus`, with dynamic sampling).

Dynamic sampling (callbacks/dynamic_sampling.py) refills a round until it holds its target of groups with
signal; the last refill usually overshoots. Without the carry those surplus groups are scored and
discarded; with it they wait here, scored but not annotated, and the next round takes them first (one
round old: staleness = that round's optimizer steps, their provenance, behaviour log-probs and policy
version unchanged). A carried group is carried once: if the next round does not use it, it is discarded
(and counted in cost/records_filtered then). The held groups are part of the data module's checkpoint.
"""
from __future__ import annotations

from data_modules.experience import ExperienceRecord
from data_modules.state_checks import StateError, field, integer, sequence
from data_modules.store import record_to_row, row_to_record


class SurplusCarry:
    """The scored groups with signal that the last round made beyond its target, in generation order."""

    def __init__(self):
        self.records: list[ExperienceRecord] = []

    def hold(self, records: list[ExperienceRecord]) -> None:
        self.records = list(records)

    def take(self) -> list[ExperienceRecord]:
        """The held records (the holder is emptied: a group is carried at most once)."""
        out, self.records = self.records, []
        return out

    @property
    def groups(self) -> int:
        return len({r.group_id for r in self.records})

    def state_dict(self) -> list[dict]:
        return [record_to_row(r) for r in self.records]

    def check_state(self, rows, where: str, group_ids: int) -> None:
        """StateError naming `where[i]` unless every row is a record of a group id the module issued."""
        for i, row in enumerate(sequence(rows, where)):
            integer(field(row, "group_id", f"{where}[{i}]"), f"{where}[{i}].group_id", high=group_ids - 1)
            completion = sequence(field(row, "completion_ids", f"{where}[{i}]"), f"{where}[{i}].completion_ids")
            logprobs = row.get("behaviour_logprobs")
            if logprobs is not None and len(sequence(logprobs, f"{where}[{i}].behaviour_logprobs")) != len(completion):
                raise StateError(f"{where}[{i}].behaviour_logprobs",
                                 f"{len(logprobs)} log-probs for {len(completion)} completion tokens")

    def load_state_dict(self, rows) -> None:
        self.records = [row_to_record(row) for row in rows]
