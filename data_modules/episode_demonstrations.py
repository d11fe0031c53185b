"""SFT data for an environment (`data=episode_demonstrations`): each training example's teacher episode,
the teacher's policy turns played against the environment (envs/rollout.py `demonstration`), so the
demonstrations hold exactly the tokens a rollout of the same turns would hold: sampled-turn ids with
loss, observation ids without (loss_mask 0). The `demonstrate` callable is passed in by the config
(`envs.rollout.demonstration` with the stage's `env`): data_modules/ does not import envs/."""
from __future__ import annotations

from typing import Callable

from transformers import PreTrainedTokenizerBase

from data_modules.demonstrations import DemonstrationsDataModule
from data_modules.experience import ExperienceRecord, Provenance
from tasks.base import Task


class EpisodeDemonstrationsDataModule(DemonstrationsDataModule):
    def __init__(self, task: Task, tokenizer: PreTrainedTokenizerBase, batch_size: int, micro_batch_size: int,
                 seed: int, source: str, max_examples: int | None, demonstrate: Callable):
        self.demonstrate = demonstrate
        super().__init__(task, tokenizer, batch_size, micro_batch_size, seed, source, max_examples)

    def _record(self, ex, source: str, index: int) -> ExperienceRecord:
        ep = self.demonstrate(tokenizer=self.tokenizer, example=ex, chat=self.task.chat)
        return ExperienceRecord(
            prompt_ids=ep.prompt_ids, completion_ids=ep.completion_ids, loss_mask=ep.loss_mask,
            turns=ep.turn_records(),
            provenance=Provenance(source=source, created_step=0,
                                  origin=ex.meta.get("origin", f"{self.task.name}:{index}")),
            group_id=index, prompt_text=ex.prompt, completion_text=self.tokenizer.decode(ep.completion_ids),
            answer=ex.answer)
