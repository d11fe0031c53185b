"""judge: a local model through the generator seam (greedy), a prompt template from config, a parser with
a clear abstain, and a cache of identical pairs."""
from __future__ import annotations

import pytest
from hydra.utils import instantiate

from generators.base import GenerationOutput
from rewards.base import safe_score
from rewards.judge import JudgeReward, parse_score
from tasks.base import Example
from tests.helpers import TINY_MODEL, tiny_model


@pytest.mark.parametrize("text,expected", [
    ("7", 7 / 9), (" 9 because", 1.0), ("0", 0.0), ("score: 4.5", 0.5), ("ten", None), ("12", None),
    ("-1", None), ("", None),
])
def test_parse_score(text, expected):
    got = parse_score(text, r"(-?\d+(?:\.\d+)?)", 0, 9)
    assert got == (pytest.approx(expected) if expected is not None else None)


class ScriptedGenerator:
    """The generator seam, answering each judge prompt from a script; records what it was asked."""

    def __init__(self, tokenizer, reply):
        self.tokenizer, self.reply, self.asked = tokenizer, reply, []

    def sample(self, model, tokenizer, prompts, greedy=False):
        assert greedy, "the judge decodes greedily"
        texts = [tokenizer.decode(p, skip_special_tokens=True) for p in prompts]
        self.asked += texts
        eos = [tokenizer.eos_token_id]
        ids = [tokenizer(self.reply(t), add_special_tokens=False)["input_ids"] + eos for t in texts]
        return GenerationOutput(ids, [[0.0] * len(i) for i in ids], 0.0)


def judge_with(reply, template="Q:{prompt} A:{completion} Ref:{answer} Score:"):
    model, tok = tiny_model()
    gen = ScriptedGenerator(tok, reply)
    parser = lambda text: parse_score(text, r"(-?\d+(?:\.\d+)?)", 0, 9)  # noqa: E731
    return JudgeReward("judge", (model, tok), gen, template, parser, chat=False, cache_size=3, device=None,
                       timeout_s=60), gen


def test_template_parse_abstain_and_cache():
    judge, gen = judge_with(lambda t: "9" if "A:2 " in t else ("3" if "A:5 " in t else "no idea"))
    ex = [Example("1+1=", "2")] * 4
    scores = judge.score(["1+1="] * 4, ["2", "5", "2", "x"], ex)
    assert scores == [1.0, pytest.approx(3 / 9), 1.0, None]  # "x" → unparsable → abstain
    assert gen.asked == ["Q:1+1= A:2 Ref:2 Score:", "Q:1+1= A:5 Ref:2 Score:", "Q:1+1= A:x Ref:2 Score:"]
    assert judge.score(["1+1="], ["5"], ex[:1]) == [pytest.approx(3 / 9)]  # cached: not asked again
    assert len(gen.asked) == 3
    assert judge.stats() == {"judge/calls": 3, "judge/cache_hits": 2, "judge/unparsed": 1}
    report = safe_score(judge, ["1+1="] * 2, ["x", "2"], ex[:2])
    assert report.scores == [None, 1.0] and report.abstained == 1 and report.errors == 0


def test_cache_is_bounded_lru():
    judge, gen = judge_with(lambda t: "1")
    for c in "abcd":
        judge.score(["p"], [c], [Example("p", "")])
    assert len(judge.cache) == 3 and ("p", "a", "") not in judge.cache


def test_bad_template_fails_at_start():
    with pytest.raises(ValueError, match="reward.template"):
        judge_with(lambda t: "1", template="{prompt} {reference}")


def test_judge_yaml_runs_the_tiny_default_model(hydra_conf):
    """The shipped config, end to end on the tiny random model: every score parses to [0, 1] or abstains."""
    judge = instantiate(hydra_conf(["reward=judge"] + TINY_MODEL).reward)
    prompts, completions = ["1+1=", "2+2=", "1+1="], ["2", "5", "2"]
    examples = [Example(p, "") for p in prompts]
    report = safe_score(judge, prompts, completions, examples)
    assert all(s is None or 0.0 <= s <= 1.0 for s in report.scores) and report.errors == 0
    assert report.scores[0] == report.scores[2] and judge.stats()["judge/cache_hits"] == 1
    assert len(judge.last_replies) == 2 and judge.version.startswith("1:")
