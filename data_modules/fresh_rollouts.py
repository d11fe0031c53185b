"""On-policy data: each round, `prompts_per_round` prompts × `group_size` fresh samples of the current
policy; an epoch serves the latest round `epochs_per_round` times (GRPO/PPO's μ). With `store` set,
every round is also written to disk (data_modules/store.py) for later runs to harvest."""
from __future__ import annotations

import random

from transformers import PreTrainedTokenizerBase

from data_modules.base import ExperienceDataModule
from data_modules.buffer import ExperienceBuffer
from data_modules.carry import SurplusCarry
from data_modules.experience import ExperienceRecord
from data_modules.state_checks import field, integer
from data_modules.store import ExperienceStore
from data_modules.stored_success import STORED, SuccessBank
from hardware import distributed
from tasks.base import Example, Task, encode_example


class FreshRolloutsDataModule(ExperienceDataModule):
    online = True

    def __init__(self, task: Task, tokenizer: PreTrainedTokenizerBase, batch_size: int, micro_batch_size: int, seed: int,
                 prompts_per_round: int, group_size: int, epochs_per_round: int, buffer_capacity: int,
                 store: str | None = None):
        super().__init__(task, tokenizer, batch_size, micro_batch_size, seed)
        self.prompts_per_round, self.group_size = prompts_per_round, group_size
        self.passes = epochs_per_round
        self.buffer = self.make_buffer(buffer_capacity)
        # rank 0 alone writes the store (every rank holds the whole round): two ranks writing one folder raced
        # for its file names (FileExistsError on the slower rank)
        self.store = ExperienceStore(store, tokenizer) if store and distributed.is_zero() else None
        self.cursor, self.next_group_id, self.rounds_put = 0, 0, 0
        self._order = list(range(len(task.train)))
        random.Random(seed).shuffle(self._order)
        self._encoded: dict[int, list[int]] = {}
        self.carry = SurplusCarry()  # algorithm.carry_surplus: dynamic sampling's surplus groups (data_modules/carry.py)
        self.successes = SuccessBank()  # algorithm.stored_success: one verified success per prompt (stored_success.py)

    def make_buffer(self, capacity: int) -> ExperienceBuffer:
        return ExperienceBuffer(capacity)

    @property
    def policy_version(self) -> int:
        """The module's run-wide policy version (trainers/base.py), that records are stamped with."""
        if self.trainer is None:
            return 0
        return getattr(self.trainer.lightning_module, "policy_version", self.trainer.global_step)

    @property
    def steps_per_round(self) -> int:
        return self.passes * self.prompts_per_round * self.group_size // self.batch_size

    def next_prompts(self, n: int | None = None) -> list[tuple[Example, list[int], int]]:
        """The next n (default prompts_per_round) (example, prompt ids, group id), in a seeded order."""
        return self.fresh_prompts(self.prompts_per_round if n is None else n)

    def fresh_prompts(self, n: int) -> list[tuple[Example, list[int], int]]:
        """The next n prompts of the stream, nothing else planned (dynamic sampling's refills)."""
        out = []
        for _ in range(n):
            idx = self._order[self.cursor % len(self._order)]
            self.cursor += 1
            if idx not in self._encoded:
                self._encoded[idx] = encode_example(self.tokenizer, self.task.train[idx], self.task.chat)
            out.append((self.task.train[idx], self._encoded[idx], self.next_group_id))
            self.next_group_id += 1
        return out

    def put(self, records: list[ExperienceRecord]) -> None:
        """Take one annotated round: into the buffer, and to the store if one is configured (after the
        reuse counts of the rounds it holds are brought up to date: ExperienceStore.sync)."""
        self.sync_store()
        self.buffer.put(records)
        if self.store is not None:
            self.store.write_round(records, self.rounds_put)
        self.rounds_put += 1

    def sync_store(self) -> None:
        """The store's prov_times_used as the records' reuse counts now (a no-op without a store)."""
        if self.store is not None:
            self.store.sync([r for group in self.buffer.groups.values() for r in group])

    def teardown(self, stage: str) -> None:
        self.sync_store()  # the end of the fit: the last round's counts

    def epoch_records(self) -> list[ExperienceRecord]:
        latest = self.buffer.latest()
        for r in latest:
            if getattr(r, "served_as", None) != STORED:  # a reused stored success keeps its own label (a
                # preference pair of online DPO/SPIN has none before this)
                r.served_as = "fresh"
        return latest

    def state_dict(self) -> dict:
        self.sync_store()  # a checkpoint and the store agree on the reuse counts
        store = {"store": self.store.state_dict()} if self.store is not None else {}
        return super().state_dict() | {"cursor": self.cursor, "next_group_id": self.next_group_id,
                                       "rounds_put": self.rounds_put, "buffer": self.buffer.state_dict(),
                                       "carry": self.carry.state_dict(), "successes": self.successes.state_dict()} | store

    def check_state(self, state: dict) -> None:
        super().check_state(state)
        ids = integer(field(state, "next_group_id"), "next_group_id")
        rounds = integer(state.get("rounds_put", 0), "rounds_put")
        integer(field(state, "cursor"), "cursor", high=self.max_cursor(ids, rounds))
        if "buffer" in state:
            self.buffer.check_state(state["buffer"], "buffer", ids)
        self.carry.check_state(state.get("carry", []), "carry", ids)  # .get: a checkpoint from before them
        self.successes.check_state(state.get("successes", {}), "successes", ids)

    def max_cursor(self, group_ids: int, rounds: int) -> int:
        """The farthest the prompt stream can have been read: one prompt per group id issued."""
        return group_ids

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.cursor, self.next_group_id = state["cursor"], state["next_group_id"]
        self.rounds_put = state.get("rounds_put", 0)
        if "buffer" in state:
            self.buffer.load_state_dict(state["buffer"])
        self.carry.load_state_dict(state.get("carry", []))
        self.successes.load_state_dict(state.get("successes", {}))
        if self.store is not None and "store" in state:
            self.store.load_state_dict(state["store"], self.buffer.groups)
