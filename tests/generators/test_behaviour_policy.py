"""One behaviour policy: whatever the sampler settings (temperature, top-k, top-p), the log-probs the HF
generator records and the ones the trainer computes for the same tokens are of the same distribution,
so fresh data has importance ratio 1 and ESS 1 (issue 19: at top_p=0.7 the trainer used to score the
full softmax, and fresh data showed ratio 0.70, ESS 0.49, half the tokens clipped).

On the BPE chat model (500 tokens, random weights: a flat distribution, so top-k 20 and top-p 0.7 cut
away almost all of it). The same check for generator=vllm is in tests/generators/test_vllm.py."""
from __future__ import annotations

import pytest
import torch

from generators.hf import HFGenerator
from losses.correction import importance_diagnostics
from models.forward import sequence_token_logprobs
from tasks.base import encode_prompt
from tests.helpers import chat_model

SETTINGS = [  # (temperature, top_p, top_k)
    (1.0, 1.0, 0), (0.7, 1.0, 0), (1.0, 0.9, 0), (1.0, 1.0, 20), (0.7, 0.7, 20), (1.3, 0.5, 5)]


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    policy, tok = chat_model(tmp_path_factory.mktemp("chat"))
    return policy.eval(), tok


def right_padded(prompts, completions, pad_id):
    """[B, L] ids and mask of prompt + completion, right-padded as the trainer's batches are, and the
    [B, L-1] mask of the completion's target positions."""
    rows = [p + c for p, c in zip(prompts, completions)]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id)
    mask, targets = torch.zeros_like(ids), torch.zeros((len(rows), width - 1))
    for i, (p, r) in enumerate(zip(prompts, rows)):
        ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
        targets[i, len(p) - 1 : len(r) - 1] = 1
    return ids, mask, targets


def behaviour_on_targets(logprobs, targets):
    out = torch.zeros_like(targets)
    for i, lp in enumerate(logprobs):
        start = int(targets[i].nonzero()[0])
        out[i, start : start + len(lp)] = torch.tensor(lp)
    return out


@pytest.mark.parametrize("temperature,top_p,top_k", SETTINGS)
def test_fresh_samples_have_ratio_one_under_the_trainers_logprobs(chat, temperature, top_p, top_k):
    policy, tok = chat
    prompts = [encode_prompt(tok, q, chat=True) for q in ("12+34=", "7+8=", "99+1=", "5+50=")] * 4
    gen = HFGenerator(8, temperature=temperature, top_p=top_p, batch_size=16, top_k=top_k)
    torch.manual_seed(0)
    out = gen.sample(policy, tok, prompts)
    ids, mask, targets = right_padded(prompts, out.completions, tok.pad_token_id)
    with torch.no_grad():
        logp = sequence_token_logprobs(policy, ids, mask, temperature, top_k=top_k, top_p=top_p)
    behaviour = behaviour_on_targets(out.logprobs, targets)
    d = importance_diagnostics(logp, behaviour, targets)
    assert abs(d["ratio_mean"].item() - 1) < 1e-4 and abs(d["ratio_max"].item() - 1) < 1e-4, d
    assert d["ess_frac"].item() >= 0.9999, d
    if top_k or top_p < 1:  # the settings do cut: under the full softmax fresh data looks off-policy
        full = sequence_token_logprobs(policy, ids, mask, temperature)
        assert importance_diagnostics(full, behaviour, targets)["ratio_mean"].item() < 0.95
