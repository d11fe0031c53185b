"""GRESO's calibrated skipping before rollout (data_modules/greso.py, data.policy.selection=greso) on hand-made
visits: the skip probabilities of given runs, the controller's step for a given measured tie share, the runs,
rank-identical draws, the checkpoint round trip and the refusals."""
from __future__ import annotations

import io
import random

import pytest
import torch

from data_modules.adaptive_policy import AdaptivePolicy
from data_modules.greso import GresoSkip, tie_kind
from data_modules.state_checks import StateError

PASS, FAIL, MIXED = [1.0] * 4, [0.0] * 4, [1.0, 0.0, 1.0, 1.0]


def skipper(**over) -> GresoSkip:
    kw = dict(target_tie_share=0.25, pass_share=1 / 3, explore_init=0.5, explore_step=0.01, explore_min=0.05,
              explore_max=0.95, revisit_floor=0.01, seed=3)
    return GresoSkip(**(kw | over))


def visit(g: GresoSkip, key: int, *groups: list[float]) -> None:
    for rewards in groups:
        g.observe(key, rewards, 0.5)


# ---- the rule, by hand ----------------------------------------------------------------------------
def test_skip_probability_grows_with_the_run_down_to_the_revisit_floor():
    g = skipper()
    # e = 0.5: p_skip = 1 − 0.5^k, until 0.5^k < 0.01 (k = 7: 0.0078) where the floor keeps 1%
    assert [g.skip_probability("pass", k) for k in (0, 1, 2, 3, 7, 20)] == pytest.approx(
        [0.0, 0.5, 0.75, 0.875, 0.99, 0.99])
    g.explore = {"pass": 0.9, "fail": 0.2}  # separate strengths: e_pass 0.9, e_fail 0.2
    assert g.skip_probability("pass", 2) == pytest.approx(1 - 0.81)
    assert g.skip_probability("fail", 2) == pytest.approx(1 - 0.04)
    assert g.skip_probability(None, 5) == 0.0


def test_a_tie_is_all_pass_or_all_fail_and_the_run_counts_consecutive_same_ties():
    assert tie_kind(PASS, 0.5) == "pass" and tie_kind(FAIL, 0.5) == "fail"
    assert tie_kind(MIXED, 0.5) is None
    assert tie_kind([0.7, 0.9], 0.5) is None  # both pass, but not tied: signal
    g = skipper()
    visit(g, 0, PASS, PASS, PASS)
    visit(g, 1, FAIL, FAIL, PASS)   # the kind changed: a new run of 1
    visit(g, 2, FAIL, FAIL, MIXED)  # signal: the run ends
    assert g.runs == {0: ["pass", 3], 1: ["pass", 1], 2: [None, 0]}


def test_the_controller_steps_each_strength_toward_its_target_share():
    """target 0.25, pass_share ⅓: t_pass = 1/12, t_fail = 1/6. 12 generated groups, 2 tied at pass (1/6 ≥ 1/12:
    skip more, e_pass 0.5 → 0.49), 1 at fail (1/12 < 1/6: skip less, e_fail 0.5 → 0.51)."""
    g = skipper()
    assert g.targets() == pytest.approx({"pass": 1 / 12, "fail": 1 / 6})
    for key in range(12):
        visit(g, key, PASS if key < 2 else FAIL if key == 2 else MIXED)
    g.observe(99, PASS, 0.5, generated=False)  # a harvested group: its run, not the round's share
    assert g.update() == pytest.approx({"pass": 2 / 12, "fail": 1 / 12})
    assert g.explore == pytest.approx({"pass": 0.49, "fail": 0.51})
    assert g.runs[99] == ["pass", 1]
    assert g.update() == pytest.approx({"pass": 2 / 12, "fail": 1 / 12})  # nothing generated: nothing moves
    assert g.explore == pytest.approx({"pass": 0.49, "fail": 0.51})


def test_the_controller_stays_within_its_bounds():
    g = skipper(explore_init=0.06, explore_step=0.05)
    visit(g, 0, PASS)
    visit(g, 1, FAIL)  # shares ½, ½: both above target, skip more, down to explore_min
    g.update()
    assert g.explore == pytest.approx({"pass": 0.05, "fail": 0.05})
    g = skipper(explore_init=0.94, explore_step=0.05)
    visit(g, 0, MIXED)  # no ties: skip less, up to explore_max
    g.update()
    assert g.explore == pytest.approx({"pass": 0.95, "fail": 0.95})


def test_the_walk_passes_over_settled_prompts_and_fills_in_when_one_pass_is_short():
    g = skipper(explore_init=0.0, explore_min=0.0, revisit_floor=0.0)  # p_skip = 1 for any run ≥ 1
    visit(g, 1, PASS)
    visit(g, 3, FAIL, FAIL)
    visit(g, 4, MIXED)
    walk = g.walk(iter(range(6)), budget=3)
    assert (walk.chosen, walk.looked, walk.skipped_pass, walk.skipped_fail) == ([0, 2, 4], 5, 1, 1)
    walk = g.walk(iter(range(6)), budget=5)  # 4 not passed over, so the first passed over (1) fills in
    assert (walk.chosen, walk.looked, walk.skipped_pass, walk.skipped_fail) == ([0, 2, 4, 5, 1], 6, 0, 1)


def test_draws_follow_the_seeded_rng_one_per_prompt_with_a_run():
    """Prompts 0..9 all with a pass run of 1 (p_skip 0.5): prompt i is passed over iff the i-th draw of
    random.Random(3) is < 0.5; a prompt with no run takes no draw."""
    g = skipper()
    for key in range(10):
        visit(g, key, PASS)
    visit(g, 10, MIXED)
    rng = random.Random(3)
    draws = [rng.random() for _ in range(10)]
    walk = g.walk(iter([10, *range(10)]), budget=11)
    taken = [10] + [k for k in range(10) if draws[k] >= 0.5]
    assert walk.chosen[: len(taken)] == taken
    assert walk.skipped_pass == 0  # budget 11 of 11: every passed-over prompt filled in


def test_every_rank_draws_alike_and_a_resumed_skipper_continues_exactly():
    """Two ranks (two objects, one seed, the same visits) decide alike; a third restored from a checkpoint of the
    first (saved with torch.save, loaded weights_only as a resume does) continues exactly."""
    ranks = [skipper(), skipper()]
    for g in ranks:
        for key in range(30):
            visit(g, key, PASS if key % 3 == 0 else FAIL if key % 3 == 1 else MIXED)
        g.update()
    first = [g.walk(iter(range(30)), budget=12) for g in ranks]
    assert first[0] == first[1]
    buf = io.BytesIO()
    torch.save(ranks[0].state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    resumed = skipper(seed=999, explore_init=0.9)
    resumed.check_state(state, "policy.greso", prompts=30)
    resumed.load_state_dict(state)
    for g in (ranks[0], resumed):
        visit(g, 5, PASS)
        g.update()
    assert resumed.walk(iter(range(30)), budget=12) == ranks[0].walk(iter(range(30)), budget=12)
    assert resumed.state_dict() == ranks[0].state_dict()


@pytest.mark.parametrize("path,value,key", [
    (("explore", "pass"), 1.5, "policy.greso.explore.pass"),
    (("runs",), {"7": ["pass", 0]}, "policy.greso.runs['7']"),
    (("runs",), {"40": ["pass", 2]}, "policy.greso.runs['40']"),
    (("runs",), {"1": ["maybe", 2]}, "policy.greso.runs['1']"),
    (("measured", "pass"), 9, "policy.greso.measured.pass"),
    (("rng",), [1, 2], "policy.greso.rng"),
])
def test_a_checkpointed_state_it_could_not_have_written_is_refused_by_key(path, value, key):
    g = skipper()
    visit(g, 1, PASS)
    state = g.state_dict()
    node = state
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    with pytest.raises(StateError) as e:
        skipper().check_state(state, "policy.greso", prompts=30)
    assert e.value.key == key


@pytest.mark.parametrize("key,value", [("target_tie_share", 1.5), ("pass_share", -0.1), ("explore_step", 2.0),
                                       ("explore_min", -0.5), ("explore_max", 1.5), ("revisit_floor", -0.01),
                                       ("explore_init", 0.99)])
def test_bad_values_are_refused_by_name(key, value):
    with pytest.raises(ValueError, match=rf"data\.policy\.greso\.{key}="):
        skipper(**{key: value})


def test_the_adaptive_policy_runs_greso_and_checkpoints_it():
    kw = dict(pass_threshold=0.5, decay=1.0, skip_margin=0.1, skip_confidence=0.95, min_ess_frac=0.5, max_kl=0.05,
              min_fresh_frac=0.1, max_fresh_frac=0.9, ema=1.0, usd_per_mtok_generated=0.5, usd_per_mtok_trained=1.0,
              seed=0)
    with pytest.raises(ValueError, match="data.policy.selection=greso needs data.policy.greso"):
        AdaptivePolicy(**kw, selection="greso")
    p = AdaptivePolicy(**kw, selection="greso", greso=skipper(explore_init=0.0, explore_min=0.0, revisit_floor=0.0))
    p.observe(2, PASS, 0)
    p.observe(3, MIXED, 0)
    assert p.greso.runs == {2: ["pass", 1], 3: [None, 0]} and p.evidence[2][0] == 4
    choice = p.greso_stream(iter(range(5)), budget=3, group_size=4, round_=1)
    assert (choice.seen, choice.skipped, choice.skipped_pass, choice.looked) == ([0, 1, 3], 1, 1, 4)
    state = p.state_dict()
    p.check_state(state, "policy", prompts=5, rounds=1)
    q = AdaptivePolicy(**kw, selection="greso", greso=skipper())
    q.load_state_dict(state)
    assert q.greso.state_dict() == p.greso.state_dict()
