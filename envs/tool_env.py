"""`env=calculator` (and any set of tools): tool calls parsed from the policy's text in a tag format.

A call is `{open}{tool}{separator}{arguments}{close}`, e.g. `<tool>calculator:123*45</tool>` with the
defaults (a character model's experiment may shorten the tags: conf/experiment/tool_use.yaml). A policy
turn ends at the close tag (`stop_strings`); the tool's answer comes back as the observation
`{result_prefix}{result}{result_suffix}`. A turn without a call is the final answer (done). A malformed
call (no close tag, no separator, an unknown tool, arguments the tool refuses) and a call past
`max_tool_calls` get an observation saying so, never a crash.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import time
import warnings
from dataclasses import dataclass
from typing import Callable

from envs.base import BudgetSpent, Environment, StepResult, ToolBudget

BUDGET_SPENT = "tool time budget spent"
SECONDS_LEFT = "seconds_left"  # a tool parameter the environment binds per call (never offered to the model)


@dataclass(frozen=True)
class TagFormat:
    open: str
    close: str
    separator: str

    def __post_init__(self):
        for key in ("open", "close", "separator"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ValueError(f"env.format.{key} must be a non-empty string, got {getattr(self, key)!r}")

    def call(self, tool: str, arguments: str) -> str:
        return f"{self.open}{tool}{self.separator}{arguments}{self.close}"

    def parse(self, text: str) -> tuple[str, str] | str | None:
        """(tool, arguments) of the first call in `text`; a string saying what is wrong with a malformed
        call; None when the text holds no call (the open tag does not occur)."""
        start = text.find(self.open)
        if start < 0:
            return None
        end = text.find(self.close, start + len(self.open))
        if end < 0:
            return f"no closing {self.close}"
        tool, sep, arguments = text[start + len(self.open): end].partition(self.separator)
        if not sep:
            return f"expected TOOL{self.separator}ARGUMENTS between {self.open} and {self.close}"
        return tool.strip(), arguments


def check_tools(tools: dict[str, Callable], max_tool_calls: int, round_tool_seconds: float,
                tool_workers: int) -> int:
    """env.tools maps names to callables, env.max_tool_calls is an integer ≥ 0, env.round_tool_seconds a
    number ≥ 0 and env.tool_workers an integer ≥ 1, or a ValueError naming the key. Returns the workers to
    use: 1 when a tool's sandbox cannot give each run a cpu cgroup of its own (then concurrent runs would
    share the CPU per process, so one run could slow its neighbours: docs/rewards.md)."""
    if not tools or not all(callable(fn) for fn in tools.values()):
        raise ValueError(f"env.tools must map tool names to callables (`_target_` with `_partial_: true`), "
                         f"got {tools!r}")
    if not isinstance(max_tool_calls, int) or max_tool_calls < 0:
        raise ValueError(f"env.max_tool_calls must be an integer >= 0, got {max_tool_calls!r}")
    ToolBudget(round_tool_seconds)  # checks the value
    if not isinstance(tool_workers, int) or isinstance(tool_workers, bool) or tool_workers < 1:
        raise ValueError(f"env.tool_workers must be an integer >= 1, got {tool_workers!r}")
    serial = [n for n, fn in tools.items() if (box := sandbox_of(fn)) is not None
              and getattr(getattr(box, "cpu", None), "kind", None) is None]
    if serial and tool_workers > 1:
        warnings.warn(f"env.tool_workers={tool_workers}: running tool calls one at a time, since the sandbox of "
                      f"{serial[0]!r} cannot make a cpu cgroup per run here (docs/rewards.md)", stacklevel=3)
        return 1
    return tool_workers


def sandbox_of(fn: Callable):
    """The sandbox a tool runs in (its `sandbox` keyword, bound by the config), or None."""
    box = getattr(fn, "keywords", {}).get("sandbox")
    return box if hasattr(box, "protect_file") else None


@functools.lru_cache(maxsize=256)
def _takes_seconds_left(fn: Callable) -> bool:
    try:
        return SECONDS_LEFT in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def run_tool(name: str, fn: Callable, budget: ToolBudget | None, source_file: str | None, *args,
             **kwargs) -> StepResult:
    """Call tool `name` (observation: its raw text). Never raises: a refusal (any exception) is `error: ...`
    (malformed); a call when the round's tool time `budget` is spent is not made, and a tool that takes
    `seconds_left` gets the time left (the python tool stops its run there): both `error: tool time budget
    spent`, counted (`budget_spent`). A tool with a sandbox never runs for an example whose task file
    (`source_file`) that sandbox would show (as code_exec, docs/rewards.md)."""
    box = sandbox_of(fn)
    if box is not None:
        try:
            box.protect_file(source_file)
        except Exception as e:  # noqa: BLE001 - SandboxUnavailable: the call is refused, never run
            return StepResult(f"error: refused: {e}", tool=name)
    if budget is not None:
        left = budget.left()
        if left <= 0:
            return StepResult(f"error: {BUDGET_SPENT}", tool=name, budget_spent=True)
        if _takes_seconds_left(fn):
            kwargs[SECONDS_LEFT] = left
    start = time.perf_counter()
    spent = malformed = False
    try:
        result = str(fn(*args, **kwargs))
    except BudgetSpent as e:
        result, spent = f"error: {BUDGET_SPENT} ({e})", True
    except Exception as e:  # noqa: BLE001 - a tool's refusal, whatever its type, is an observation
        result, malformed = f"error: {e}", True
    return StepResult(result, tool=name, malformed=malformed, seconds=time.perf_counter() - start,
                      budget_spent=spent)


class ToolEnv(Environment):
    """Tools are callables `fn(arguments: str) -> str` by name (envs/tools.py: `calculator`)."""

    def __init__(self, tools: dict[str, Callable], format: TagFormat | dict, result_prefix: str,
                 result_suffix: str, max_tool_calls: int, max_turns: int, max_observation_tokens: int,
                 round_tool_seconds: float, tool_workers: int):
        super().__init__(max_turns=max_turns, max_observation_tokens=max_observation_tokens)
        self.tool_workers = check_tools(tools, max_tool_calls, round_tool_seconds, tool_workers)
        self.tools, self.round_tool_seconds, self.source_file = dict(tools), round_tool_seconds, None
        self.format = format if isinstance(format, TagFormat) else TagFormat(**format)
        self.result_prefix, self.result_suffix = result_prefix, result_suffix
        self.max_tool_calls, self.calls = max_tool_calls, 0
        self.stop_strings = (self.format.close,)

    def reset(self, example) -> str:
        self.calls, self.source_file = 0, example.meta.get("source_file")
        return example.prompt

    def observe(self, text: str) -> str:
        return f"{self.result_prefix}{text}{self.result_suffix}"

    def step(self, text: str) -> StepResult:
        parsed = self.format.parse(text)
        if parsed is None:
            return StepResult(observation=None, done=True)
        if isinstance(parsed, str):
            return StepResult(self.observe(f"error: {parsed}"), malformed=True)
        tool, arguments = parsed
        if tool not in self.tools:
            return StepResult(self.observe(f"error: unknown tool {tool!r}"), malformed=True, tool=tool)
        if self.calls >= self.max_tool_calls:
            return StepResult(self.observe(f"error: tool call limit ({self.max_tool_calls}) reached"), tool=tool)
        self.calls += 1
        result = run_tool(tool, self.tools[tool], self.tool_budget, self.source_file, arguments)
        return dataclasses.replace(result, observation=self.observe(result.observation))

    def answer(self, text: str) -> StepResult:
        """The last turn is the answer: a call in it is not run (no observation could show its result)."""
        return StepResult(observation=None, done=True)

    def demonstration(self, example) -> list[str]:
        """The teacher's turns: each call of `example.meta["calls"]` ([[tool, arguments], ...]), then the
        reference answer."""
        calls = example.meta.get("calls")
        if not isinstance(calls, list):
            raise ValueError(f"example {example.prompt!r} has no meta['calls'] ([[tool, arguments], ...]) "
                             f"to demonstrate")
        return [self.format.call(tool, arguments) for tool, arguments in calls] + [example.answer]
