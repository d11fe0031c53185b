"""algorithm.shared_prefix (trainers/shared_prefix.py, models/shared_prefix.py): each distinct prompt computed
once gives the padded path's per-token log-probs, loss and parameter gradients, on the default in-code Llama
and on Qwen2 / Llama built from a config (the lean pass and Hugging Face's own cached forward), on groups of
mixed prompt and completion lengths, with micro-batches that cut a group, β > 0 (the reference's forward goes
the same way) and on episodes (observation tokens masked out of the loss)."""
from __future__ import annotations

import copy

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

from data_modules.experience import ExperienceRecord, Provenance, collate
from models.forward import sequence_token_logprobs
from models.shared_prefix import shared_prefix_logprobs
from tests.helpers import tiny_model
from tests.trainers.test_micro_batches import module_for, step_gradients
from trainers import shared_prefix

SMALL = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=128, eos_token_id=2, pad_token_id=0)
MODELS = {
    "tiny": lambda: tiny_model(seed=3)[0],
    "qwen2": lambda: AutoModelForCausalLM.from_config(transformers.Qwen2Config(**SMALL, num_key_value_heads=2)),
    "llama_gqa": lambda: AutoModelForCausalLM.from_config(transformers.LlamaConfig(**SMALL, num_key_value_heads=2)),
}


def group_records(prompts: int = 3, group: int = 4, seed: int = 0, episodes: bool = False) -> list[ExperienceRecord]:
    """`prompts` prompts of 2-12 tokens, `group` completions of 1-9 tokens each, interleaved so that a group's
    rows are not adjacent; episodes: every completion has an observation span masked out of the loss."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(prompts):
        prompt = [1] + torch.randint(4, 60, (1 + int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist()
        for _ in range(group):
            n = int(torch.randint(1, 10, (1,), generator=g)) + (3 if episodes else 0)
            completion = torch.randint(4, 60, (n,), generator=g).tolist()
            mask = [1] * (n - 3) + [0, 0] + [1] if episodes else None
            lp = (-3.0 - torch.rand(n, generator=g)).tolist()
            out.append(ExperienceRecord(prompt, completion, Provenance("policy_rollout", 0, policy_version=0),
                                        group_id=i, behaviour_logprobs=lp, loss_mask=mask,
                                        advantage=float(torch.randn(1, generator=g)), reward=1.0))
    return [out[j * group + i] for i in range(group) for j in range(prompts)]  # groups interleaved


def weighted_sum(lp: torch.Tensor, mask: torch.Tensor, seed: int = 1) -> torch.Tensor:
    w = torch.randn(lp.shape, generator=torch.Generator().manual_seed(seed))
    return (lp * w * mask).sum()


def grads(model, loss) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("generic", [False, True], ids=["lean", "hf_cache"])
def test_shared_prefix_logprobs_and_gradients_equal_the_padded_path(name, generic):
    torch.manual_seed(0)
    model = MODELS[name]().train()
    batch = collate(group_records(), pad_id=0)
    inputs = shared_prefix.regroup(batch)
    assert inputs.prompt_ids.shape[0] == 3 and inputs.rows.tolist()[:4] == [0, 1, 2, 0]
    mask = batch.completion_mask
    padded = sequence_token_logprobs(model, batch.input_ids, batch.attention_mask, 1.0)
    shared = shared_prefix_logprobs(model, inputs, 1.0, generic=generic)
    assert shared.shape == padded.shape
    assert torch.allclose(shared * mask, padded * mask, atol=1e-5), (shared * mask - padded * mask).abs().max()
    assert torch.equal(shared[mask == 0], torch.zeros_like(shared[mask == 0]))
    expected, got = grads(model, weighted_sum(padded, mask)), grads(model, weighted_sum(shared, mask))
    assert expected.keys() == got.keys()
    for n in expected:
        assert torch.allclose(got[n], expected[n], atol=1e-5), (n, (got[n] - expected[n]).abs().max())
    # the prompt's tokens get their gradient only through the shared prefix: a detached prefix would give 0
    embed = model.get_input_embeddings().weight
    prompt_only = sorted(set(inputs.prompt_ids[inputs.prompt_mask.bool()].tolist())
                         - set(inputs.completion_ids[inputs.completion_mask.bool()].tolist()))
    assert prompt_only and got[next(n for n, p in model.named_parameters() if p is embed)][prompt_only].abs().sum() > 0


def test_sampled_temperature_and_top_k_match_the_padded_path():
    model = MODELS["tiny"]().eval()
    batch = collate(group_records(seed=4), pad_id=0)
    mask = batch.completion_mask
    padded = sequence_token_logprobs(model, batch.input_ids, batch.attention_mask, 0.7, top_k=5)
    shared = shared_prefix.sequence_logprobs(model, batch, 0.7, top_k=5, top_p=1.0)
    assert torch.allclose(shared * mask, padded * mask, atol=1e-5)


def test_no_shared_prompt_keeps_the_padded_path():
    records = group_records(prompts=4, group=1)
    assert shared_prefix.regroup(collate(records, 0)) is None
    assert shared_prefix.sequence_logprobs(MODELS["tiny"](), collate(records, 0), 1.0, 0, 1.0) is None


@pytest.mark.parametrize("episodes", [False, True], ids=["single_turn", "episodes"])
def test_grpo_step_with_shared_prefix_equals_the_padded_step(hydra_conf, episodes):
    """One GRPO optimizer step (β = 0.04: reference log-probs annotated through each path; micro-batches of 5
    records cut the groups) gives the same loss and gradients with and without algorithm.shared_prefix."""
    padded, tok = module_for(hydra_conf, ["algorithm=grpo", "algorithm.loss_agg_mode=token_mean",
                                          "algorithm.shared_prefix=false"])
    shared, _ = module_for(hydra_conf, ["algorithm=grpo", "algorithm.loss_agg_mode=token_mean",
                                        "algorithm.shared_prefix=true"])
    assert shared.shared_prefix and not padded.shared_prefix
    shared.load_state_dict(padded.state_dict())
    records, twins = group_records(episodes=episodes), group_records(episodes=episodes)
    padded.annotate_reference(records)
    shared.annotate_reference(twins)
    for a, b in zip(records, twins):
        assert torch.allclose(torch.tensor(a.ref_logprobs), torch.tensor(b.ref_logprobs), atol=1e-5)
    calls = []
    original = shared_prefix.shared_prefix.shared_prefix_logprobs
    shared_prefix.shared_prefix.shared_prefix_logprobs = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        loss_s, grads_s = step_gradients(shared, collate(twins, tok.pad_token_id), micro=5)
    finally:
        shared_prefix.shared_prefix.shared_prefix_logprobs = original
    loss_p, grads_p = step_gradients(padded, collate(records, tok.pad_token_id), micro=5)
    # 12 records, groups interleaved p0 p1 p2 p0 p1 | p2 p0 p1 p2 p0 | p1 p2: the last micro-batch shares no
    # prompt and takes the padded path
    assert len(calls) == 2
    assert torch.allclose(loss_s, loss_p, atol=1e-6)
    assert sum(g is not None for g in grads_p) > 0
    for a, b in zip(grads_p, grads_s):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.allclose(a, b, atol=1e-6), (a - b).abs().max()


def test_train_py_runs_grpo_with_shared_prefix(tmp_path):
    """End to end: `python train.py algorithm=grpo algorithm.shared_prefix=true` trains (two steps, β > 0)."""
    import csv

    from tests.test_train_e2e import SMALL, train

    out = tmp_path / "run"
    proc = train(*SMALL, "experiment=single", "algorithm=grpo", "data=fresh_rollouts",
                 "trainer.max_steps=2", "logger=csv", "callbacks.evaluate=null", "callbacks.checkpoint=null",
                 "callbacks.plots=null", "trainer.enable_checkpointing=false", "algorithm.shared_prefix=true",
                 f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "shared_prefix: true" in (out / "config.yaml").read_text()
    rows = [r for f in out.rglob("metrics.csv") for r in csv.DictReader(f.open()) if r.get("train/loss")]
    assert len(rows) == 2 and all(float(r["train/kl"]) >= 0 for r in rows)
