"""Offline preference data (`data=static_preferences`): pairs or KTO's unpaired rows from a local file,
or, with no file, synthetic pairs for the task (`data.synthetic`, the arithmetic generator by default).

Held-out pairs (`data.heldout_path`, or the last `data.num_heldout` rows; the synthetic generator's
pairs on held-out prompts) are never trained on: `callbacks.preference_eval` measures preference
accuracy on them. Algorithms that learn from unpaired examples (KTO) set `algorithm.unpaired=true`:
pairs are then split into a desirable and an undesirable record.

Lengths are fitted to the model's context when training starts (`setup`): a prompt that does not fit
is an error naming its file and row; completions that do not fit are cut to the room left after the
prompt and counted (`data/truncated_rows` in the summary); a pair whose chosen and rejected become
identical when cut is an error, never a silent truncation to nothing.
"""
from __future__ import annotations

from typing import Callable

from transformers import PreTrainedTokenizerBase

from data_modules.preference_files import Columns, PreferenceDataError, check_file, load_records
from data_modules.preferences import (PreferenceDataModule, PreferenceRecord, UnpairedRecord,
                                      assign_kl_completions, unpair)
from data_modules.state_checks import integer, sequence
from tasks.base import Task

NO_LIMIT = 1_000_000  # tokenizers without a real limit report ~1e30


class StaticPreferencesDataModule(PreferenceDataModule):
    def __init__(self, task: Task, tokenizer: PreTrainedTokenizerBase, batch_size: int, micro_batch_size: int, seed: int,
                 path: str | None, heldout_path: str | None, split: str, num_heldout: int,
                 columns: dict, chat: bool, unpaired: bool, skip_bad_rows: bool, max_length: int | None,
                 synthetic: Callable | None):
        super().__init__(task, tokenizer, batch_size, micro_batch_size, seed)
        self.max_length, self.fitted = max_length, False
        self.source = path or "synthetic"
        self.trains_on_task = path is None  # a file's pairs are not the task's: evaluating the task says nothing
        if path is None:
            if synthetic is None:
                raise ValueError("data.path is null and data.synthetic is null: nothing to load")
            train, heldout = synthetic(task=task, tokenizer=tokenizer)
            self.stats.rows = len(train) + len(heldout)
        else:
            args = (tokenizer, Columns(**columns), chat, split, skip_bad_rows, self.stats)
            train = load_records(path, *args)
            heldout = load_records(heldout_path, *args, key="data.heldout_path") if heldout_path else []
            if not heldout_path:
                train, heldout = split_heldout(path, train, num_heldout)
        self.records = self._form(train, unpaired, path)
        self.heldout_pairs = [r for r in heldout if isinstance(r, PreferenceRecord)]  # accuracy needs pairs
        self.stats.records, self.stats.heldout_records = len(self.records), len(self.heldout_pairs)
        if not self.records:
            raise PreferenceDataError(f"{self.source}: no usable training rows")

    def _form(self, records: list, unpaired: bool, path: str | None) -> list:
        is_pairs = isinstance(records[0], PreferenceRecord) if records else True
        check_form(path, is_pairs, unpaired)
        if unpaired:
            return unpair(records, self.seed) if is_pairs else assign_kl_completions(records, self.seed)
        return records

    def setup(self, stage: str) -> None:
        """Fit every record to the model's context once (the policy is known once fit starts)."""
        if self.fitted:
            return
        limit = min(self.max_length or NO_LIMIT, self.tokenizer.model_max_length or NO_LIMIT)
        module = self.trainer.lightning_module if self.trainer is not None else None
        context = getattr(getattr(getattr(module, "policy", None), "config", None), "max_position_embeddings", None)
        if context:
            limit = min(limit, context)
        for r in self.records + self.heldout_pairs:
            self.stats.truncated_rows += fit_to_context(r, limit)
        self.fitted = True
        self._report(limit)

    def state_dict(self) -> dict:
        """Also the cached reference log-probs: on resume they must stay those of the stage's initial
        policy, not be recomputed from the resumed weights."""
        return super().state_dict() | {"ref_logps": [r.ref_logps for r in self.records + self.heldout_pairs],
                                       "times_used": [r.provenance.times_used for r in self.records]}

    def check_state(self, state: dict) -> None:
        super().check_state(state)
        sequence(state.get("ref_logps", []), "ref_logps")
        for i, n in enumerate(sequence(state.get("times_used", []), "times_used")):
            integer(n, f"times_used[{i}]")

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        cached = state.get("ref_logps", [])
        if len(cached) == len(self.records) + len(self.heldout_pairs):
            for r, (first, second) in zip(self.records + self.heldout_pairs, cached):
                if first is not None and second is not None:
                    r.set_ref_logps(first, second)
        used = state.get("times_used", [])
        if len(used) == len(self.records):  # the reuse counts of the cost ledger
            for r, n in zip(self.records, used):
                r.provenance.times_used = n

    def _report(self, limit: int) -> None:
        s = self.stats
        print(f"[data] {self.source}: {s.rows} rows → {s.records} training records, {s.heldout_records} "
              f"held-out pairs; {s.truncated_rows} rows truncated to the model's context ({limit} tokens); "
              f"{s.skipped_rows} bad rows skipped", flush=True)
        for message in s.first_skips:
            print(f"[data]   skipped {message}", flush=True)


def split_heldout(path: str, train: list, num_heldout: int) -> tuple[list, list]:
    """(training rows, held-out rows): the last `num_heldout` usable rows of `path` are held out."""
    if not num_heldout:
        return train, []
    if num_heldout >= len(train):
        raise PreferenceDataError(f"{path}: data.num_heldout={num_heldout} but only {len(train)} usable rows")
    return train[: len(train) - num_heldout], train[len(train) - num_heldout:]


def check_form(path: str | None, is_pairs: bool, unpaired: bool) -> None:
    """Unpaired rows (prompt, completion, label) train KTO only."""
    if not unpaired and not is_pairs:
        raise PreferenceDataError(f"{path}: holds unpaired rows (prompt, completion, label), which only "
                                  f"algorithm=kto learns from; dpo, ipo and reward_model need "
                                  f"prompt/chosen/rejected pairs")


def planned_records(path: str | None, heldout_path: str | None, num_heldout: int, split: str, columns: dict,
                    unpaired: bool, skip_bad_rows: bool, synthetic_pairs: int | None) -> int | None:
    """The training records the module will serve per epoch, known before any tokenizer: the files are read
    and every row parsed (a bad row raises PreferenceDataError naming it, as at load time). With no file,
    `synthetic_pairs` pairs (None: not known until the stage runs). KTO serves a pair as two records."""
    if path is None:
        rows, is_pairs = synthetic_pairs, True
    else:
        found = check_file(path, Columns(**columns), split, skip_bad_rows)
        if heldout_path:
            check_file(heldout_path, Columns(**columns), split, skip_bad_rows, key="data.heldout_path")
        rows = found.good if heldout_path else len(split_heldout(path, range(found.good), num_heldout)[0])
        is_pairs = found.form == "paired"
        check_form(path, is_pairs, unpaired)
    if rows is None:
        return None
    return 2 * rows if unpaired and is_pairs else rows


def fit_to_context(record: PreferenceRecord | UnpairedRecord, limit: int) -> int:
    """Cut record's completions to `limit` - len(prompt) tokens; 1 if its own text was cut, else 0.
    Raises PreferenceDataError (naming the row) when the prompt leaves no room or when cutting makes
    chosen and rejected identical."""
    where = record.provenance.origin
    room = limit - len(record.prompt_ids)
    if room < 1:
        raise PreferenceDataError(f"{where}: the prompt is {len(record.prompt_ids)} tokens, the model's "
                                  f"context is {limit}: no room for a completion")
    if isinstance(record, UnpairedRecord):
        record.kl_completion_ids = record.kl_completion_ids[:room]  # another row's text, not counted
        cut = len(record.completion_ids) > room
        record.completion_ids = record.completion_ids[:room]
        return int(cut)
    cut = max(len(record.chosen_ids), len(record.rejected_ids)) > room
    if cut:
        record.chosen_ids, record.rejected_ids = record.chosen_ids[:room], record.rejected_ids[:room]
        if record.chosen_ids == record.rejected_ids:
            raise PreferenceDataError(f"{where}: chosen and rejected are identical once cut to the "
                                      f"{room} tokens the model's context ({limit}) leaves after the prompt")
    return int(cut)
