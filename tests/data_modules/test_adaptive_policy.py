"""data=adaptive's decisions (data_modules/adaptive_policy.py) on hand-made statistics: which prompts get
fresh samples, when replay stops being servable, how the mix moves; determinism and the checkpoint."""
from __future__ import annotations

import math

import pytest

from data_modules.adaptive_policy import (AdaptivePolicy, ReplayMeasure, SourceMeasure, beta_cdf, beta_moment,
                                          expected_signal)

G = 8


def policy(**over) -> AdaptivePolicy:
    kw = dict(pass_threshold=0.5, decay=1.0, skip_margin=0.1, skip_confidence=0.95, min_ess_frac=0.5, max_kl=0.05,
              min_fresh_frac=0.1, max_fresh_frac=0.9, ema=1.0, usd_per_mtok_generated=0.5,
              usd_per_mtok_trained=1.0, seed=0)
    return AdaptivePolicy(**(kw | over))


def seen(p: AdaptivePolicy, key: int, passes: int, fails: int, round_: int = 0) -> None:
    p.observe(key, [1.0] * passes + [0.0] * fails, round_)


# ---- the maths, by hand ---------------------------------------------------------------------------
def test_beta_moments_and_signal_by_hand():
    # Beta(1, 1) = uniform: E[p^G] = 1/(G+1), so P(group not all equal) = 1 − 2/(G+1) = 7/9 for G = 8
    assert beta_moment(1, 1, G) == pytest.approx(1 / 9)
    assert expected_signal(1, 1, G) == pytest.approx(7 / 9)
    # Beta(41, 1) (40 of 40 passed): E[p^8] = 41/49, E[(1 − p)^8] = 8!/(42·…·49) ≈ 2e-9
    assert expected_signal(41, 1, G) == pytest.approx(8 / 49 - math.factorial(8) / math.prod(range(42, 50)), abs=1e-12)
    # Beta(a, 1): P(p ≤ x) = x^a
    assert beta_cdf(0.9, 41, 1) == pytest.approx(0.9**41)
    assert beta_cdf(0.3, 2, 5) == pytest.approx(0.579825)  # 1 − Σ_{j<2} C(6, j) 0.3^j 0.7^(6−j)


# ---- which prompts get fresh samples --------------------------------------------------------------
def test_skips_confidently_solved_and_hopeless_keeps_a_coin_flip_and_explores_unseen():
    p = policy()
    seen(p, 0, 40, 0)   # solved: P(p > 0.9) = 1 − 0.9^41 = 0.987 ≥ 0.95
    seen(p, 1, 0, 40)   # hopeless
    seen(p, 2, 20, 20)  # 50%: the most signal a group can have
    seen(p, 3, 3, 0)    # solved-looking but on little evidence: P(p > 0.9) = 1 − 0.9^4 = 0.34, kept
    assert p.confident(0, 0) == "solved" and p.confident(1, 0) == "hopeless"
    assert p.confident(2, 0) is None and p.confident(3, 0) is None
    choice = p.choose_prompts([0, 1, 2, 3], unseen=10, budget=3, group_size=G, round_=0)
    assert choice.skipped == 2 and 0 not in choice.seen and 1 not in choice.seen
    assert 2 in choice.seen
    assert choice.unseen >= 1  # unseen prompts are drawn from the prior: explored
    assert len(choice.seen) + choice.unseen == 3


def test_an_unseen_prompt_is_explored_over_a_seen_mediocre_one_often():
    """Thompson: an unseen prompt (Beta(1, 1), signal 7/9 expected) against one at 90% (signal ≈ 0.57)."""
    p = policy()
    seen(p, 0, 9, 1)
    picks = [p.choose_prompts([0], unseen=1, budget=1, group_size=G, round_=0).unseen for _ in range(200)]
    assert 0.3 < sum(picks) / len(picks) < 0.95  # explored, not always


def test_skipped_prompts_fill_in_when_nothing_else_is_left():
    p = policy()
    seen(p, 0, 40, 0)
    seen(p, 1, 0, 40)
    choice = p.choose_prompts([0, 1], unseen=0, budget=1, group_size=G, round_=0)
    assert choice.skipped == 2 and len(choice.seen) == 1


def test_old_evidence_fades_so_a_long_unseen_solved_prompt_is_tried_again():
    p = policy(decay=0.9)
    seen(p, 0, 40, 0, round_=0)
    assert p.confident(0, 0) == "solved"
    assert p.posterior(0, 10) == pytest.approx((1 + 40 * 0.9**10, 1.0))
    assert p.confident(0, 10) is None  # 14 passes' weight: P(p > 0.9) = 1 − 0.9^15 ≈ 0.79 < 0.95


def test_expected_zero_variance_share_of_the_chosen_groups():
    p = policy()
    seen(p, 0, 20, 20)
    choice = p.choose_prompts([0], unseen=0, budget=1, group_size=G, round_=0)
    assert choice.expected_zero_var == pytest.approx(1 - expected_signal(21, 21, G))


def test_non_binary_rewards_use_the_variance():
    p = policy(pass_threshold=None)
    p.observe(0, [0.3] * 8, 0)              # no spread at all: skipped
    p.observe(1, [0.1, 0.9] * 4, 0)
    p.observe(2, [0.4, 0.6] * 4, 0)
    assert p.confident(0, 0) == "solved" and p.confident(1, 0) is None
    assert p.variance(1, 0) == pytest.approx(0.16)
    assert p.signal(1, G, 0) > p.signal(2, G, 0) > p.signal(0, G, 0) == 0
    assert p.choose_prompts([0, 1, 2], unseen=0, budget=1, group_size=G, round_=0).seen == [1]


# ---- how long replay stays servable ---------------------------------------------------------------
def test_reuse_limit_from_measured_ess_and_kl():
    p = policy(min_ess_frac=0.5, max_kl=0.05)
    # healthy replay at staleness 2: ESS 0.9 → κ = −ln 0.9 / 2 = 0.0527 → ⌊ln 2 / κ⌋ = 13; KL 0.005 → ⌊0.05 / 0.0025⌋ = 20
    assert p.update_reuse(ReplayMeasure(ess_frac=0.9, kl=0.005, staleness=2), cap=8) == 8
    assert p.reuse_reason == "cap"
    # ESS fell below the bound at staleness 2: κ = −ln 0.4 / 2 → ⌊ln 2 / κ⌋ = ⌊2 ln 2 / ln 2.5⌋ = 1 < 2
    assert p.update_reuse(ReplayMeasure(ess_frac=0.4, kl=0.001, staleness=2), cap=8) == 1
    assert p.reuse_reason == "ess"
    # KL above max_kl at staleness 3: κ = 0.1 / 3 → ⌊0.05 / κ⌋ = 1
    assert p.update_reuse(ReplayMeasure(ess_frac=0.99, kl=0.1, staleness=3), cap=8) == 1
    assert p.reuse_reason == "kl"


def test_each_lever_switched_off_for_an_ablation():
    """select_prompts=false: the stream's next prompts, a solved one not skipped; adaptive_reuse=false: the
    cap alone, even where the measured ESS would cut reuse to 1 version."""
    p = policy(select_prompts=False)
    seen(p, 0, 40, 0)  # solved: the selection lever would skip it
    choice = p.choose_prompts([0], unseen=10, budget=3, group_size=G, round_=0)
    assert (choice.seen, choice.unseen, choice.skipped) == ([], 3, 0)
    assert choice.expected_zero_var == pytest.approx(1 - expected_signal(*p.pooled(0)[:2], G))
    q = policy(adaptive_reuse=False)
    assert q.update_reuse(ReplayMeasure(ess_frac=0.4, kl=0.001, staleness=2), cap=8) == 8  # on: 1 (above)
    assert q.reuse_reason == "cap" and q.update_reuse(None, cap=None) is None


def test_with_no_replay_measured_the_limit_probes_back_up_to_the_cap():
    p = policy()
    p.update_reuse(ReplayMeasure(ess_frac=0.05, kl=0.0, staleness=1), cap=3)
    assert p.limit == 0
    assert [p.update_reuse(None, cap=3) for _ in range(4)] == [1, 2, 3, 3]
    assert p.reuse_reason == "cap"
    q = policy()
    assert q.update_reuse(None, cap=None) is None  # no cap, nothing measured: no limit


# ---- the mix -----------------------------------------------------------------------------------------
def measures(fresh_adv, replay_adv, replay_ess=1.0, fresh_cost=2.0, replay_cost=1.0):
    return {"fresh": SourceMeasure(16, fresh_adv, 1.0, fresh_cost),
            "replay": SourceMeasure(16, replay_adv, replay_ess, replay_cost)}


def test_the_mix_moves_toward_the_source_with_more_value_per_cost():
    p = policy(ema=0.5, min_fresh_frac=0.0, max_fresh_frac=1.0)
    shares, reason = p.shares({"replay": True})
    assert reason == "start" and shares["fresh"] == pytest.approx(0.5)  # nothing measured: even
    p.update_values(measures(0.8, 0.8))  # u_fresh = 0.4, u_replay = 0.8
    shares, reason = p.shares({"replay": True})
    assert reason == "value" and shares["fresh"] == pytest.approx(1 / 3) and shares["replay"] == pytest.approx(2 / 3)
    p.update_values(measures(0.8, 0.8, replay_ess=0.1))  # replay degenerated: u_replay = 0.08; ū = 0.44
    assert p.values["replay"] == pytest.approx(0.44)
    assert p.shares({"replay": True})[0]["fresh"] == pytest.approx(0.4 / 0.84)


def test_the_mix_respects_its_bounds_and_an_empty_buffer():
    p = policy(min_fresh_frac=0.25, max_fresh_frac=0.75)
    p.update_values(measures(0.01, 1.0))
    shares, reason = p.shares({"replay": True})
    assert shares["fresh"] == 0.25 and reason == "min_fresh" and shares["replay"] == pytest.approx(0.75)
    p.update_values(measures(1.0, 0.0001))
    shares, reason = p.shares({"replay": True})
    assert shares["fresh"] == 0.75 and reason == "max_fresh"
    assert p.shares({"replay": False})[0]["fresh"] == 1.0  # nothing to replay
    shares, _ = p.shares({"replay": True, "harvest": True})  # harvest never measured: valued like the mean
    assert sum(shares.values()) == pytest.approx(1.0) and shares["harvest"] > 0


# ---- determinism and the checkpoint --------------------------------------------------------------------
def script(p: AdaptivePolicy) -> list:
    seen(p, 0, 5, 5)
    seen(p, 1, 9, 1)
    out = []
    for r in range(5):
        c = p.choose_prompts([0, 1], unseen=5, budget=2, group_size=G, round_=r)
        out.append((c.seen, c.unseen))
        p.observe(r + 10, [1.0, 0.0], r)
    return out


def test_decisions_are_deterministic_for_a_seed():
    assert script(policy(seed=3)) == script(policy(seed=3))
    assert any(script(policy(seed=s)) != script(policy(seed=3)) for s in range(4, 8))


def test_state_dict_round_trip_continues_identically():
    import copy
    import torch
    a = policy(seed=5, decay=0.95)
    script(a)
    a.update_values(measures(0.5, 0.7))
    a.update_reuse(ReplayMeasure(0.6, 0.01, 2.0), cap=8)
    state = copy.deepcopy(a.state_dict())
    path_state = torch.load(_save(state), weights_only=True)  # plain types: loadable as the checkpoint is
    b = policy(seed=99, decay=0.95)
    b.load_state_dict(path_state)
    assert b.state_dict() == a.state_dict()
    assert script(b) == script(a) and b.limit == a.limit and b.values == a.values


def _save(state) -> "io.BytesIO":
    import io
    import torch
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return buf


def test_bad_values_are_refused_by_name():
    with pytest.raises(ValueError, match="data.policy.decay=0"):
        policy(decay=0.0)
    with pytest.raises(ValueError, match="min_fresh_frac=0.9 at most max_fresh_frac=0.1"):
        policy(min_fresh_frac=0.9, max_fresh_frac=0.1)
    assert math.isfinite(policy().record_cost(10, 30))


def test_the_prior_of_unseen_prompts_follows_the_pooled_pass_rate():
    p = policy()
    assert p.pooled(0)[:2] == (1.0, 1.0)  # no evidence: Beta(1, 1)
    seen(p, 0, 17, 1)
    seen(p, 1, 8, 0)  # 25 of 26 passed: p̄ = 26 / 28
    a, b, _ = p.pooled(0)
    assert (a, b) == pytest.approx((2 * 26 / 28, 2 * 2 / 28))
    choice = p.choose_prompts([], unseen=5, budget=2, group_size=G, round_=0)
    assert choice.unseen == 2 and choice.expected_zero_var == pytest.approx(1 - expected_signal(a, b, G))
    assert choice.expected_zero_var > 1 - expected_signal(1, 1, G)  # a mostly solved task: more ties expected


def test_stream_selection_keeps_the_stream_order_and_skips_only_settled_prompts():
    """selection=stream (GRESO): prompts in the stream's order; a solved (3) and a hopeless (4) one skipped, a
    seen coin flip (5) and unseen ones taken where they come; the stream read up to the budget's last prompt;
    if one pass leaves too few, the skipped fill in, in stream order."""
    p = policy(selection="stream")
    seen(p, 3, 40, 0)
    seen(p, 4, 0, 40)
    seen(p, 5, 3, 3)
    c = p.filter_stream([2, 3, 4, 5, 6, 7], budget=3, group_size=G, round_=0)
    assert (c.seen, c.unseen, c.skipped, c.looked) == ([2, 5, 6], 0, 2, 5)
    # pooled pass rate (1 + 43) / (2 + 86) = 0.5: unseen prompts have the prior Beta(1, 1), signal 7/9
    assert c.expected_zero_var == pytest.approx((2 / 9 + (1 - expected_signal(4, 4, G)) + 2 / 9) / 3)
    c = p.filter_stream([3, 4, 2], budget=3, group_size=G, round_=0)
    assert (c.seen, c.skipped, c.looked) == ([2, 3, 4], 2, 3)
    with pytest.raises(ValueError, match="data.policy.selection='greedy'"):
        policy(selection="greedy")
