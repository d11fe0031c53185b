"""rollout/logp_mismatch_*: an engine whose log-probs are not the policy's own forward (vLLM) gets the
train/inference mismatch of each round measured against one policy forward (by hand: a constant
offset of 0.1 nats gives |Δ| = 0.1 and k3 = e^-0.1 − 1 + 0.1 per token); an exact engine gets none."""
from __future__ import annotations

import math

import pytest

from callbacks.regenerate import RegenerateExperience
from data_modules.experience import ExperienceRecord, Provenance, collate
from run.stages import build
from tests.helpers import TINY, tiny_model


class Engine:
    def __init__(self, exact: bool):
        self.exact_logprobs, self.name, self.sampling = exact, "fake", {}


def test_mismatch_by_hand(hydra_conf):
    policy, tok = tiny_model()
    module = build(hydra_conf(TINY + ["algorithm=grpo"]).algorithm, policy=policy, tokenizer=tok)
    records = [ExperienceRecord([1, 5, 6, 7], c, Provenance("policy_rollout", 0, 0)) for c in ([9, 10, 11], [12, 13])]
    true = module.frozen_logprobs(policy, collate(records, tok.pad_token_id))
    for r, lp in zip(records, true):
        r.behaviour_logprobs = [x + 0.1 for x in lp]
    got = RegenerateExperience(Engine(exact=False), reward=None)._logprob_mismatch(module, records)
    assert got["rollout/logp_mismatch_abs"] == pytest.approx(0.1, abs=1e-5)
    assert got["rollout/logp_mismatch_kl"] == pytest.approx(math.exp(-0.1) - 1 + 0.1, abs=1e-5)
    assert RegenerateExperience(Engine(exact=True), reward=None)._logprob_mismatch(module, records) == {}
