"""safe_score: a source that raises, hangs, returns NaN/inf/junk or the wrong count costs those samples
(counted, first error kept) and never the run, and never stalls longer than its timeout."""
from __future__ import annotations

import os
import threading
import time

import pytest

from rewards.base import RewardSource, ScoreReport, call_with_timeout, ScoreTimeout, clean, safe_score
from rewards.verifier import ExactMatchVerifier, FunctionReward
from tasks.base import Example
from tests.rewards.user_functions import hangs_on_five, spins_on_five

EX = [Example("1+1=", "2"), Example("2+2=", "4"), Example("3+3=", "6")]
PROMPTS, COMPLETIONS = [e.prompt for e in EX], ["2", "5", "6"]


class Fixed(RewardSource):
    def __init__(self, values, name="fixed", timeout_s=5.0, sleep=0.0):
        self.values, self.name, self.timeout_s, self.sleep = values, name, timeout_s, sleep

    def score(self, prompts, completions, examples):
        if self.sleep:
            time.sleep(self.sleep)
        if isinstance(self.values, Exception):
            raise self.values
        return self.values


def test_plain_scores_pass_through_with_per_source_entry():
    report = safe_score(ExactMatchVerifier("verifier"), PROMPTS, COMPLETIONS, EX)
    assert report.scores == [1.0, 0.0, 1.0]
    assert (report.abstained, report.errors, report.timeouts, report.first_error) == (0, 0, 0, None)
    assert report.per_source == {"verifier": [1.0, 0.0, 1.0]}


def test_none_is_an_abstain_not_an_error():
    report = safe_score(Fixed([1.0, None, 0.5]), PROMPTS, COMPLETIONS, EX)
    assert report.scores == [1.0, None, 0.5] and report.abstained == 1 and report.errors == 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), "high", [1]])
def test_non_finite_or_non_numeric_costs_only_that_sample(bad):
    report = safe_score(Fixed([1.0, bad, 0.0]), PROMPTS, COMPLETIONS, EX)
    assert report.scores == [1.0, None, 0.0]
    assert report.abstained == 1 and report.errors == 1 and "non-finite" in report.first_error


def test_exception_costs_the_batch_and_names_source_and_error():
    report = safe_score(Fixed(RuntimeError("boom")), PROMPTS, COMPLETIONS, EX)
    assert report.scores == [None] * 3 and report.abstained == 3 and report.errors == 1
    assert report.first_error == "fixed: RuntimeError: boom"


def test_wrong_number_of_scores_costs_the_batch():
    report = safe_score(Fixed([1.0]), PROMPTS, COMPLETIONS, EX)
    assert report.scores == [None] * 3 and "returned 1 scores for 3 samples" in report.first_error


def test_a_hanging_source_times_out_then_abstains_while_still_busy():
    """Batch timeout: back within the timeout; the next call does not pile a second hung call on."""
    release = threading.Event()
    source = Fixed([1.0] * 3, name="slow", timeout_s=0.3)
    source.score = lambda p, c, e: (release.wait(10), [1.0] * 3)[1]
    start = time.monotonic()
    report = safe_score(source, PROMPTS, COMPLETIONS, EX)
    assert time.monotonic() - start < 2.0
    assert report.scores == [None] * 3 and report.timeouts == 1 and "timed out after 0.3s" in report.first_error
    again = safe_score(source, PROMPTS, COMPLETIONS, EX)
    assert again.scores == [None] * 3 and "still running" in again.first_error
    release.set()
    time.sleep(0.1)
    assert safe_score(source, PROMPTS, COMPLETIONS, EX).scores == [1.0] * 3  # recovered


def test_call_with_timeout_returns_value_and_reraises():
    assert call_with_timeout(lambda: 7, 1.0) == 7
    with pytest.raises(KeyError):
        call_with_timeout(lambda: {}["x"], 1.0)
    with pytest.raises(ScoreTimeout):
        call_with_timeout(lambda: time.sleep(2), 0.1)


def test_clean():
    values = (1, 0.5, True, None, float("nan"), "x", "0.25")
    assert [clean(v) for v in values] == [1.0, 0.5, 1.0, None, None, None, 0.25]


def test_score_report_sources_keep_their_breakdown():
    class Composite(RewardSource):
        name = "combo"

        def score_report(self, prompts, completions, examples):
            return ScoreReport([0.5, 0.5, 0.5], errors=1, first_error="child: x", per_source={"a": [1, 0, 1]})

    report = safe_score(Composite(), PROMPTS, COMPLETIONS, EX)
    assert report.per_source == {"a": [1, 0, 1], "combo": [0.5, 0.5, 0.5]}
    assert report.errors == 1 and report.first_error == "child: x"


# ---------------------------------------------------------------- user functions
def tiny_reward(prompts, completions, examples):
    """A user reward with the contract, named by _target_ in test_function_reward_from_config."""
    return [float(len(c)) for c in completions]


def test_function_reward_from_config(hydra_conf):
    from hydra.utils import instantiate
    cfg = hydra_conf(["reward=function", "reward.fn._target_=tests.rewards.test_base.tiny_reward",
                      "reward.version=7"])
    source = instantiate(cfg.reward)
    assert source.name == "function" and source.version == "7"
    assert safe_score(source, PROMPTS, ["a", "bb", ""], EX).scores == [1.0, 2.0, 0.0]


def test_function_reward_per_sample_timeout_abstains_on_the_hung_sample_alone():
    source = FunctionReward("fn", "1", hangs_on_five, per_sample_timeout_s=0.5, timeout_s=30)
    report = safe_score(source, PROMPTS, COMPLETIONS, EX)
    assert report.scores == [1.0, None, 1.0] and report.timeouts == 1  # its worker killed, a new one scores on
    assert "sample 1 timed out" in report.first_error


def test_a_per_sample_timeout_leaves_no_thread_or_process_running():
    """Each hang used to abandon a spinning thread (8 steps: 91 s instead of 4 s, no error): now the worker
    process running the call is killed, and nothing is left after any batch."""
    source = FunctionReward("spin", "1", spins_on_five, per_sample_timeout_s=0.5, timeout_s=30)
    threads = set(threading.enumerate())
    for _ in range(2):
        report = safe_score(source, PROMPTS, COMPLETIONS, EX)
        assert set(threading.enumerate()) <= threads  # no thread left behind
        assert report.scores == [1.0, None, None] and report.timeouts == 1 and report.errors == 1
        assert source.worker.proc is None or source.worker.proc.poll() is None  # at most the idle worker
    pid = source.worker.proc.pid
    source.worker.close()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, 0)  # already reaped: not a zombie, not running


def test_per_sample_mode_errors_name_the_sample_and_the_error():
    source = FunctionReward("spin", "1", spins_on_five, per_sample_timeout_s=0.5, timeout_s=30)
    report = source.score_report(["p"], ["6"], EX[:1])
    assert report.scores == [None] and report.first_error == "spin: sample 0: ZeroDivisionError: six"


def test_per_sample_mode_needs_a_picklable_fn_and_room_in_the_batch():
    with pytest.raises(ValueError, match="reward.fn .* worker process"):
        FunctionReward("fn", "1", lambda p, c, e: [1.0], per_sample_timeout_s=1.0, timeout_s=30)
    with pytest.raises(ValueError, match="reward.per_sample_timeout_s=30 must be below reward.timeout_s"):
        FunctionReward("fn", "1", hangs_on_five, per_sample_timeout_s=30, timeout_s=30)


def test_function_reward_refuses_a_non_callable():
    with pytest.raises(TypeError, match="reward.fn"):
        FunctionReward("fn", "1", "not a function", None, 10)


class BadFloat:
    def __float__(self):
        raise ZeroDivisionError("no float here")


@pytest.mark.parametrize("bad", [10**400, -(10**400), BadFloat()], ids=["1e400", "-1e400", "broken__float__"])
def test_a_score_float_cannot_hold_costs_only_that_sample(bad):
    """float(10**400) raises OverflowError: safe_score ("never raises") must turn it into an abstain."""
    report = safe_score(Fixed([1.0, bad, 0.0]), PROMPTS, COMPLETIONS, EX)
    assert report.scores == [1.0, None, 0.0]
    assert report.abstained == 1 and report.errors == 1 and "non-finite" in report.first_error
