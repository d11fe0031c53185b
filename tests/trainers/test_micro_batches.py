"""One optimizer step in micro-batches = one full-batch step: the accumulated gradients equal those of
the full-batch loss to 1e-5 for every loss shape (token mean, per-sequence mean, DPO pairs, PPO's
policy + value loss), with completions of different lengths so that a mean of micro-batch means would
differ. The step is driven by `PolicyModule.training_step` itself; only the optimizer is a recorder."""
from __future__ import annotations

import copy

import pytest
import torch

from data_modules.experience import ExperienceRecord, Provenance, collate
from data_modules.preferences import PreferenceRecord, collate_preferences
from run.stages import build
from tests.helpers import TINY, tiny_model


class GradRecorder:
    """Stands in for the optimizer: `step` records each parameter's gradient."""

    def __init__(self, params):
        self.params, self.grads = list(params), None

    def step(self):
        self.grads = [None if p.grad is None else p.grad.clone() for p in self.params]

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


def step_gradients(module, batch, micro: int | None):
    """Gradients of one `training_step` on `batch` with micro-batches of `micro` records."""
    recorder = GradRecorder(module.trainable_parameters())
    module.optimizers = lambda: recorder
    module.lr_schedulers = lambda: None
    module.manual_backward = lambda loss: loss.backward()
    module.log = module.log_dict = lambda *a, **k: None
    module.max_grad_norm = None
    type(module).micro_batch_size = property(lambda self: micro)
    try:
        loss = module.training_step(batch, 0)
    finally:
        del type(module).micro_batch_size  # the class property of PolicyModule again
    return loss, recorder.grads


def experience(n: int, seed: int = 0) -> list[ExperienceRecord]:
    """n records with prompts and completions of different lengths, rewards and behaviour log-probs."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = [1] + torch.randint(4, 60, (2 + i % 3,), generator=g).tolist()
        completion = torch.randint(4, 60, (1 + (i * 5) % 7,), generator=g).tolist()
        prov = Provenance("policy_rollout", created_step=0, policy_version=0)
        out.append(ExperienceRecord(prompt, completion, prov, group_id=i // 2,
                                    behaviour_logprobs=(-4.0 - torch.rand(len(completion), generator=g)).tolist(),
                                    reward=float(i % 3), advantage=float(i % 3) - 1.0))
    return out


def module_for(hydra_conf, overrides):
    policy, tok = tiny_model(seed=2)
    cfg = hydra_conf(TINY + overrides)
    return build(cfg.algorithm, policy=policy, tokenizer=tok), tok


def assert_same_step(module, batch, micro):
    full_module = copy.deepcopy(module)
    full_loss, full = step_gradients(full_module, batch, None)
    micro_loss, grads = step_gradients(module, batch, micro)
    assert torch.allclose(full_loss, micro_loss, atol=1e-5)
    assert sum(g is not None for g in full) > 0
    for a, b in zip(full, grads):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_grpo_micro_batches_give_the_full_batch_gradient(hydra_conf, agg):
    module, tok = module_for(hydra_conf, ["algorithm=grpo", f"algorithm.loss_agg_mode={agg}"])
    records = experience(7)
    module.annotate_reference(records)  # β > 0: reference log-probs, as a round's annotation makes them
    assert_same_step(module, collate(records, tok.pad_token_id), micro=3)  # 3 + 3 + 1 records


def test_sft_micro_batches_give_the_full_batch_gradient(hydra_conf):
    module, tok = module_for(hydra_conf, ["algorithm=sft"])
    assert_same_step(module, collate(experience(6), tok.pad_token_id), micro=4)


def test_ppo_micro_batches_give_the_full_batch_gradient(hydra_conf):
    module, tok = module_for(hydra_conf, ["algorithm=ppo", "algorithm.kl_in_reward=true"])
    records = experience(6)
    module.annotate(records)
    for r in records:  # a non-zero critic target so the value loss has a gradient too
        r.returns = [x + 1.0 for x in r.returns]
    assert_same_step(module, collate(records, tok.pad_token_id), micro=4)


def test_dpo_micro_batches_give_the_full_batch_gradient(hydra_conf):
    module, tok = module_for(hydra_conf, ["algorithm=dpo", "data=static_preferences", "algorithm.nll_coef=0"])
    recs = experience(10, seed=3)
    pairs = [PreferenceRecord(a.prompt_ids, a.completion_ids, b.completion_ids, a.provenance)
             for a, b in zip(recs[::2], recs[1::2])]
    assert_same_step(module, collate_preferences(pairs, tok.pad_token_id), micro=2)


def test_micro_batches_are_trimmed_to_their_own_longest_sequence():
    batch = collate(experience(7), 0)
    parts = batch.split(3)
    assert [len(p) for p in parts] == [3, 3, 1]
    for p in parts:
        assert p.input_ids.shape[1] == int(p.attention_mask.sum(-1).max())
        assert p.completion_mask.shape[1] == p.input_ids.shape[1] - 1
    assert sum(float(p.completion_mask.sum()) for p in parts) == float(batch.completion_mask.sum())
    assert batch.split(7) == [batch]


def test_dr_grpo_divides_by_a_constant_generation_budget(hydra_conf):
    """Dr. GRPO's seq_mean_token_sum_norm divides by generator.max_new_tokens, not by each batch's padded
    width: a batch's loss does not change when a longer record pads it wider (one record, advantage 1,
    on-policy: per-token loss −ratio·A = −1 on its 3 completion tokens → −3 / 8)."""
    module, tok = module_for(hydra_conf, ["algorithm=dr_grpo", "algorithm.beta=0", "generator.max_new_tokens=8"])
    assert module.loss_max_len == 8
    records = experience(3)
    for r in records:
        r.advantage = 1.0
        r.behaviour_logprobs = module.frozen_logprobs(module.policy, collate([r], tok.pad_token_id))[0]
    short = records[1]  # completion of 6 tokens
    alone, _ = module.micro_loss(collate([short], tok.pad_token_id))
    assert float(alone.detach()) == pytest.approx(-len(short.completion_ids) / 8, abs=1e-5)
    padded = collate(records, tok.pad_token_id)
    wide, _ = module.micro_loss(padded)
    each = [-len(r.completion_ids) / 8 for r in records]
    assert float(wide.detach()) == pytest.approx(sum(each) / 3, abs=1e-5)
