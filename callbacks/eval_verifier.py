"""Which source scores held-out accuracy (`callbacks.evaluate.verifier`): auto | exact | a reward node.

    auto    the stage's reward when it scores against the reference answer (a verifier: exact match,
            math-answer matching, code execution); else a weighted reward's `gold` source when that is
            one; else exact match against the task's reference answers. A learned reward model, an LLM
            judge or a weighted mix is never held-out "accuracy": it is a proxy, and the console says
            which verifier was used instead.
    exact   exact match against the reference answer (ExactMatchVerifier), whatever the stage trains on
    a node  any reward source, e.g. {_target_: rewards.math_answer.MathAnswerVerifier, name: math,
            timeout_s: 60}, or '${reward}' for the stage's own reward, verifier or not
A source says it is a verifier with the attribute `verifies_reference = True` (rewards/base.py; reward=function:
when its function carries that attribute, as rewards.math_answer.math_answer_scores does).
"""
from __future__ import annotations

from rewards.base import RewardSource
from rewards.verifier import ExactMatchVerifier
from tasks.base import Task

CHOICES = "auto, exact or a reward-source node ({_target_: ...})"


def is_verifier(source) -> bool:
    """Whether `source` scores a completion against the example's reference answer."""
    return isinstance(source, RewardSource) and bool(getattr(source, "verifies_reference", False))


def describe(source: RewardSource) -> str:
    return f"{source.name!r} ({type(source).__name__})"


def choose_verifier(choice, reward: RewardSource | None, task: Task) -> tuple[RewardSource, str]:
    """(the held-out scorer, one line saying which and why) for callbacks.evaluate.verifier=`choice`."""
    if isinstance(choice, RewardSource) or callable(getattr(choice, "score", None)):  # any reward-like node
        return choice, f"{describe(choice)}, as callbacks.evaluate.verifier names it"
    if choice == "exact":
        return ExactMatchVerifier(name="gold"), ("exact match with the reference answer "
                                                 "(callbacks.evaluate.verifier=exact)")
    if choice != "auto":
        raise ValueError(f"callbacks.evaluate.verifier={choice!r}: expected {CHOICES}")
    if is_verifier(reward):
        return reward, f"the stage's reward {describe(reward)}, a verifier"
    gold = getattr(reward, "gold", None)
    if is_verifier(gold):
        return gold, (f"the gold source {describe(gold)} of the stage's reward {describe(reward)} "
                      f"(the reward itself is not a verifier)")
    why = ("the stage has no reward" if reward is None else
           f"the stage's reward {describe(reward)} does not score against the reference answer, so it is not "
           f"used as accuracy")
    return ExactMatchVerifier(name="gold"), (f"exact match with task {task.name!r}'s reference answers: {why} "
                                             f"(callbacks.evaluate.verifier picks another)")
