"""SFT data: the task's reference answers as demonstrations from a teacher (the task's exact solver
for arithmetic, the reference answers of a jsonl file). Off-policy data; provenance says so."""
from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from data_modules.base import ExperienceDataModule
from data_modules.experience import ExperienceRecord, Provenance
from tasks.base import Task, encode_completion, encode_prompt


class DemonstrationsDataModule(ExperienceDataModule):
    def __init__(self, task: Task, tokenizer: PreTrainedTokenizerBase, batch_size: int, micro_batch_size: int, seed: int,
                 source: str, max_examples: int | None = None):
        super().__init__(task, tokenizer, batch_size, micro_batch_size, seed)
        examples = demonstration_examples(task, max_examples)
        self.records = [self._record(ex, source, i) for i, ex in enumerate(examples)]
        # never trained on: callbacks/heldout_loss.py measures the held-out loss on them
        self.heldout_records = [self._record(ex, source, i) for i, ex in enumerate(task.heldout)]

    def _record(self, ex, source: str, index: int) -> ExperienceRecord:
        shown = ex.meta.get("demonstration", ex.answer)  # what the teacher wrote (a flawed teacher: not the answer)
        return ExperienceRecord(
            prompt_ids=encode_prompt(self.tokenizer, ex.prompt, self.task.chat),
            completion_ids=encode_completion(self.tokenizer, shown),
            provenance=Provenance(source=source, created_step=0,
                                  origin=ex.meta.get("origin", f"{self.task.name}:{index}")),
            group_id=index, prompt_text=ex.prompt, completion_text=shown, answer=ex.answer,
        )

    def epoch_records(self) -> list[ExperienceRecord]:
        return self.records


def demonstration_examples(task: Task, max_examples: int | None) -> list:
    """The training examples an epoch serves: the first `max_examples` (a demonstration budget), or all."""
    return task.train[:max_examples] if max_examples else task.train
