"""The environment interface (`env=...`): what answers a policy turn in a multi-turn episode.

An episode alternates policy turns (sampled by the generator, with behaviour log-probs) and observation
turns (text the environment returns, e.g. a tool's result). The rollout (envs/rollout.py) builds one
environment per episode from the `env` config (a `_partial_` factory), then:

    text = env.reset(example)        the first observation: the prompt the policy sees (a task example in)
    result = env.step(policy_text)   after every policy turn: StepResult(observation, reward, done, ...)

`policy_text` is the turn as decoded text: its final stop id dropped, and every other special id too (a
special id has no text; the turn's provenance counts those dropped, `special_dropped`), so a program a tool
runs is that text. A turn ends at a stop id (eos), at one of `env.stop_strings` (a tool call's close tag) or
at the length limit. The episode's last turn (turn `max_turns`, one that did not end with a call, or one
after which the context has no room for an observation and a token) goes to `env.answer(policy_text)`
instead: a tool environment runs no call in it (its result could never be shown). The episode ends when the
environment says `done`, when the turn ended at eos or at the length limit, after `max_turns` policy
turns, or when the context is full. `observation` is appended as tokens (at most `max_observation_tokens`)
before the next policy turn. A user's environment subclasses `Environment` (or provides the same
attributes and methods) and is named by `_target_` with `_partial_: true`.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class StepResult:
    """What an environment returns for one policy turn.

    observation: text appended after the turn (None: nothing; the episode then ends)
    reward: a per-turn reward added to the episode's outcome reward (None: none for this turn)
    done: the episode is over (the turn was the final answer)
    tool: the tool the turn called (None: no call); malformed: the call could not be parsed or run
    seconds: time the tool took (the cost ledger's cost/tool_seconds)
    budget_spent: the call was refused or stopped because the round's tool time budget was spent"""

    observation: str | None
    reward: float | None = None
    done: bool = False
    tool: str | None = None
    malformed: bool = False
    seconds: float = 0.0
    budget_spent: bool = False


class BudgetSpent(Exception):
    """Raised by a tool whose run was stopped because the round's tool time budget ran out."""


class ToolBudget:
    """A round's tool time: the wall seconds the round may spend waiting for tool calls (`env.round_tool_seconds`).

    The rollout runs each turn's calls as one `phase()` (concurrently, envs/rollout.py); `spent` adds up the
    phases' wall seconds, and a call inside a phase may run `left()` seconds (the phase's deadline minus now).
    The deadline is set before a phase's calls start and cleared after they all ended (no lock needed)."""

    def __init__(self, seconds: float):
        if not isinstance(seconds, (int, float)) or seconds < 0:
            raise ValueError(f"env.round_tool_seconds must be a number >= 0, got {seconds!r}")
        self.seconds, self.spent = float(seconds), 0.0
        self._deadline: float | None = None

    def left(self) -> float:
        if self._deadline is not None:
            return self._deadline - time.monotonic()
        return self.seconds - self.spent

    @contextmanager
    def phase(self):
        start = time.monotonic()
        self._deadline = start + self.left()
        try:
            yield self
        finally:
            self._deadline = None
            self.spent += time.monotonic() - start


class Environment:
    """Base of every environment: the limits the rollout enforces, and the interface it calls.

    max_turns: policy turns an episode may take (the last one is its answer, whatever it holds)
    max_observation_tokens: tokens of one observation kept (the rest cut)
    stop_strings: texts that end a policy turn besides eos (a tool call's close tag)
    result_prefix, result_suffix: text every observation begins and ends with (the tag format's wrapping), kept
        whole when the observation is cut to `max_observation_tokens`
    tool_workers: how many episodes' steps of one turn may run at once (1: one after another, in the
        trainer's thread); tool_budget: the round's ToolBudget, set by the rollout (None: unlimited)"""

    stop_strings: tuple[str, ...] = ()
    result_prefix: str = ""
    result_suffix: str = ""
    tool_workers: int = 1
    tool_budget: ToolBudget | None = None

    def __init__(self, max_turns: int, max_observation_tokens: int):
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"env.max_turns must be an integer >= 1, got {max_turns!r}")
        if not isinstance(max_observation_tokens, int) or max_observation_tokens < 1:
            raise ValueError(f"env.max_observation_tokens must be an integer >= 1, got {max_observation_tokens!r}")
        self.max_turns, self.max_observation_tokens = max_turns, max_observation_tokens

    def reset(self, example) -> str:
        """Start an episode on a task example; return the first observation (the prompt text)."""
        raise NotImplementedError

    def step(self, text: str) -> StepResult:
        """Answer one policy turn."""
        raise NotImplementedError

    def answer(self, text: str) -> StepResult:
        """The episode's last policy turn, its answer whatever it holds (no observation follows it): its
        reward. An environment with tools overrides it so that no call in it runs; by default, `step`."""
        return self.step(text)

    def demonstration(self, example) -> list[str]:
        """The policy turns a teacher would take on `example` (SFT demonstrations), if the environment
        knows them; data_modules/episode_demonstrations.py plays them against the environment."""
        raise NotImplementedError(f"{type(self).__name__} has no teacher demonstrations")
