"""The shared LightningDataModule: serves a list of experience records as padded batches."""
from __future__ import annotations

import random

import lightning as L
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from data_modules.experience import ExperienceRecord, collate
from data_modules.state_checks import field, integer, within
from hardware import distributed
from tasks.base import Task


class ExperienceDataModule(L.LightningDataModule):
    """Subclasses say which records an epoch serves (`epoch_records`); this class batches them.

    `online` data modules are fed by `callbacks.regenerate.RegenerateExperience`; offline ones own
    their data from the start. Each epoch's order is a seeded shuffle, repeated `passes` times.
    A batch holds `batch_size` records (one optimizer step); the module runs it in micro-batches of
    `micro_batch_size` records (gradient accumulation, trainers/base.py). With W ranks, the loader
    yields the same global batches on every rank and each rank collates its share (records r, r+W, ...):
    `batch_size` stays the records of one optimizer step, W ranks × batch_size/W records each, and
    `micro_batch_size` is per rank. Every rank counts every record of the global batch as served, so
    reuse limits (and the buffer) agree across ranks.
    """

    online = False
    passes = 1  # times an epoch serves its records (GRPO/PPO's μ for online data)

    def __init__(self, task: Task, tokenizer: PreTrainedTokenizerBase, batch_size: int,
                 micro_batch_size: int, seed: int):
        super().__init__()
        self.task, self.tokenizer = task, tokenizer
        self.batch_size, self.micro_batch_size, self.seed = batch_size, micro_batch_size, seed
        self.epochs_served = 0

    def epoch_records(self) -> list[ExperienceRecord]:
        raise NotImplementedError

    def train_dataloader(self) -> DataLoader:
        records = self.epoch_records()
        if not records:
            raise RuntimeError(f"{type(self).__name__}: no records to serve (was a round generated?)")
        rng = random.Random(self.seed * 100_003 + self.epochs_served)
        order = []
        for _ in range(self.passes):
            order += rng.sample(records, len(records))
        self.epochs_served += 1
        self.check_rank_split()
        order = order[: len(order) // distributed.world_size() * distributed.world_size()]
        return DataLoader(order, batch_size=self.batch_size, shuffle=False,
                          collate_fn=self._serve, num_workers=0)

    def check_rank_split(self) -> None:
        """batch_size must split evenly over the ranks, and each rank's share into micro-batches."""
        w = distributed.world_size()
        share = self.batch_size // w
        micro = self.micro_batch_size or share
        if self.batch_size % w or (micro < share and share % micro):
            raise ValueError(f"data.batch_size={self.batch_size} over {w} ranks: it must be a multiple of the "
                             f"{w} ranks, and each rank's {self.batch_size / w:g} records a multiple of "
                             f"data.micro_batch_size={self.micro_batch_size}")

    def _serve(self, records: list):
        """One optimizer step's global batch: counted as served, this rank's share collated."""
        for r in records:
            r.provenance.times_used += 1
        return self._collate(distributed.shard(records))

    def _collate(self, records: list):
        return collate(records, self.tokenizer.pad_token_id)

    def state_dict(self) -> dict:
        return {"epochs_served": self.epochs_served}

    def load_state_dict(self, state: dict) -> None:
        with within(type(self).__qualname__):  # its key in the checkpoint
            self.check_state(state)  # the most derived class's check, all of it, before anything is taken
        self.epochs_served = state["epochs_served"]

    def check_state(self, state: dict) -> None:
        """StateError (data_modules/state_checks.py) for a state this module could not have written;
        each subclass checks its own keys and calls this."""
        integer(field(state, "epochs_served"), "epochs_served")
