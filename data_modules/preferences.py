"""Typed preference data: paired records (DPO, IPO, reward model), unpaired labelled records (KTO),
their batches, and the data module base that serves them.

A batch sends chosen and rejected (or, for KTO, matched and mismatched) sequences through ONE
concatenated forward pass: `PreferenceBatch.sequences` holds 2B rows, chosen in rows [0, B) and
rejected in rows [B, 2B); its shapes are those of `ExperienceBatch` (input_ids [2B, L],
completion_mask [2B, L-1], ...). `ref_logps` [2B] are cached reference sequence log-probs (summed over
completion tokens) when every record has them, else None (the trainer computes them on the fly).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import torch

from data_modules.base import ExperienceDataModule
from data_modules.experience import ExperienceBatch, ExperienceRecord, Provenance, collate


@dataclass
class PreferenceRecord:
    """One prompt with a preferred (chosen) and a dispreferred (rejected) completion."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    provenance: Provenance
    group_id: int = 0
    prompt_text: str = ""
    chosen_text: str = ""
    rejected_text: str = ""
    answer: str | None = None
    chosen_reward: float | None = None  # the scores that ranked them, when a reward source did
    rejected_reward: float | None = None
    ref_chosen_logp: float | None = None  # cached reference sequence log-probs
    ref_rejected_logp: float | None = None
    chosen_source: str | None = None  # the chosen side's provenance source when no policy made it (SPIN:
    # "dataset", a demonstration; `provenance` is then the rejected sample's); None: both sides share `provenance`

    def chosen_provenance(self) -> Provenance:
        """The chosen completion's provenance: the pair's, or with `chosen_source` set, that source with
        no policy version, generator or sampling settings (it was not sampled)."""
        if self.chosen_source is None:
            return self.provenance
        return replace(self.provenance, source=self.chosen_source, policy_version=None, generator=None,
                       sampling=None, reward_source=None, reward_version=None)

    def sequences(self) -> tuple[ExperienceRecord, ExperienceRecord]:
        return (_sequence(self.prompt_ids, self.chosen_ids, self.chosen_provenance(), self.group_id),
                _sequence(self.prompt_ids, self.rejected_ids, self.provenance, self.group_id))

    @property
    def ref_logps(self) -> tuple[float | None, float | None]:
        return self.ref_chosen_logp, self.ref_rejected_logp

    def set_ref_logps(self, chosen: float, rejected: float) -> None:
        self.ref_chosen_logp, self.ref_rejected_logp = chosen, rejected


@dataclass
class UnpairedRecord:
    """KTO's unit: one completion labelled desirable or not. `kl_completion_ids` is another record's
    completion for this prompt (a mismatched pair, fixed at load time) on which KTO estimates its
    reference point KL(π ‖ π_ref)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    desirable: bool
    kl_completion_ids: list[int]
    provenance: Provenance
    group_id: int = 0
    prompt_text: str = ""
    completion_text: str = ""
    answer: str | None = None
    ref_logp: float | None = None
    ref_kl_logp: float | None = None

    def sequences(self) -> tuple[ExperienceRecord, ExperienceRecord]:
        return (_sequence(self.prompt_ids, self.completion_ids, self.provenance, self.group_id),
                _sequence(self.prompt_ids, self.kl_completion_ids, self.provenance, self.group_id))

    @property
    def ref_logps(self) -> tuple[float | None, float | None]:
        return self.ref_logp, self.ref_kl_logp

    def set_ref_logps(self, matched: float, mismatched: float) -> None:
        self.ref_logp, self.ref_kl_logp = matched, mismatched


def _sequence(prompt_ids, completion_ids, provenance, group_id) -> ExperienceRecord:
    return ExperienceRecord(prompt_ids=prompt_ids, completion_ids=completion_ids, provenance=provenance,
                            group_id=group_id)


@dataclass
class PreferenceBatch:
    """B records as 2B sequences (first halves, then second halves: chosen|rejected or matched|mismatched).

    sequences: ExperienceBatch with 2B rows; ref_logps [2B] or None; desirable [B] bool (KTO only)."""

    sequences: ExperienceBatch
    ref_logps: torch.Tensor | None
    records: list
    desirable: torch.Tensor | None = None

    def to(self, device) -> "PreferenceBatch":
        return replace(self, sequences=self.sequences.to(device),
                       ref_logps=None if self.ref_logps is None else self.ref_logps.to(device),
                       desirable=None if self.desirable is None else self.desirable.to(device))

    def __len__(self) -> int:
        return len(self.records)

    def split(self, size: int) -> list["PreferenceBatch"]:
        """Micro-batches of `size` records (2·size sequences each: first halves, then second halves)."""
        n = len(self)
        if size >= n:
            return [self]
        out = []
        for lo in range(0, n, size):
            hi = min(lo + size, n)
            rows = list(range(lo, hi)) + list(range(n + lo, n + hi))
            out.append(PreferenceBatch(
                self.sequences.select(rows), None if self.ref_logps is None else self.ref_logps[rows],
                self.records[lo:hi], None if self.desirable is None else self.desirable[lo:hi]))
        return out


def collate_preferences(records: list, pad_id: int) -> PreferenceBatch:
    """PreferenceRecords or UnpairedRecords → one PreferenceBatch (first halves, then second halves)."""
    firsts, seconds = zip(*(r.sequences() for r in records))
    refs = [r.ref_logps for r in records]
    has_ref = all(a is not None and b is not None for a, b in refs)
    ref = torch.tensor([a for a, _ in refs] + [b for _, b in refs], dtype=torch.float) if has_ref else None
    desirable = None
    if isinstance(records[0], UnpairedRecord):
        desirable = torch.tensor([r.desirable for r in records], dtype=torch.bool)
    return PreferenceBatch(collate(list(firsts) + list(seconds), pad_id), ref, list(records), desirable)


def collate_records(records: list, pad_id: int):
    """Collate any record type this project serves: experience records or preference records."""
    if records and isinstance(records[0], (PreferenceRecord, UnpairedRecord)):
        return collate_preferences(records, pad_id)
    return collate(records, pad_id)


def unpair(pairs: list[PreferenceRecord], seed: int) -> list[UnpairedRecord]:
    """Each pair → a desirable (prompt, chosen) and an undesirable (prompt, rejected) record (as KTO's
    authors do with paired data). Each record's KL completion is the completion of the record after
    it in a seeded shuffle, skipping any with the same prompt."""
    out = []
    for p in pairs:
        for ids, text, good in ((p.chosen_ids, p.chosen_text, True), (p.rejected_ids, p.rejected_text, False)):
            out.append(UnpairedRecord(p.prompt_ids, ids, good, [], replace(p.provenance), p.group_id,
                                      p.prompt_text, text, p.answer))
    return assign_kl_completions(out, seed)


def assign_kl_completions(records: list[UnpairedRecord], seed: int) -> list[UnpairedRecord]:
    """Fix each record's mismatched completion: that of the next record (cyclically) in a seeded
    order whose prompt differs. Fixed pairs let reference log-probs be cached."""
    if len({tuple(r.prompt_ids) for r in records}) < 2:
        raise ValueError("KTO needs records with at least two different prompts (for its KL estimate)")
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    for pos, i in enumerate(order):
        for step in range(1, len(order)):
            j = order[(pos + step) % len(order)]
            if records[j].prompt_ids != records[i].prompt_ids:
                records[i].kl_completion_ids = records[j].completion_ids
                break
    return records


@dataclass
class DataStats:
    """What loading did to the rows: logged once and reported in the run summary as data/*."""

    rows: int = 0
    records: int = 0
    heldout_records: int = 0
    truncated_rows: int = 0
    skipped_rows: int = 0
    first_skips: list[str] = field(default_factory=list)

    def skip(self, message: str) -> None:
        """Count a bad row skipped under data.skip_bad_rows=true (the first few are printed)."""
        self.skipped_rows += 1
        if len(self.first_skips) < 5:
            self.first_skips.append(message)

    def summary(self) -> dict[str, float]:
        return {f"data/{k}": float(v) for k, v in self.__dict__.items() if isinstance(v, int)}


class PreferenceDataModule(ExperienceDataModule):
    """Serves a fixed list of preference (or unpaired) records in seeded shuffles; `heldout_pairs` are
    never trained on and are what `callbacks.preference_eval` measures preference accuracy on."""

    def __init__(self, task, tokenizer, batch_size: int, micro_batch_size: int, seed: int):
        super().__init__(task, tokenizer, batch_size, micro_batch_size, seed)
        self.records: list = []
        self.heldout_pairs: list[PreferenceRecord] = []
        self.stats = DataStats()

    def epoch_records(self) -> list:
        return self.records

    def _collate(self, records: list) -> PreferenceBatch:
        return collate_preferences(records, self.tokenizer.pad_token_id)
