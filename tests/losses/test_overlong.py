"""DAPO's soft overlong penalty and truncation mask (losses/overlong.py) against hand-worked values."""
from __future__ import annotations

import pytest
import torch

from losses.overlong import overlong_penalty, truncated


def test_the_penalty_matches_the_hand_worked_values():
    """L_max = 20, L_cache = 4: no penalty up to 16 tokens, then (16 − |y|)/4 down to −1 at 20, −1 beyond."""
    lengths = torch.tensor([0, 10, 16, 17, 18, 19, 20, 25])
    want = torch.tensor([0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0, -1.0])
    assert torch.equal(overlong_penalty(lengths, max_len=20, cache_len=4), want)


def test_a_cache_as_long_as_the_limit_ramps_from_the_first_token():
    """L_cache = L_max = 6: |y| = 3 → (0 − 3)/6 = −0.5."""
    assert overlong_penalty(torch.tensor([0, 3, 6]), 6, 6).tolist() == [0.0, -0.5, -1.0]


@pytest.mark.parametrize("cache", [0, 7])
def test_a_cache_outside_1_to_the_limit_is_refused(cache):
    with pytest.raises(ValueError, match=f"overlong cache length {cache} must be in 1..6"):
        overlong_penalty(torch.tensor([1]), 6, cache)


def test_truncated_means_at_the_limit_without_a_stop_id():
    lengths = torch.tensor([6, 6, 5, 3])
    ended = torch.tensor([False, True, False, True])
    assert truncated(lengths, ended, 6).tolist() == [True, False, False, False]
