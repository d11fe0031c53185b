"""Under LoRA every algorithm's reference is the policy with its adapter disabled (no second copy of
the weights): GRPO's and PPO's reference log-probs are exactly the base model's, also after the
adapter has moved away from zero."""
from __future__ import annotations

import copy

import pytest
import torch

from data_modules.experience import ExperienceRecord, Provenance, collate
from models.lora import apply_lora
from run.stages import build
from tests.helpers import TINY, tiny_model

LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_rollout_reference_is_the_adapter_disabled_base(hydra_conf, algorithm):
    base, tok = tiny_model(seed=1)
    frozen_base = copy.deepcopy(base).eval()
    policy = apply_lora(base, LORA)
    for name, p in policy.named_parameters():  # move the adapter: the policy now differs from the base
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    module = build(hydra_conf(TINY + [f"algorithm={algorithm}", "algorithm.beta=0.04"]).algorithm,
                   policy=policy, tokenizer=tok)
    assert module.use_reference and module.reference is None
    assert not any("reference" in name for name, _ in module.named_parameters())
    records = [ExperienceRecord([1, 5, 6], [9, 10, 11, 12], Provenance("policy_rollout", 0, 0),
                                behaviour_logprobs=[-1.0] * 4)]
    module.annotate_reference(records)
    batch = collate(records, tok.pad_token_id)
    want = module.frozen_logprobs(frozen_base, batch)[0]
    policy_now = module.frozen_logprobs(policy, batch)[0]
    assert torch.allclose(torch.tensor(records[0].ref_logprobs), torch.tensor(want), atol=1e-5)
    assert not torch.allclose(torch.tensor(policy_now), torch.tensor(want), atol=1e-3)  # adapter is on again
    assert policy.training  # mode restored after the reference forward
