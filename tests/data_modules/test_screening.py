"""Screen, then expand (data_modules/screening.py, callbacks/round_economy.py `screened`): the expansion rule
and the counts of both phases, by hand; advantages within groups of unequal size."""
from __future__ import annotations

import pytest
import torch

from callbacks.round_economy import screened
from data_modules.screening import ScreenSettings, break_probability, moment, to_expand
from losses.advantages import group_relative_advantages
from tests.callbacks.test_dynamic_sampling import batch, group

S2 = ScreenSettings(size=2, group_size=8, min_signal=0.5, pass_threshold=0.5)
S4 = ScreenSettings(size=4, group_size=8, min_signal=0.5, pass_threshold=0.5)


def test_beta_moments_and_the_break_probability_by_hand():
    """E[p^6] under Beta(3, 1) = 3/4 · 4/5 · 5/6 · 6/7 · 7/8 · 8/9 = 3/9. Two passes of 8: P(break) = 2/3;
    four fails of 8: E[(1 − p)^4] under Beta(1, 5) → Beta(5, 1)'s E[p^4] = 5/9, P = 4/9. A screen with signal,
    or with nothing scored: 1."""
    assert moment(3, 1, 6) == pytest.approx(1 / 3)
    assert break_probability([1.0, 1.0], S2) == pytest.approx(2 / 3)
    assert break_probability([0.0] * 4, S4) == pytest.approx(4 / 9)
    assert break_probability([0.0, 1.0], S2) == 1.0 and break_probability([], S2) == 1.0


def test_which_screens_are_expanded():
    """min_signal 0.5, s = 4 of 8: all pass (4/9) and all fail (4/9) stay screens, 1 pass of 4 expands; at s = 2
    both ties expand (2/3), and at min_signal 0.7 neither does."""
    groups = {0: [1.0] * 4, 1: [0.0] * 4, 2: [0.0, 1.0, 0.0, 0.0]}
    assert to_expand(groups, S4) == [2]
    two = {0: [1.0, 1.0], 1: [0.0, 0.0], 2: [0.0, 1.0]}
    assert to_expand(two, S2) == [0, 1, 2]
    assert to_expand(two, ScreenSettings(2, 8, 0.7, 0.5)) == [2]


def test_screened_counts_both_phases_and_stamps_each_record():
    """Groups 10, 11, 12 screened with 4 samples each (3-token completions): 10 shows signal, 11 and 12 tie →
    only 10 is expanded by 4 more. Screen: 12 samples, 36 tokens; expansion: 4 samples, 12 tokens; the joined
    batch holds all 16 samples' completions and rewards (the ledger's generated tokens: 48)."""
    screen_rewards = {10: [0.0, 1.0, 1.0, 1.0], 11: [1.0] * 4, 12: [0.0] * 4}
    asked = []

    def sample(groups, k):
        asked.append(([g[2] for g in groups], k))
        return batch([group(g[2], screen_rewards[g[2]] if k == 4 and len(asked) == 1 else [1.0] * k)
                      for g in groups])

    planned = [(None, [1, 5], gid) for gid in (10, 11, 12)]
    joined, counts = screened(sample, planned, S4)
    assert asked == [([10, 11, 12], 4), ([10], 4)]
    assert counts == {"rollout/screen_groups": 3.0, "rollout/screen_expanded_groups": 1.0,
                      "rollout/screen_samples": 12.0, "rollout/expand_samples": 4.0,
                      "rollout/screen_tokens": 36.0, "rollout/expand_tokens": 12.0}
    assert len(joined.records) == len(joined.rewards) == 16 and sum(map(len, joined.out.completions)) == 48
    phases = [(r.group_id, r.provenance.phase) for r in joined.records]
    assert phases.count((10, "screen")) == 4 and phases.count((10, "expand")) == 4
    assert phases.count((11, "screen")) == 4 and (11, "expand") not in phases
    assert joined.prompt_tokens == 2 * 16  # 2 prompt tokens a sample, both phases


def test_advantages_are_computed_within_groups_of_unequal_size():
    """Group 7 (an unexpanded screen of 2): [1, 1] → 0, 0. Group 3 (expanded to 4): [1, 0, 0, 0]: mean 1/4,
    population std √(3/16) = 0.4330 → (1 − 1/4)/0.4330 = 1.7321, (0 − 1/4)/0.4330 = −0.5774. Interleaved ids:
    the groups are found by id, not position."""
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    ids = torch.tensor([3, 7, 3, 7, 3, 3])
    adv, stats = group_relative_advantages(rewards, ids)
    assert adv.tolist() == pytest.approx([1.7321, 0.0, -0.5774, 0.0, -0.5774, -0.5774], abs=1e-4)
    assert float(stats["frac_zero_std"]) == 0.5
