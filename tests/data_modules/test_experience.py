"""Experience records, their collation, the buffer, and the two data modules that serve them."""
from __future__ import annotations

import json

import pytest
import torch

from data_modules.buffer import ExperienceBuffer
from data_modules.demonstrations import DemonstrationsDataModule
from data_modules.experience import ExperienceRecord, Provenance, collate
from data_modules.fresh_rollouts import FreshRolloutsDataModule
from data_modules.tasks.arithmetic import arithmetic_task
from data_modules.tasks.jsonl import jsonl_task
from models.tokenizer import build_char_tokenizer

PAD = 77  # a visible pad id (not 0, so padding cannot hide among zero-initialised tensors)


def rec(prompt, completion, behaviour=None, ref=None, gid=0, version=None, reward=0.0, adv=0.0):
    return ExperienceRecord(prompt_ids=prompt, completion_ids=completion,
                            provenance=Provenance(source="policy_rollout", created_step=0,
                                                  policy_version=version),
                            group_id=gid, behaviour_logprobs=behaviour, ref_logprobs=ref,
                            reward=reward, advantage=adv)


# ---------------------------------------------------------------- collate
def test_collate_alignment_by_hand():
    """r1 = prompt [1,5,6] + completion [7,2] (L=5); r2 = prompt [1,5] + completion [8,2] (L=4).
    input_ids r1 [1,5,6,7,2], r2 [1,5,8,2,PAD]. Target position t predicts token t+1, so the completion
    tokens at indices 3,4 (r1) and 2,3 (r2) are predicted at t = 2,3 and t = 1,2:
    completion_mask r1 [0,0,1,1], r2 [0,1,1,0]; the log-probs land on exactly those positions."""
    r1 = rec([1, 5, 6], [7, 2], [-0.1, -0.2], [-0.3, -0.4], gid=4, version=3, reward=1.0, adv=0.5)
    r2 = rec([1, 5], [8, 2], [-1.0, -2.0], [-4.0, -5.0], gid=9, version=None, reward=0.0, adv=-0.5)
    b = collate([r1, r2], PAD)
    assert b.input_ids.tolist() == [[1, 5, 6, 7, 2], [1, 5, 8, 2, PAD]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    assert b.completion_mask.tolist() == [[0, 0, 1, 1], [0, 1, 1, 0]]
    assert torch.allclose(b.behaviour_logprobs, torch.tensor([[0, 0, -0.1, -0.2], [0, -1.0, -2.0, 0]]))
    assert torch.allclose(b.ref_logprobs, torch.tensor([[0, 0, -0.3, -0.4], [0, -4.0, -5.0, 0]]))
    assert b.rewards.tolist() == [1.0, 0.0] and b.advantages.tolist() == [0.5, -0.5]
    assert b.group_ids.tolist() == [4, 9] and b.policy_versions.tolist() == [3, 0]
    assert len(b) == 2 and b.records == [r1, r2]


def test_collate_mask_selects_exactly_the_completion_tokens():
    """For any lengths: input_ids[:, 1:][completion_mask] == completion_ids, and the behaviour log-probs
    read back under the mask are the record's own, in order."""
    g = torch.Generator().manual_seed(0)
    records = []
    for i in range(6):
        p = torch.randint(3, 50, (int(torch.randint(1, 6, (1,), generator=g)),), generator=g).tolist()
        c = torch.randint(3, 50, (int(torch.randint(1, 7, (1,), generator=g)),), generator=g).tolist()
        records.append(rec(p, c, behaviour=[-(i + 1) - 0.01 * j for j in range(len(c))]))
    b = collate(records, PAD)
    for i, r in enumerate(records):
        m = b.completion_mask[i].bool()
        assert b.input_ids[i, 1:][m].tolist() == r.completion_ids
        assert torch.allclose(b.behaviour_logprobs[i][m], torch.tensor(r.behaviour_logprobs))
        assert b.behaviour_logprobs[i][~m].abs().sum() == 0
        n = len(r.prompt_ids) + len(r.completion_ids)
        assert (b.input_ids[i, n:] == PAD).all() and b.attention_mask[i].sum() == n


def test_collate_without_ref_logprobs_everywhere_gives_none():
    b = collate([rec([1, 5], [7, 2], ref=[-1.0, -1.0]), rec([1], [8, 2])], PAD)
    assert b.ref_logprobs is None
    assert b.behaviour_logprobs.abs().sum() == 0  # no behaviour log-probs recorded: zeros


def test_batch_to_keeps_records_and_moves_tensors():
    b = collate([rec([1, 5], [7, 2], [-1.0, -2.0])], PAD)
    moved = b.to("cpu")
    assert moved.records is b.records and torch.equal(moved.input_ids, b.input_ids)


# ---------------------------------------------------------------- buffer
def test_buffer_evicts_whole_oldest_rounds():
    """capacity 5: A(3) + B(2) = 5 fits; + C(2) = 7 > 5 → evict A whole (3) → 4 left; D(6) alone exceeds
    capacity: B and C go, D stays (the latest round is never evicted)."""
    buf = ExperienceBuffer(capacity=5)
    a, b, c, d = ([rec([1], [2], gid=g) for _ in range(n)] for g, n in ((0, 3), (1, 2), (2, 2), (3, 6)))
    buf.put(a)
    buf.put(b)
    assert len(buf) == 5 and buf.evicted == 0
    buf.put(c)
    assert len(buf) == 4 and buf.evicted == 3 and [r[0].group_id for r in buf.rounds] == [1, 2]
    assert buf.latest() == c
    buf.put(d)
    assert len(buf) == 6 and buf.evicted == 7 and buf.latest() == d and len(buf.rounds) == 1


def test_buffer_rejects_nonpositive_capacity():
    with pytest.raises(ValueError, match="capacity"):
        ExperienceBuffer(0)
    assert ExperienceBuffer(3).latest() == []


# ---------------------------------------------------------------- demonstrations
def test_demonstrations_provenance_and_encoding():
    tok = build_char_tokenizer()
    task = arithmetic_task(digits=1, num_heldout=10, seed=0)
    dm = DemonstrationsDataModule(task, tok, batch_size=8, seed=0, source="teacher", max_examples=12)
    assert len(dm.records) == 12 and not dm.online
    for i, (r, ex) in enumerate(zip(dm.records, task.train)):
        assert r.provenance.source == "teacher" and r.provenance.policy_version is None
        assert r.provenance.origin == f"arithmetic1:{i}" and r.provenance.created_step == 0
        assert r.prompt_ids[0] == tok.bos_token_id
        assert r.completion_ids[-1] == tok.eos_token_id
        assert tok.decode(r.completion_ids[:-1]) == ex.answer == r.completion_text == r.answer
        assert tok.decode(r.prompt_ids, skip_special_tokens=True) == ex.prompt


def test_demonstrations_from_jsonl_keep_file_line_origin(tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [{"prompt": f"q{i}?", "answer": f"a{i}", "id": i} for i in range(5)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    task = jsonl_task(str(path), None, chat=False, num_heldout=1, prompt_key="prompt", answer_key="answer")
    dm = DemonstrationsDataModule(task, build_char_tokenizer(), batch_size=2, seed=0, source="teacher")
    assert [r.provenance.origin for r in dm.records] == ["qa.jsonl:1", "qa.jsonl:2", "qa.jsonl:3",
                                                         "qa.jsonl:4"]


def test_served_records_count_their_uses():
    """Every record is served once per epoch (passes=1) and times_used counts it; the order is a seeded
    shuffle that differs between epochs."""
    tok = build_char_tokenizer()
    task = arithmetic_task(digits=1, num_heldout=10, seed=0)
    dm = DemonstrationsDataModule(task, tok, batch_size=16, seed=0, source="teacher", max_examples=32)
    first = [r.group_id for batch in dm.train_dataloader() for r in batch.records]
    assert sorted(first) == list(range(32)) and first != list(range(32))
    assert all(r.provenance.times_used == 1 for r in dm.records)
    second = [r.group_id for batch in dm.train_dataloader() for r in batch.records]
    assert second != first and sorted(second) == sorted(first)
    assert all(r.provenance.times_used == 2 for r in dm.records) and dm.epochs_served == 2


# ---------------------------------------------------------------- fresh rollouts
def fresh(seed=0, prompts_per_round=3, group_size=4, epochs_per_round=1, batch_size=4):
    task = arithmetic_task(digits=1, num_heldout=4, seed=0, operands_max=3)  # 9 pairs → 5 train
    return FreshRolloutsDataModule(task, build_char_tokenizer(), batch_size=batch_size, seed=seed,
                                   prompts_per_round=prompts_per_round, group_size=group_size,
                                   epochs_per_round=epochs_per_round, buffer_capacity=100)


def test_next_prompts_cycle_through_a_seeded_order_with_fresh_group_ids():
    dm = fresh()
    got = dm.next_prompts() + dm.next_prompts()  # 6 prompts from 5 train examples: wraps once
    prompts = [ex.prompt for ex, _, _ in got]
    assert sorted(prompts[:5]) == sorted(ex.prompt for ex in dm.task.train)  # a permutation first
    assert prompts[5] == prompts[0]
    assert [gid for _, _, gid in got] == list(range(6))  # a new group id per prompt, never reused
    tok = dm.tokenizer
    assert all(ids == tok(ex.prompt)["input_ids"] for ex, ids, _ in got)
    assert [ex.prompt for ex, _, _ in fresh().next_prompts()] == prompts[:3]  # same seed, same order
    orders = {tuple(ex.prompt for ex, _, _ in fresh(seed=s).next_prompts()) for s in range(6)}
    assert len(orders) > 1  # the seed matters


def test_fresh_state_dict_restores_the_prompt_stream():
    dm = fresh()
    dm.next_prompts()
    state = dm.state_dict()
    expected = dm.next_prompts()
    other = fresh()
    other.load_state_dict(state)
    assert [(ex.prompt, g) for ex, _, g in other.next_prompts()] == [(ex.prompt, g) for ex, _, g in expected]


@pytest.mark.parametrize("ppr,group,mu,bs,steps", [(3, 4, 1, 4, 3), (4, 4, 2, 8, 4), (2, 8, 3, 16, 3)])
def test_steps_per_round(ppr, group, mu, bs, steps):
    """steps = μ · prompts · group / batch: 1·3·4/4 = 3; 2·4·4/8 = 4; 3·2·8/16 = 3."""
    dm = fresh(prompts_per_round=ppr, group_size=group, epochs_per_round=mu, batch_size=bs)
    assert dm.steps_per_round == steps


def test_fresh_serves_the_latest_round_mu_times():
    dm = fresh(prompts_per_round=2, group_size=4, epochs_per_round=2, batch_size=4)
    assert dm.online
    with pytest.raises(RuntimeError, match="no records"):
        dm.train_dataloader()
    old = [rec([1], [5, 2], gid=0) for _ in range(8)]
    new = [rec([1], [6, 2], gid=1 + i // 4) for i in range(8)]
    dm.put(old)
    dm.put(new)
    batches = list(dm.train_dataloader())
    assert len(batches) == dm.steps_per_round == 4
    served = [r for b in batches for r in b.records]
    assert all(any(r is n for n in new) for r in served)  # only the latest round
    assert all(r.provenance.times_used == 2 for r in new) and all(r.provenance.times_used == 0 for r in old)
