"""Each component checks the state a checkpoint hands it (types, ranges, references) and names the key:
a state it wrote itself passes; a changed one is refused before anything is taken."""
from __future__ import annotations

import math
import random

import pytest

from callbacks.regenerate import RegenerateExperience
from data_modules.buffer import ExperienceBuffer
from data_modules.state_checks import StateError, python_rng
from tests.data_modules.test_adaptive_policy import policy, seen
from tests.data_modules.test_buffer import group


def filled_buffer() -> ExperienceBuffer:
    buf = ExperienceBuffer(capacity=4, max_staleness=1)
    buf.put(group(0, 0) + group(1, 0))
    buf.put(group(2, 2) + group(3, 2))  # capacity: 0 and 1 go
    buf.expire(version=2)
    return buf


def refused(check, key: str, state) -> str:
    with pytest.raises(StateError) as e:
        check(state)
    assert e.value.key == key, str(e.value)
    return e.value.problem


def test_the_buffer_takes_its_own_state_and_refuses_ids_never_issued_and_counts_that_do_not_add_up():
    state = filled_buffer().state_dict()
    check = lambda s: ExperienceBuffer(capacity=4).check_state(s, "buffer", group_ids=4)  # noqa: E731
    check(state)
    assert refused(check, "buffer.latest_ids[0]", state | {"latest_ids": [9]}) == "9 is out of range [0, 3]"
    assert state["evicted"] == 4 and state["evicted_by"] == {"capacity": 4}  # groups 0 and 1, 2 records each
    assert "adds up to 5, not evicted=4" in refused(check, "buffer.evicted_by", state | {"evicted_by": {"capacity": 5}})
    assert refused(check, "buffer.evicted_unused", state | {"evicted_unused": 5}) == "5 is out of range [0, 4]"
    twice = state | {"groups": state["groups"] + state["groups"][:1]}
    assert "held once" in refused(check, "buffer.groups[2]", twice)
    assert refused(check, "buffer.groups", {k: v for k, v in state.items() if k != "groups"}) == "missing"


def test_the_adaptive_policy_refuses_nan_evidence_unknown_prompts_and_a_bad_rng():
    p = policy()
    seen(p, 3, passes=2, fails=1, round_=1)
    state = p.state_dict()
    check = lambda s: policy().check_state(s, "policy", prompts=10, rounds=2)  # noqa: E731
    check(state)
    bad = [math.nan] + state["evidence"][3][1:]
    assert refused(check, "policy.evidence[3].passes", state | {"evidence": {3: bad}}) == "NaN"
    assert "out of range [0, 9]" in refused(check, "policy.evidence[12]", state | {"evidence": {12: state["evidence"][3]}})
    assert "not 6" in refused(check, "policy.evidence[3]", state | {"evidence": {3: [1.0, 2.0]}})
    assert refused(check, "policy.values.fresh", state | {"values": {"fresh": math.inf}}).startswith("inf is out of range")
    assert "not a Python random state" in refused(check, "policy.rng", state | {"rng": [3, [1, 2, 3], None]})


def test_an_rng_state_of_the_wrong_size_is_refused():
    python_rng(list(random.Random(1).getstate()), "rng")
    version, words, gauss = random.Random(1).getstate()
    assert "not a Python random state" in refused(lambda s: python_rng(s, "rng"), "rng", (version, words[:100], gauss))


def test_the_regenerate_callback_refuses_counts_no_run_could_have():
    cb = RegenerateExperience(generator=None, reward=None)
    state = cb.state_dict()
    cb.load_state_dict(state)
    with pytest.raises(StateError, match=r"callbacks.RegenerateExperience.rounds: 5 rounds made for 2 ended"):
        cb.load_state_dict(state | {"rounds": 5, "epochs_ended": 2})
    with pytest.raises(StateError, match=r"totals.generated_tokens: NaN"):
        cb.load_state_dict(state | {"totals": state["totals"] | {"generated_tokens": math.nan}})
