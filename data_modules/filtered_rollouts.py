"""On-policy rounds that the algorithm filters in `annotate`: online DPO keeps each prompt's best and
worst sample as a pair, SPIN pairs each sample with its demonstration unless they are identical,
rejection sampling keeps the best of n above a threshold. So a round's size
varies, and `batch_size` counts what is kept (pairs or records). A round that kept nothing (every group
tied) is counted and the previous round is served again; only an empty first round is an error.

`max_examples` draws the prompts from the first N training examples only: the demonstrations an SFT stage
used (its data.max_examples), so SPIN's chosen answers are the ones SFT already had."""
from __future__ import annotations

from data_modules.fresh_rollouts import FreshRolloutsDataModule
from data_modules.preferences import collate_records
from data_modules.state_checks import integer
from hardware.console import say


class FilteredRolloutsDataModule(FreshRolloutsDataModule):
    online = True

    def __init__(self, max_examples: int | None, **kwargs):
        super().__init__(**kwargs)
        self.empty_rounds = 0
        if max_examples:  # the prompt stream keeps its seeded order, over the first max_examples only
            self._order = [i for i in self._order if i < max_examples]

    def put(self, records: list) -> None:
        if records:
            return super().put(records)
        self.empty_rounds += 1
        if not self.buffer.latest():
            raise RuntimeError("the first round kept nothing: no group of samples was usable (for online "
                               "DPO every group's rewards tied; for rejection sampling none reached "
                               "algorithm.threshold; for SPIN every sample equalled its demonstration). "
                               "Sample more per prompt (algorithm.group_size), more "
                               "prompts (data.prompts_per_round), or start from a stronger policy")
        if self.trainer is not None:
            say(self.trainer, f"[rollout] round kept nothing ({self.empty_rounds} so far); serving the previous one")

    def _collate(self, records: list):
        return collate_records(records, self.tokenizer.pad_token_id)

    def state_dict(self) -> dict:
        return super().state_dict() | {"empty_rounds": self.empty_rounds}

    def check_state(self, state: dict) -> None:
        super().check_state(state)
        integer(state.get("empty_rounds", 0), "empty_rounds")

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.empty_rounds = state.get("empty_rounds", 0)
