"""`env=calculator` (and any set of tools): tool calls parsed from the policy's text in a tag format.

A call is `{open}{tool}{separator}{arguments}{close}`, e.g. `<tool>calculator:123*45</tool>` with the
defaults (a character model's experiment may shorten the tags: conf/experiment/tool_use.yaml). A policy
turn ends at the close tag (`stop_strings`); the tool's answer comes back as the observation
`{result_prefix}{result}{result_suffix}`. A turn without a call is the final answer (done). A malformed
call (no close tag, no separator, an unknown tool, arguments the tool refuses) and a call past
`max_tool_calls` get an observation saying so, never a crash.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from envs.base import Environment, StepResult


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


def check_tools(tools: dict[str, Callable], max_tool_calls: int) -> None:
    """env.tools maps names to callables and env.max_tool_calls is an integer ≥ 0, or a ValueError naming the key."""
    if not tools or not all(callable(fn) for fn in tools.values()):
        raise ValueError(f"env.tools must map tool names to callables (`_target_` with `_partial_: true`), "
                         f"got {tools!r}")
    if not isinstance(max_tool_calls, int) or max_tool_calls < 0:
        raise ValueError(f"env.max_tool_calls must be an integer >= 0, got {max_tool_calls!r}")


class ToolEnv(Environment):
    """Tools are callables `fn(arguments: str) -> str` by name (envs/tools.py: `calculator`)."""

    def __init__(self, tools: dict[str, Callable], format: TagFormat | dict, result_prefix: str,
                 result_suffix: str, max_tool_calls: int, max_turns: int, max_observation_tokens: int):
        super().__init__(max_turns=max_turns, max_observation_tokens=max_observation_tokens)
        check_tools(tools, max_tool_calls)
        self.tools = dict(tools)
        self.format = format if isinstance(format, TagFormat) else TagFormat(**format)
        self.result_prefix, self.result_suffix = result_prefix, result_suffix
        self.max_tool_calls, self.calls = max_tool_calls, 0
        self.stop_strings = (self.format.close,)

    def reset(self, example) -> str:
        self.calls = 0
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
        start = time.perf_counter()
        try:
            result, malformed = str(self.tools[tool](arguments)), False
        except Exception as e:  # noqa: BLE001 - a tool's refusal, whatever its type, is an observation
            result, malformed = f"error: {e}", True
        return StepResult(self.observe(result), tool=tool, malformed=malformed,
                          seconds=time.perf_counter() - start)

    def demonstration(self, example) -> list[str]:
        """The teacher's turns: each call of `example.meta["calls"]` ([[tool, arguments], ...]), then the
        reference answer."""
        calls = example.meta.get("calls")
        if not isinstance(calls, list):
            raise ValueError(f"example {example.prompt!r} has no meta['calls'] ([[tool, arguments], ...]) "
                             f"to demonstrate")
        return [self.format.call(tool, arguments) for tool, arguments in calls] + [example.answer]
