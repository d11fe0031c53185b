"""PPO's critic: V(s_t) for every target position of a batch, `algorithm.critic: shared | separate`.

    shared     a Linear(hidden, 1) head on the policy's own last hidden state: one forward of the policy
               (`output_hidden_states=True`) gives both the logits and the values; the backbone is the
               policy's, so the value loss also shapes the policy's features (InstructGPT-style PPO
               implementations mostly use a separate critic; a shared one halves the compute)
    separate   a deep copy of the policy's backbone with its own head: the critic learns without touching
               the policy's weights, at the cost of a second forward/backward and a second model's memory

`forward(input_ids [B, L], attention_mask [B, L], hidden_states [B, L, H] | None) → values [B, L-1]`,
aligned like `PolicyModule.sequence_logprobs`: values[:, t] is the value of the prefix input_ids[:, :t+1],
the state in which target token input_ids[:, t+1] is chosen. The head starts at zero (V ≡ 0), so the first
round's advantages are the plain returns.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import PreTrainedModel

from models.packing import decoder_hidden


def backbone_of(model: PreTrainedModel) -> nn.Module:
    """The transformer body (no LM head) of a causal LM, through a peft wrapper if there is one (the
    adapters stay active: they are injected into the base model's layers)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, base.base_model_prefix)


class ValueHead(nn.Module):
    """Linear(hidden, 1), zero-initialised, computed in float32 whatever the backbone's dtype."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """hidden_states [B, L, H] → values [B, L-1] (the last position predicts nothing)."""
        return self.linear(hidden_states[:, :-1].float()).squeeze(-1)


class SharedCritic(nn.Module):
    """A value head on the policy's backbone. The backbone is *not* registered as a submodule: its
    weights belong to the policy (registering them would save them twice and hand them to the optimizer
    twice); this module's parameters are the head's alone."""

    shares_policy_forward = True

    def __init__(self, policy: PreTrainedModel):
        super().__init__()
        self._backbone = (backbone_of(policy),)  # a tuple: kept out of the module tree on purpose
        self.head = ValueHead(policy.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                hidden_states: torch.Tensor | None = None) -> torch.Tensor:
        if hidden_states is None:
            hidden_states = decoder_hidden(self._backbone[0], input_ids, attention_mask)
        return self.head(hidden_states)


class SeparateCritic(nn.Module):
    """Its own copy of the policy's backbone (LoRA adapters merged in, all weights trainable) + a head."""

    shares_policy_forward = False

    def __init__(self, policy: PreTrainedModel):
        super().__init__()
        if hasattr(policy, "merge_and_unload"):  # peft: a plain backbone with the adapter folded in
            self.backbone = backbone_of(copy.deepcopy(policy).merge_and_unload())
        else:
            self.backbone = copy.deepcopy(backbone_of(policy))
        for p in self.backbone.parameters():
            p.requires_grad_(True)
        self.head = ValueHead(policy.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                hidden_states: torch.Tensor | None = None) -> torch.Tensor:
        if hidden_states is not None:
            raise ValueError("a separate critic runs its own backbone: pass no hidden_states")
        return self.head(decoder_hidden(self.backbone, input_ids, attention_mask))


CRITICS = {"shared": SharedCritic, "separate": SeparateCritic}


def build_critic(kind: str, policy: PreTrainedModel) -> nn.Module:
    """The critic named by `algorithm.critic` (shared | separate) for `policy`."""
    if kind not in CRITICS:
        raise ValueError(f"algorithm.critic={kind!r}: choose one of {sorted(CRITICS)}")
    return CRITICS[kind](policy)
