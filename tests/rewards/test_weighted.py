"""Weighted sources: Σ w·s over trained sources, each logged apart; gold logged, never trained on; a
failing child costs only its own scores."""
from __future__ import annotations

import pytest
from hydra.utils import instantiate

from rewards.base import safe_score
from rewards.verifier import ExactMatchVerifier
from rewards.weighted import WeightedReward
from tasks.base import Example
from tests.rewards.test_base import Fixed

EX = [Example("1+1=", "2"), Example("2+2=", "4"), Example("3+3=", "6")]
ARGS = ([e.prompt for e in EX], ["2", "5", "6"], EX)


def weighted(missing="abstain", gold=None, **sources):
    return WeightedReward("reward", {k: {"weight": w, "source": s} for k, (w, s) in sources.items()},
                          missing, gold)


def test_weighted_sum_per_source_breakdown_and_gold_not_trained_on():
    gold = ExactMatchVerifier("exact")
    source = weighted(gold=gold, a=(1.0, Fixed([1.0, 0.0, 0.5])), b=(0.5, Fixed([0.0, 1.0, 1.0])))
    report = safe_score(source, *ARGS)
    assert report.scores == [1.0, 0.5, 1.0]  # gold (1, 0, 1) is nowhere in the trained score
    assert report.per_source == {"a": [1.0, 0.0, 0.5], "b": [0.0, 1.0, 1.0], "gold": [1.0, 0.0, 1.0],
                                 "reward": [1.0, 0.5, 1.0]}
    flipped = weighted(gold=Fixed([0.0, 1.0, 0.0]), a=(1.0, Fixed([1.0, 0.0, 0.5])),
                       b=(0.5, Fixed([0.0, 1.0, 1.0])))
    assert safe_score(flipped, *ARGS).scores == report.scores  # changing gold changes nothing trained


def test_missing_abstain_vs_renormalize():
    kids = dict(a=(1.0, Fixed([1.0, None, None])), b=(3.0, Fixed([0.0, 1.0, None])))
    assert safe_score(weighted("abstain", **kids), *ARGS).scores == [1.0, None, None]
    assert safe_score(weighted("renormalize", **kids), *ARGS).scores == [0.25, 1.0, None]


def test_a_failing_child_costs_only_its_scores_and_is_reported():
    source = weighted("renormalize", ok=(1.0, Fixed([1.0, 0.0, 1.0])),
                      bad=(1.0, Fixed(ValueError("no"), name="bad")))
    report = safe_score(source, *ARGS)
    assert report.scores == [1.0, 0.0, 1.0] and report.errors == 1
    assert report.first_error == "bad: ValueError: no" and report.per_source["bad"] == [None] * 3


def test_a_failing_gold_costs_nothing_trained():
    source = weighted(gold=Fixed(RuntimeError("gold down"), name="g"), a=(1.0, Fixed([1.0, 0.0, 1.0])))
    report = safe_score(source, *ARGS)
    assert report.scores == [1.0, 0.0, 1.0] and report.per_source["gold"] == [None] * 3 and report.errors == 1


def test_timeout_is_the_sum_of_the_childrens():
    source = weighted(gold=Fixed([0] * 3, timeout_s=2), a=(1.0, Fixed([0] * 3, timeout_s=3)))
    assert source.timeout_s == 2 + 3 + 5


@pytest.mark.parametrize("sources,missing,match", [
    ({}, "abstain", "empty"),
    ({"gold": {"weight": 1, "source": Fixed([])}}, "abstain", "reserved"),
    ({"a": {"weight": 1}}, "abstain", r"reward.sources.a must be"),
    ({"a": {"weight": 1, "source": "text"}}, "abstain", "not a reward source"),
    ({"a": {"weight": 1, "source": Fixed([])}}, "sometimes", "reward.missing"),
])
def test_config_errors_name_the_key(sources, missing, match):
    with pytest.raises((ValueError, TypeError), match=match):
        WeightedReward("reward", sources, missing)


def test_weighted_yaml_instantiates_children(hydra_conf):
    gold = "reward.gold={_target_: rewards.verifier.ExactMatchVerifier, name: g}"
    source = instantiate(hydra_conf(["reward=weighted", gold]).reward)
    report = safe_score(source, [e.prompt for e in EX], ["2", "x", "The answer is 6"], EX)
    assert report.scores == [1.5, 0.0, 0.5]  # verifier (1, 0, 0) + 0.5 · math (1, 0, 1)
    assert set(report.per_source) == {"verifier", "math", "gold", "weighted"}
