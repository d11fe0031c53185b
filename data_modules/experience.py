"""Typed experience: one record per (prompt, completion) with provenance, and its collated batch.

Shapes in `ExperienceBatch` (B sequences, L = longest prompt+completion, T = L - 1 target positions):
    input_ids [B, L]  attention_mask [B, L]       prompt then completion, right-padded
    completion_mask [B, T]                         1.0 where target token t+1 is a completion token
    behaviour_logprobs [B, T], ref_logprobs [B, T] aligned with completion_mask (0 elsewhere)
    rewards [B], advantages [B], group_ids [B], policy_versions [B]
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch


@dataclass
class Provenance:
    """Who made a record, with what, when. `policy_version` is the optimizer step of the weights that
    generated it (None for data no policy of this run generated)."""

    source: str  # policy_rollout | teacher | dataset | external_model | human
    created_step: int
    policy_version: int | None = None
    generator: str | None = None
    sampling: dict | None = None
    reward_source: str | None = None
    reward_version: str | None = None
    origin: str | None = None  # task name, or file:row for loaded data
    times_used: int = 0


@dataclass
class ExperienceRecord:
    prompt_ids: list[int]
    completion_ids: list[int]
    provenance: Provenance
    group_id: int = 0
    prompt_text: str = ""
    completion_text: str = ""
    answer: str | None = None
    behaviour_logprobs: list[float] | None = None  # one per completion token
    ref_logprobs: list[float] | None = None
    rewards: dict[str, float | None] = field(default_factory=dict)  # each reward source kept apart
    reward: float = 0.0  # the scalar trained on
    advantage: float = 0.0


@dataclass
class ExperienceBatch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    rewards: torch.Tensor
    advantages: torch.Tensor
    group_ids: torch.Tensor
    policy_versions: torch.Tensor
    records: list[ExperienceRecord]

    def to(self, device) -> "ExperienceBatch":
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v)
                 for k, v in self.__dict__.items()}
        return replace(self, **moved)

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def collate(records: list[ExperienceRecord], pad_id: int) -> ExperienceBatch:
    """Right-pad prompt+completion and align per-completion-token fields to target positions."""
    lengths = [len(r.prompt_ids) + len(r.completion_ids) for r in records]
    B, L = len(records), max(lengths)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention = torch.zeros((B, L), dtype=torch.long)
    cmask = torch.zeros((B, L - 1))
    behaviour = torch.zeros((B, L - 1))
    has_ref = all(r.ref_logprobs is not None for r in records)
    ref = torch.zeros((B, L - 1)) if has_ref else None
    for i, r in enumerate(records):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        input_ids[i, : p + c] = torch.tensor(r.prompt_ids + r.completion_ids)
        attention[i, : p + c] = 1
        span = slice(p - 1, p - 1 + c)  # target position t predicts token t + 1
        cmask[i, span] = 1.0
        if r.behaviour_logprobs is not None:
            behaviour[i, span] = torch.tensor(r.behaviour_logprobs)
        if has_ref:
            ref[i, span] = torch.tensor(r.ref_logprobs)
    return ExperienceBatch(
        input_ids=input_ids, attention_mask=attention, completion_mask=cmask,
        behaviour_logprobs=behaviour, ref_logprobs=ref,
        rewards=torch.tensor([r.reward for r in records], dtype=torch.float),
        advantages=torch.tensor([r.advantage for r in records], dtype=torch.float),
        group_ids=torch.tensor([r.group_id for r in records], dtype=torch.long),
        policy_versions=torch.tensor([r.provenance.policy_version or 0 for r in records]),
        records=records,
    )
