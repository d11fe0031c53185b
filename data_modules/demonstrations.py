"""SFT data: the task's reference answers as demonstrations from a teacher (the task's exact solver
for arithmetic, the completions or answers of a jsonl file). Off-policy data; provenance says so. Loss on
the completion only. A conversational prompt-completion row (tasks/formats.py) is rendered with the chat
template: the prompt with the generation prompt, the completion as the template's continuation of it (its
end-of-turn token included); a prompt-only row has nothing to train on and is refused naming its line."""
from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from data_modules.base import ExperienceDataModule
from data_modules.experience import ExperienceRecord, Provenance
from tasks.base import Example, Task, encode_completion, encode_example
from tasks.formats import PROMPT_COMPLETION, SHAPES, encode_completion_after, trained_length
from tasks.jsonl import DataFileError


class DemonstrationsDataModule(ExperienceDataModule):
    def __init__(self, task: Task, tokenizer: PreTrainedTokenizerBase, batch_size: int, micro_batch_size: int, seed: int,
                 source: str, max_examples: int | None = None):
        super().__init__(task, tokenizer, batch_size, micro_batch_size, seed)
        examples = demonstration_examples(task, max_examples)
        self.records = [self._record(ex, source, i) for i, ex in enumerate(examples)]
        # never trained on: callbacks/heldout_loss.py measures the held-out loss on them
        self.heldout_records = [self._record(ex, source, i) for i, ex in enumerate(task.heldout)]

    def _record(self, ex: Example, source: str, index: int) -> ExperienceRecord:
        shown = ex.meta.get("demonstration", ex.answer)  # what the teacher wrote (a flawed teacher: not the answer)
        loc = ex.meta.get("origin", f"{self.task.name}:{index}")
        if not shown:
            raise DataFileError(f"{loc}: a prompt-only row: data=demonstrations trains on a completion "
                                f"({PROMPT_COMPLETION} {SHAPES[PROMPT_COMPLETION]} rows; see docs/datasets.md)")
        prompt_ids, loss_mask = encode_example(self.tokenizer, ex, self.task.chat), None
        if ex.messages is None and ex.completion_messages is None:
            completion_ids = encode_completion(self.tokenizer, shown)
        else:  # conversational: the template's own end-of-turn closes the completion; what the template
            completion = ex.completion_messages if "demonstration" not in ex.meta else shown  # writes after
            completion_ids = encode_completion_after(self.tokenizer, loc, ex.messages or ex.prompt, prompt_ids,
                                                     completion or shown, DataFileError)  # it does not train,
            n = trained_length(self.tokenizer, completion_ids)  # as in data=conversations
            loss_mask = None if n == len(completion_ids) else [1] * n + [0] * (len(completion_ids) - n)
        return ExperienceRecord(
            prompt_ids=prompt_ids, completion_ids=completion_ids, loss_mask=loss_mask,
            provenance=Provenance(source=source, created_step=0,
                                  origin=ex.meta.get("origin", f"{self.task.name}:{index}")),
            group_id=index, prompt_text=ex.prompt, completion_text=shown, answer=ex.answer,
        )

    def epoch_records(self) -> list[ExperienceRecord]:
        return self.records


def demonstration_examples(task: Task, max_examples: int | None) -> list:
    """The training examples an epoch serves: the first `max_examples` (a demonstration budget), or all."""
    return task.train[:max_examples] if max_examples else task.train
