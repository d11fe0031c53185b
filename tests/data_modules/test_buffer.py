"""The buffer's rules (DESIGN §5): whole groups, staleness, reuse, capacity by age or priority,
uniform and prioritized sampling, and an exact checkpoint round trip."""
from __future__ import annotations

import random

import pytest
import torch

from data_modules.buffer import ExperienceBuffer, group_priority
from data_modules.experience import ExperienceRecord, Provenance


def group(gid: int, version: int | None, n: int = 2, adv: float = 0.0, used: int = 0) -> list[ExperienceRecord]:
    return [ExperienceRecord(prompt_ids=[1, gid], completion_ids=[5, 2],
                             provenance=Provenance(source="policy_rollout", created_step=version or 0,
                                                   policy_version=version, times_used=used),
                             group_id=gid, behaviour_logprobs=[-0.5, -0.25], advantage=adv * (-1) ** i)
            for i in range(n)]


def test_staleness_drops_groups_older_than_max_and_keeps_harvested():
    """max_staleness 3 at version 10: groups made at 6 (age 4) go, at 7 (age 3) stay; a group with no
    version (harvested from another run) never goes stale."""
    buf = ExperienceBuffer(capacity=100, max_staleness=3)
    buf.put(group(0, 6) + group(1, 7) + group(2, None))
    buf.expire(version=10)
    assert list(buf.groups) == [1, 2]
    assert buf.evicted == 2 and buf.evicted_by == {"staleness": 2} and buf.evicted_unused == 2
    assert buf.oldest_staleness(10) == 3


def test_reuse_limit_drops_a_group_once_every_record_is_used_up():
    buf = ExperienceBuffer(capacity=100, max_reuse=2)
    a, b = group(0, 0), group(1, 0)
    buf.put(a + b)
    for r in a:
        r.provenance.times_used = 2
    b[0].provenance.times_used = 2  # b[1] still has a use left: the whole group stays
    buf.expire(version=0)
    assert list(buf.groups) == [1] and buf.evicted_by == {"reuse": 2} and buf.evicted_unused == 0


def test_capacity_evicts_oldest_groups_but_never_the_latest_round():
    """capacity 5: round 1 = groups 0,1 (4 records), round 2 = groups 2,3 (4): 8 > 5, evict group 0
    (oldest) → 6 > 5, evict group 1 → 4. Round 2 is protected even though it alone could overflow."""
    buf = ExperienceBuffer(capacity=5)
    buf.put(group(0, 0) + group(1, 0))
    buf.put(group(2, 1) + group(3, 1))
    assert list(buf.groups) == [2, 3] and buf.evicted == 4 and buf.latest_ids == [2, 3]
    buf.put(group(4, 2, n=6))
    assert list(buf.groups) == [4] and len(buf) == 6


def test_lowest_priority_eviction_keeps_the_informative_groups():
    """priority = mean |advantage|: groups 0 (|A|=1), 1 (0: rewards tied), 2 (0.5); capacity 4 after a
    new round of 2 records → two groups must go: 1 (priority 0) then 2 (0.5); 0 stays though oldest."""
    buf = ExperienceBuffer(capacity=4, eviction="lowest_priority")
    buf.put(group(0, 0, adv=1.0) + group(1, 0, adv=0.0) + group(2, 0, adv=0.5))
    buf.put(group(3, 1, adv=0.1))
    assert list(buf.groups) == [0, 3] and group_priority(buf.groups[0]) == 1.0


def test_uniform_sampling_returns_distinct_whole_groups():
    buf = ExperienceBuffer(capacity=100)
    buf.put([r for g in range(10) for r in group(g, 0)])
    ids = buf.sample_groups(4, random.Random(0))
    assert len(set(ids)) == 4 and all(len(buf.groups[g]) == 2 for g in ids)
    assert sorted(buf.sample_groups(50, random.Random(0))) == list(range(10))  # at most what it holds


def test_prioritized_sampling_prefers_high_advantage_groups():
    """Group 0 has |A| = 1, groups 1..9 have |A| ≈ 0 (ε = 1e-6): with α = 1 group 0 is drawn first
    essentially always; with uniform sampling only ~1 time in 10."""
    buf = ExperienceBuffer(capacity=100, sampling="prioritized")
    buf.put(group(0, 0, adv=1.0) + [r for g in range(1, 10) for r in group(g, 0)])
    firsts = [buf.sample_groups(1, random.Random(s))[0] for s in range(200)]
    assert firsts.count(0) == 200
    buf.sampling = "uniform"
    firsts = [buf.sample_groups(1, random.Random(s))[0] for s in range(200)]
    assert 5 < firsts.count(0) < 50


def test_state_dict_round_trips_exactly_through_torch_save(tmp_path):
    buf = ExperienceBuffer(capacity=5, max_staleness=4, max_reuse=3)
    buf.put(group(0, 0, adv=0.5, used=1) + group(1, 0))
    buf.put(group(2, 1) + group(3, 2, used=2))
    torch.save(buf.state_dict(), tmp_path / "b.pt")
    again = ExperienceBuffer(capacity=5, max_staleness=4, max_reuse=3)
    again.load_state_dict(torch.load(tmp_path / "b.pt", weights_only=True))
    assert again.groups == buf.groups and again.latest_ids == buf.latest_ids
    assert (again.evicted, again.evicted_unused, again.evicted_by) == (buf.evicted, buf.evicted_unused,
                                                                       buf.evicted_by)
    assert again.state_dict() == buf.state_dict()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="eviction"):
        ExperienceBuffer(10, eviction="newest")
    with pytest.raises(ValueError, match="sampling"):
        ExperienceBuffer(10, sampling="greedy")


def test_a_buffer_of_preference_pairs_round_trips_as_pairs():
    """Online DPO keeps PreferenceRecords in its buffer: they come back from a checkpoint as such."""
    from data_modules.preferences import PreferenceRecord
    pair = PreferenceRecord(prompt_ids=[1, 4], chosen_ids=[5, 2], rejected_ids=[6, 2], group_id=3,
                            provenance=Provenance(source="policy_rollout", created_step=2, policy_version=2),
                            chosen_reward=1.0, rejected_reward=0.0)
    buf = ExperienceBuffer(capacity=10)
    buf.put([pair])
    again = ExperienceBuffer(capacity=10)
    again.load_state_dict(buf.state_dict())
    assert again.groups == {3: [pair]} and isinstance(again.groups[3][0], PreferenceRecord)
