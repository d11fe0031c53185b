"""tasks/tool_arithmetic.py: the split, the products, and the teacher's calls at `tool_rate`."""
from __future__ import annotations

import pytest

from tasks.tool_arithmetic import tool_arithmetic_task


def test_products_of_a_3_digit_and_a_2_digit_number_with_a_fixed_held_out_split():
    task = tool_arithmetic_task(3, 2, 50, "calculator", 1.0, 0)
    assert len(task.heldout) == 50 and len(task.train) == 900 * 90 - 50
    assert not {ex.prompt for ex in task.heldout} & {ex.prompt for ex in task.train[:5000]}
    for ex in task.train[:100] + task.heldout:
        a, b = map(int, ex.prompt.rstrip("=").split("*"))
        assert 100 <= a <= 999 and 10 <= b <= 99 and ex.answer == str(a * b)
        assert ex.meta["calls"] == [["calculator", f"{a}*{b}"]]
    assert tool_arithmetic_task(3, 2, 50, "calculator", 1.0, 0).heldout == task.heldout


def test_the_teacher_calls_the_tool_on_tool_rate_of_the_training_examples():
    task = tool_arithmetic_task(3, 2, 50, "calculator", 0.5, 0)
    share = sum(bool(ex.meta["calls"]) for ex in task.train[:2000]) / 2000
    assert 0.45 < share < 0.55
    assert all(ex.meta["calls"] for ex in task.heldout)  # held-out examples are scored, never demonstrated
    assert not any(ex.meta["calls"] for ex in tool_arithmetic_task(3, 2, 50, "calculator", 0.0, 0).train[:100])


@pytest.mark.parametrize("kw,key", [({"a_digits": 0}, "task.a_digits"), ({"num_heldout": 0}, "task.num_heldout"),
                                    ({"tool_rate": 1.5}, "task.tool_rate")])
def test_bad_settings_name_the_key(kw, key):
    args = dict(a_digits=1, b_digits=1, num_heldout=5, tool="calculator", tool_rate=1.0, seed=0) | kw
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        tool_arithmetic_task(**args)
