"""On-policy data: each round, `prompts_per_round` prompts × `group_size` fresh samples of the current
policy; an epoch serves the latest round `epochs_per_round` times (GRPO/PPO's μ)."""
from __future__ import annotations

import random

from transformers import PreTrainedTokenizerBase

from data_modules.base import ExperienceDataModule
from data_modules.buffer import ExperienceBuffer
from data_modules.experience import ExperienceRecord
from data_modules.tasks.base import Example, Task, encode_prompt


class FreshRolloutsDataModule(ExperienceDataModule):
    online = True

    def __init__(self, task: Task, tokenizer: PreTrainedTokenizerBase, batch_size: int, seed: int,
                 prompts_per_round: int, group_size: int, epochs_per_round: int, buffer_capacity: int):
        super().__init__(task, tokenizer, batch_size, seed)
        self.prompts_per_round, self.group_size = prompts_per_round, group_size
        self.passes = epochs_per_round
        self.buffer = ExperienceBuffer(buffer_capacity)
        self.cursor, self.next_group_id = 0, 0
        self._order = list(range(len(task.train)))
        random.Random(seed).shuffle(self._order)
        self._encoded: dict[int, list[int]] = {}

    @property
    def steps_per_round(self) -> int:
        return self.passes * self.prompts_per_round * self.group_size // self.batch_size

    def next_prompts(self) -> list[tuple[Example, list[int], int]]:
        """The next `prompts_per_round` (example, prompt ids, group id), cycling through a seeded order."""
        out = []
        for _ in range(self.prompts_per_round):
            idx = self._order[self.cursor % len(self._order)]
            self.cursor += 1
            if idx not in self._encoded:
                self._encoded[idx] = encode_prompt(self.tokenizer, self.task.train[idx].prompt, self.task.chat)
            out.append((self.task.train[idx], self._encoded[idx], self.next_group_id))
            self.next_group_id += 1
        return out

    def put(self, records: list[ExperienceRecord]) -> None:
        self.buffer.put(records)

    def epoch_records(self) -> list[ExperienceRecord]:
        return self.buffer.latest()

    def state_dict(self) -> dict:
        return super().state_dict() | {"cursor": self.cursor, "next_group_id": self.next_group_id}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.cursor, self.next_group_id = state["cursor"], state["next_group_id"]
