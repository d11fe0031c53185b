"""The experience buffer: whole groups in, whole rounds out, bounded by capacity."""
from __future__ import annotations

from collections import deque

from data_modules.experience import ExperienceRecord


class ExperienceBuffer:
    """Holds rounds of records; evicts the oldest round first once more than `capacity` records are held.

    A round is the list of records made by one regeneration; groups (records sharing a group_id) are
    never split, because a round is only added or evicted whole.
    """

    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError(f"buffer capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.rounds: deque[list[ExperienceRecord]] = deque()
        self.evicted = 0

    def put(self, records: list[ExperienceRecord]) -> None:
        self.rounds.append(list(records))
        while len(self) > self.capacity and len(self.rounds) > 1:
            self.evicted += len(self.rounds.popleft())

    def latest(self) -> list[ExperienceRecord]:
        return self.rounds[-1] if self.rounds else []

    def __len__(self) -> int:
        return sum(len(r) for r in self.rounds)
