"""RLOO and REINFORCE++-baseline advantages against numbers worked out by hand (derivations in the
docstrings); GRPO's own are in test_losses.py."""
from __future__ import annotations

import pytest
import torch

from losses.advantages import group_relative_advantages, reinforce_pp_advantages, rloo_advantages
from tests.losses.test_losses import GROUPS, REWARDS, close

ESTIMATORS = [rloo_advantages, reinforce_pp_advantages]


# ---------------------------------------------------------------- RLOO
def test_rloo_one_group_by_hand():
    """r = [1,0,0,1], k = 4. Leave one out: sample 0's baseline is mean(0,0,1) = 1/3 → A = 2/3; sample 1's
    is mean(1,0,1) = 2/3 → A = -2/3. The same from k/(k-1)·(r - mean) = 4/3 · (±.5) = ±2/3."""
    adv, stats = rloo_advantages(torch.tensor([1.0, 0, 0, 1]), torch.tensor([5, 5, 5, 5]))
    assert close(adv, [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    assert stats["frac_zero_std"].item() == 0.0 and stats["frac_singleton"].item() == 0.0


def test_rloo_groups_of_different_sizes_by_hand():
    """Group 0 = (1, 0, 0), k = 3: 1 - mean(0,0) = 1; 0 - mean(1,0) = -.5 (twice).
    Group 1 = (.5, 1), k = 2: .5 - 1 = -.5; 1 - .5 = .5."""
    adv, stats = rloo_advantages(torch.tensor([1.0, 0, 0, 0.5, 1]), torch.tensor([0, 0, 0, 1, 1]))
    assert close(adv, [1.0, -0.5, -0.5, -0.5, 0.5])
    assert stats["frac_zero_std"].item() == 0.0


def test_rloo_noncontiguous_ids_and_a_lone_sample_by_hand():
    """test_losses' batch: rewards [1, 0, .5, 0, 1, 1], groups [7, 3, 7, 3, 7, 9].
    Group 7 = (1, .5, 1): 1 - mean(.5,1) = .25; .5 - mean(1,1) = -.5; 1 - mean(1,.5) = .25.
    Group 3 = (0, 0): 0 - 0 = 0. Group 9 = (1) alone: no one to leave out → 0.
    frac_zero_std = groups 3 and 9 = 2/3; frac_singleton = group 9 = 1/3."""
    adv, stats = rloo_advantages(REWARDS, GROUPS)
    assert close(adv, [0.25, 0.0, -0.5, 0.0, 0.25, 0.0])
    assert close(stats["frac_zero_std"], 2 / 3) and close(stats["frac_singleton"], 1 / 3)


def test_rloo_scaled_by_the_batch_std_by_hand():
    """Same batch: A = [.25, 0, -.5, 0, .25, 0], batch mean 0, population var = (.0625+.25+.0625)/6 =
    .0625 → std .25 → A / .25 = [1, 0, -2, 0, 1, 0] (the batch's std, not any group's)."""
    adv, _ = rloo_advantages(REWARDS, GROUPS, scale_by_std=True)
    assert close(adv, [1.0, 0.0, -2.0, 0.0, 1.0, 0.0])


# ---------------------------------------------------------------- REINFORCE++-baseline
# Group 3 = samples 0, 2, 3, 6 = (1, 0, 0, 0); group 8 = samples 1, 4 = (1, 0); group 5 = sample 5 alone.
PP_REWARDS = torch.tensor([1.0, 1, 0, 0, 0, 1, 0])
PP_GROUPS = torch.tensor([3, 8, 3, 3, 8, 5, 3])


def test_reinforce_pp_by_hand():
    """c = r - group mean: group 3 (mean .25) → .75, -.25, -.25, -.25; group 8 (mean .5) → .5, -.5;
    group 5 → 0. So c = [.75, .5, -.25, -.25, -.5, 0, -.25], batch mean 0.
    Batch population var = (.5625 + .25 + 3·.0625 + .25 + 0)/7 = 1.25/7 = .178571 → std .422577.
    A = c / .422577 = [1.77482, 1.18322, -.59161, -.59161, -1.18322, 0, -.59161].
    (GRPO divides each group by its own std instead: group 3 by .43301 → 1.73205; group 8 by .5 → 1.)
    frac_zero_std = frac_singleton = group 5 alone = 1/3."""
    adv, stats = reinforce_pp_advantages(PP_REWARDS, PP_GROUPS)
    assert close(adv, [1.77482, 1.18322, -0.59161, -0.59161, -1.18322, 0.0, -0.59161])
    assert close(stats["frac_zero_std"], 1 / 3) and close(stats["frac_singleton"], 1 / 3)
    grpo, _ = group_relative_advantages(PP_REWARDS, PP_GROUPS)
    assert close(grpo[:2], [1.73205, 1.0])


def test_reinforce_pp_without_std_is_dr_grpo():
    """scale_by_std=False (OpenRLHF's no_std_norm): c = r - group mean, exactly Dr.GRPO's advantage."""
    adv, _ = reinforce_pp_advantages(PP_REWARDS, PP_GROUPS, scale_by_std=False)
    assert close(adv, [0.75, 0.5, -0.25, -0.25, -0.5, 0.0, -0.25])
    assert close(adv, group_relative_advantages(PP_REWARDS, PP_GROUPS, scale_by_std=False)[0])


def test_reinforce_pp_is_whitened_rloo_for_equal_groups():
    """With every group of size k, RLOO = k/(k-1)·c: one factor for the whole batch, which whitening
    removes, so REINFORCE++-baseline = RLOO scaled by the batch std. Groups (1,0,0) and (1,1,0): c = (2/3,
    -1/3, -1/3), (1/3, 1/3, -2/3); var = (4/9+4·1/9+4/9)/6 = 2/9 → std .47140 → A = c/.47140."""
    r, g = torch.tensor([1.0, 0, 0, 1, 1, 0]), torch.tensor([0, 0, 0, 1, 1, 1])
    adv, _ = reinforce_pp_advantages(r, g)
    assert close(adv, [1.41421, -0.70711, -0.70711, 0.70711, 0.70711, -1.41421])
    assert close(adv, rloo_advantages(r, g, scale_by_std=True)[0])


def test_reinforce_pp_all_equal_rewards_give_zero_not_nan():
    """Every reward equal: c = 0 everywhere and the batch var 0, floored at 1e-8 → A = 0 / 1e-4 = 0."""
    adv, stats = reinforce_pp_advantages(torch.ones(4), torch.tensor([0, 0, 1, 1]))
    assert torch.equal(adv, torch.zeros(4)) and stats["frac_zero_std"].item() == 1.0


# ---------------------------------------------------------------- both
@pytest.mark.parametrize("fn", ESTIMATORS)
def test_order_invariant(fn):
    """Permuting the samples permutes the advantages: groups are found by id, not position."""
    perm = torch.tensor([5, 3, 0, 4, 1, 2])
    adv, _ = fn(REWARDS, GROUPS)
    assert close(fn(REWARDS[perm], GROUPS[perm])[0], adv[perm])


@pytest.mark.parametrize("fn", ESTIMATORS)
def test_empty_round(fn):
    """A round where every sample was dropped: no advantages, NaN metrics (the zero-variance guard skips NaN)."""
    adv, stats = fn(torch.tensor([]), torch.tensor([], dtype=torch.long))
    assert adv.shape == (0,) and set(stats) == {"frac_zero_std", "frac_singleton"}
    assert all(torch.isnan(v) for v in stats.values())
