"""envs/tool_env.py and envs/tools.py: the tag format, the calculator, malformed calls and limits."""
from __future__ import annotations

from functools import partial

import pytest

from envs.tool_env import TagFormat, ToolEnv
from envs.tools import calculator
from tasks.base import Example
from tasks.tool_arithmetic import tool_arithmetic_task

CALC = partial(calculator, max_digits=30, max_exponent=100)


def env(**kw) -> ToolEnv:
    args = dict(tools={"calculator": CALC}, format={"open": "[", "close": "]", "separator": ":"},
                result_prefix="=", result_suffix=";", max_tool_calls=2, max_turns=3, max_observation_tokens=16,
                round_tool_seconds=60, tool_workers=1)
    e = ToolEnv(**(args | kw))
    e.reset(Example("1*2=", "2"))
    return e


@pytest.mark.parametrize("expr,want", [("123*45", "5535"), ("2**10", "1024"), ("(1+2)*-3", "-9"), ("7/2", "3.5"),
                                       ("8/2", "4"), ("7//2", "3"), ("7%3", "1")])
def test_calculator_computes_arithmetic_exactly(expr, want):
    assert CALC(expr) == want


@pytest.mark.parametrize("expr", ["__import__('os')", "open('x')", "a*2", "2**1000", "1/0", "(1).real", "1+",
                                  "[1]*3", "'a'*3", "9**9**9", "((10**99)**99)**99", "(-1)**0.5", "1e308*10"])
def test_calculator_refuses_anything_but_bounded_arithmetic(expr):
    with pytest.raises(ValueError):
        CALC(expr)


def test_calculator_refuses_results_past_max_digits():
    with pytest.raises(ValueError, match="digits"):
        calculator("10**40", max_digits=30, max_exponent=100)


def test_a_call_returns_the_tool_result_as_an_observation():
    r = env().step("I will call [calculator:123*45]")
    assert (r.observation, r.tool, r.malformed, r.done) == ("=5535;", "calculator", False, False)
    assert r.seconds >= 0


def test_a_turn_without_a_call_is_the_final_answer():
    r = env().step("5535")
    assert r.done and r.observation is None and r.tool is None


@pytest.mark.parametrize("text,why", [("[calculator:1+2", "no closing ]"), ("[calc1+2]", "TOOL:ARGUMENTS"),
                                      ("[foo:1]", "unknown tool 'foo'"), ("[calculator:1+]", "not an arithmetic")])
def test_malformed_calls_are_observations_saying_so(text, why):
    r = env().step(text)
    assert r.malformed and not r.done and why in r.observation and r.observation.startswith("=error: ")


def test_calls_past_max_tool_calls_get_an_observation_not_a_result():
    e = env(max_tool_calls=1)
    assert e.step("[calculator:1+1]").observation == "=2;"
    r = e.step("[calculator:2+2]")
    assert r.observation == "=error: tool call limit (1) reached;" and not r.done
    e.reset(Example("x", "y"))  # a new episode counts from 0
    assert e.step("[calculator:2+2]").observation == "=4;"


def test_user_tools_are_any_callable():
    e = env(tools={"upper": str.upper})
    assert e.step("[upper:abc]").observation == "=ABC;"


def test_a_tool_that_raises_is_an_observation_not_a_crash():
    def broken(_):
        raise RuntimeError("boom")
    r = env(tools={"b": broken}).step("[b:x]")
    assert r.malformed and r.observation == "=error: boom;"


@pytest.mark.parametrize("kw,key", [({"max_turns": 0}, "env.max_turns"), ({"max_tool_calls": -1}, "env.max_tool_calls"),
                                    ({"max_observation_tokens": 0}, "env.max_observation_tokens"),
                                    ({"tools": {"x": 3}}, "env.tools"),
                                    ({"format": {"open": "", "close": "]", "separator": ":"}}, "env.format.open")])
def test_bad_settings_are_refused_naming_the_key(kw, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        env(**kw)


def test_stop_strings_are_the_close_tag_and_format_round_trips():
    f = TagFormat("<tool>", "</tool>", ":")
    assert f.parse(f.call("calculator", "1+2")) == ("calculator", "1+2")
    assert env().stop_strings == ("]",)


def test_the_teacher_demonstrates_the_tasks_call_then_the_answer():
    ex = tool_arithmetic_task(3, 2, 10, "calculator", 1.0, 0).train[0]
    a, b = ex.prompt.rstrip("=").split("*")
    assert env().demonstration(ex) == [f"[calculator:{a}*{b}]", str(int(a) * int(b))]
    assert 100 <= int(a) <= 999 and 10 <= int(b) <= 99
