"""Bradley-Terry reward model (`algorithm=reward_model`): a scalar head on the causal LM, trained on pairs.

The model is the policy's backbone under `AutoModelForSequenceClassification` with one label (for the
default Llama: LlamaForSequenceClassification, whose `score` head reads the last non-pad token).
When training ends it is saved to `algorithm.save_dir` (null: `<run dir>/reward_model`) with the
tokenizer, so `AutoModelForSequenceClassification.from_pretrained(dir)` loads it with no project code.

Scoring convention (what a scorer must reproduce): the reward is `logits[:, 0]` read at the last token
of the completion, with no eos (or other stop id of the policy) after it: input ids = the prompt encoded
as the policy's prompts are (bos + text for plain prompts) followed by the completion's tokens,
right-padded. For the default character tokenizer that is exactly `tokenizer(prompt + completion)`,
i.e. `rewards/reward_model.py` with template "{prompt}{completion}". `reward_model.json` in the folder
records this, and `rm_metrics.json` the held-out pair accuracy. The policy itself is not trained in this
stage.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from data_modules.preferences import PreferenceBatch, PreferenceDataModule, collate_preferences
from generators.base import stop_ids
from losses.preference import ranked_right
from trainers.base import PolicyModule, is_lora

SCORING = ("input_ids = prompt ids (bos + text) + completion ids without a final eos (or other stop id), "
           "right-padded with pad_token_id, i.e. tokenizer(prompt + completion); reward = logits[:, 0] (read "
           "at the last non-pad token)")


def drop_final_stop(input_ids: torch.Tensor, attention_mask: torch.Tensor, stops: torch.Tensor, pad_id: int):
    """Right-padded [N, L] sequences whose last token is a stop id (`stops` [S]: eos, a chat model's turn
    end; generators.base.stop_ids) → the same sequences ending one token earlier."""
    ids, mask = input_ids.clone(), attention_mask.clone()
    rows = torch.arange(ids.shape[0], device=ids.device)
    last = mask.sum(-1) - 1
    ends = torch.isin(ids[rows, last], stops.to(ids.device))
    ids[rows[ends], last[ends]] = pad_id
    mask[rows[ends], last[ends]] = 0
    return ids, mask


def reward_model_from(policy: PreTrainedModel, pad_token_id: int) -> PreTrainedModel:
    """A sequence-classification model (1 label) whose backbone is a copy of the policy's."""
    source = copy.deepcopy(policy).merge_and_unload() if is_lora(policy) else policy
    config = copy.deepcopy(source.config)
    config.num_labels, config.pad_token_id = 1, pad_token_id
    config.architectures = None
    model = AutoModelForSequenceClassification.from_config(config, dtype=source.dtype)
    backbone = getattr(model, model.base_model_prefix)
    backbone.load_state_dict(getattr(source, source.base_model_prefix).state_dict())
    return model


class RewardModelModule(PolicyModule):
    """`loss(chosen_scores, rejected_scores)` → (loss [B], metrics), losses.preference.bradley_terry_loss."""

    def __init__(self, loss: Callable, save_dir: str | None, annotate_batch_size: int, **kwargs):
        super().__init__(**kwargs)
        self.loss_fn, self.save_dir, self.annotate_batch_size = loss, save_dir, annotate_batch_size
        self.reward_model = reward_model_from(self.policy, self.tokenizer.pad_token_id)

    def scores(self, batch: PreferenceBatch) -> torch.Tensor:
        """Scalar rewards [2B] of the batch's 2B sequences through one forward pass."""
        seq = batch.sequences
        stops = torch.tensor(stop_ids(self.policy, self.tokenizer), dtype=torch.long)
        ids, mask = drop_final_stop(seq.input_ids, seq.attention_mask, stops, self.tokenizer.pad_token_id)
        return self.reward_model(input_ids=ids, attention_mask=mask).logits[:, 0].float()

    def micro_loss(self, batch: PreferenceBatch):
        if batch.desirable is not None:
            raise TypeError("algorithm=reward_model needs pairs, got unpaired records")
        n = len(batch)
        s = self.scores(batch)
        per_pair, metrics = self.loss_fn(s[:n], s[n:])
        return per_pair.mean(), metrics

    @torch.no_grad()
    def preference_metrics(self, pairs: list, batch_size: int) -> dict[str, float]:
        """pref_accuracy: share of held-out pairs scored r(chosen) > r(rejected) (ties ½); reward_margin:
        the mean gap."""
        was_training = self.reward_model.training
        self.reward_model.eval()
        right = margin = 0.0
        try:
            for lo in range(0, len(pairs), batch_size):
                batch = collate_preferences(pairs[lo: lo + batch_size], self.tokenizer.pad_token_id)
                s, n = self.scores(batch.to(self.device)), len(batch)
                right += ranked_right(s[:n], s[n:]).sum().item()
                margin += (s[:n] - s[n:]).sum().item()
        finally:
            self.reward_model.train(was_training)
        total = max(len(pairs), 1)
        return {"pref_accuracy": right / total, "reward_margin": margin / total}

    def on_fit_start(self) -> None:
        if not isinstance(self.trainer.datamodule, PreferenceDataModule):
            raise TypeError(f"algorithm=reward_model learns from preference pairs, but data module "
                            f"{type(self.trainer.datamodule).__name__} serves none: use data=static_preferences")

    def on_train_end(self) -> None:
        if self.trainer.is_global_zero:
            self.save(self.save_dir or str(Path(self.trainer.default_root_dir) / "reward_model"))

    def save(self, path: str) -> None:
        out = Path(path)
        self.reward_model.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        meta = {"kind": "bradley_terry_reward_model", "scoring": SCORING, "template": "{prompt}{completion}",
                "trained_steps": self.trainer.global_step}
        (out / "reward_model.json").write_text(json.dumps(meta, indent=2))
        pairs = getattr(self.trainer.datamodule, "heldout_pairs", None) if self._trainer is not None else None
        if pairs:
            metrics = self.preference_metrics(pairs, self.annotate_batch_size or self.micro_batch_size or len(pairs))
            (out / "rm_metrics.json").write_text(json.dumps({"heldout_pair_accuracy": metrics["pref_accuracy"],
                                                             "heldout_pairs": len(pairs)}, indent=2))

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        if isinstance(batch, PreferenceBatch):
            return batch.to(device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.reward_model.parameters() if p.requires_grad]
