"""Dynamic sampling's sized refills (`algorithm.refill=measured`) and carried surplus groups
(`algorithm.carry_surplus`): callbacks/dynamic_sampling.py on constructed rounds, counts worked by hand."""
from __future__ import annotations

from callbacks.dynamic_sampling import fill_round, refill_size
from data_modules.carry import SurplusCarry
from data_modules.state_checks import StateError
from tests.callbacks.test_dynamic_sampling import batch, group

TIED, MIXED = [1.0, 1.0], [0.0, 1.0]


def test_refill_size_is_the_missing_groups_over_the_measured_share_with_signal():
    """missing 3 of 8, z = 6/8 tied: ⌈3 / 0.25⌉ = 12 → capped at a full batch, 8; z = 2/8: ⌈3 / 0.75⌉ = 4;
    z = 0: 3 (never fewer than missing); nothing measured with signal (z = 1): a full batch; 2 ranks: 4 → 4,
    3 → 4 (a multiple of the ranks)."""
    assert refill_size(3, 8, tied=6, generated=8) == 8
    assert refill_size(3, 8, tied=2, generated=8) == 4
    assert refill_size(3, 8, tied=0, generated=8) == 3
    assert refill_size(3, 8, tied=8, generated=8) == 8
    assert refill_size(1, 8, tied=4, generated=8, multiple=2) == 2
    assert refill_size(3, 8, tied=0, generated=8, multiple=2) == 4


def stream(plans: dict[int, list[list[float]]], start: int = 4):
    """more(n) hands out the next n group ids from `start`; scored(groups) scores group g with plans' rewards
    (MIXED when not planned)."""
    state = {"next": start}

    def more(n):
        ids = list(range(state["next"], state["next"] + n))
        state["next"] += n
        return ids

    def scored(ids):
        return batch([group(g, plans.get(g, MIXED)) for g in ids])
    return more, scored


def test_measured_refill_asks_for_the_missing_groups_only():
    """Target 4. Batch 1 (groups 0-3) = [M, T, T, T]: 1 with signal, z = 3/4: ⌈3 / 0.25⌉ = 12 → a full batch
    of 4 (4-7, all with signal: 5 ≥ 4, stop). Batch 1 = [M, M, M, T]: missing 1, z = 1/4: ⌈1 / 0.75⌉ = 2, so
    groups 4, 5 only (a full refill would generate 4): chosen 0, 1, 2, 4; surplus 5."""
    more, scored = stream({0: MIXED, 1: TIED, 2: TIED, 3: TIED})
    filled = fill_round([0, 1, 2, 3], more, scored, max_gen_batches=3, refill="measured")
    assert [len({r.group_id for r in b.records}) for b in filled.batches] == [4, 4]
    more, scored = stream({0: MIXED, 1: MIXED, 2: MIXED, 3: TIED})
    filled = fill_round([0, 1, 2, 3], more, scored, max_gen_batches=3, refill="measured")
    assert [sorted({r.group_id for r in b.records}) for b in filled.batches] == [[0, 1, 2, 3], [4, 5]]
    m = filled.metrics
    assert m["rollout/dynamic_refill_groups"] == 2 and m["rollout/dynamic_surplus_groups"] == 1
    assert m["rollout/dynamic_filtered_records"] == 2 + 2  # tied group 3 and surplus group 5, 2 records each
    assert sorted({r.group_id for r in filled.chosen}) == [0, 1, 2, 4]


def test_surplus_groups_are_carried_and_taken_first_next_round():
    """Round 1, target 4: groups 0-3 = [M, T, T, M] (2 with signal), a full refill 4-7 all MIXED → signal 6:
    chosen 0, 3, 4, 5; surplus 6, 7 carried (4 records, not filtered: filtered = the 2 tied groups' 4).
    Round 2, target 4, carried 6, 7 first: groups 8-11 = [T, M, T, T] → signal 3 < 4, refill: 12-15 all MIXED.
    Chosen: 6, 7 (carried, with their round-1 provenance), 9, 12; carried out: 13, 14, 15 (3 ≤ target 4)."""
    more, scored = stream({1: TIED, 2: TIED})
    first = fill_round([0, 1, 2, 3], more, scored, max_gen_batches=3, carry=True)
    assert sorted({r.group_id for r in first.chosen}) == [0, 3, 4, 5]
    assert sorted({r.group_id for r in first.surplus}) == [6, 7]
    assert first.metrics["rollout/dynamic_filtered_records"] == 4.0
    assert first.metrics["rollout/dynamic_carried_out_groups"] == 2.0
    holder = SurplusCarry()
    holder.hold(first.surplus)
    restored = SurplusCarry()
    restored.load_state_dict(holder.state_dict())  # through a checkpoint's plain rows
    carried = restored.take()
    assert restored.take() == [] and [r.provenance.policy_version for r in carried] == [0] * 4

    more2, scored2 = stream({8: TIED, 10: TIED, 11: TIED}, start=12)
    second = fill_round([8, 9, 10, 11], more2, scored2, 3, carried=carried, carry=True)
    assert [r.group_id for r in second.chosen][:4] == [6, 6, 7, 7]  # the carried groups first
    assert sorted({r.group_id for r in second.chosen}) == [6, 7, 9, 12]
    assert sorted({r.group_id for r in second.surplus}) == [13, 14, 15]
    m = second.metrics
    assert m["rollout/dynamic_carried_in_groups"] == 2 and m["rollout/dynamic_carried_out_groups"] == 3
    assert m["rollout/dynamic_generated_groups"] == 8 and m["rollout/dynamic_kept_groups"] == 4
    assert m["rollout/dynamic_filtered_records"] == 6.0  # groups 8, 10, 11 tied: 3 × 2 records


def test_a_carried_group_not_used_is_filtered_then_and_never_carried_twice():
    """Target 1, carried groups 6 and 7 (signal): the round's first batch is group 0 (MIXED). Chosen: 6 (the
    carried come first); 7 is surplus but was carried already: discarded (2 records) and group 0, generated
    this round, is carried (2 records)."""
    more, scored = stream({})
    carried = group(6, MIXED) + group(7, MIXED)
    filled = fill_round([0], more, scored, max_gen_batches=2, carried=carried, carry=True)
    assert {r.group_id for r in filled.chosen} == {6} and {r.group_id for r in filled.surplus} == {0}
    assert filled.metrics["rollout/dynamic_filtered_records"] == 2.0


def test_carry_state_is_checked_before_it_is_taken():
    holder = SurplusCarry()
    holder.hold(group(3, MIXED))
    rows = holder.state_dict()
    holder.check_state(rows, "carry", group_ids=4)
    import pytest
    with pytest.raises(StateError, match=r"carry\[0\].group_id: 3 is out of range \[0, 2\]"):
        holder.check_state(rows, "carry", group_ids=3)
    rows[1]["behaviour_logprobs"] = [0.0]
    with pytest.raises(StateError, match=r"carry\[1\].behaviour_logprobs: 1 log-probs for 3"):
        holder.check_state(rows, "carry", group_ids=4)
