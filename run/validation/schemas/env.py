"""The `env` group (conf/env): env=calculator (envs.tool_env.ToolEnv) and the chat tool environments
(envs.chat_tools.ChatToolEnv) are closed, and so is each of the project's tools (envs/tools.py) under
`env.tools`: a tool's limits are what keeps a call bounded (a calculator with max_digits ≤ 0 refuses every
answer; a python tool with a zero sandbox limit fails every call), each refused here rather than turned
into an observation the policy learns from. A user's environment class gets the limits every environment
takes (envs/base.py) typed, any other key passed on; a user's tool, likewise."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from run.validation.schemas.base import (NonNegativeInt, NonNegativeNumber, Node, OpenNode, PositiveInt, Text, must,
                                         node)
from run.validation.schemas.reward import Sandbox

Tag = must(Annotated[str, Field(min_length=1)], "a non-empty string")


class Calculator(Node):
    """envs.tools.calculator: results above max_digits digits and exponents above max_exponent refused."""
    max_digits: PositiveInt = None
    max_exponent: PositiveInt = None


class PythonSandbox(Sandbox):
    """rewards.sandbox.Sandbox, built whole (not `_partial_`) for the python tool: allow_weak is its own key."""
    allow_weak: must(bool, "true or false") = None


class PythonTool(Node):
    """envs.tools.python: the model's code run in the OS sandbox; max_chars printed characters kept."""
    max_chars: PositiveInt = None
    sandbox: PythonSandbox = None


TOOLS = {"envs.tools.calculator": Calculator, "envs.tools.python": PythonTool}
Tools = node(TOOLS, OpenNode, "a mapping of at least one tool name to its node ({_target_: ..., _partial_: true})",
             each=True, nullable=False, non_empty=True)


class Limits(OpenNode):
    """Any environment (envs.base.Environment): the limits the rollout enforces."""
    max_turns: PositiveInt = None
    max_observation_tokens: PositiveInt = None


class TagFormat(Node):
    open: Tag = None
    close: Tag = None
    separator: Tag = None


class ChatTool(Limits):
    """envs.chat_tools.ChatToolEnv: tools called in the chat template's format (needs a chat template); the
    keys every tool environment takes."""
    model_config = Node.model_config
    tools: Tools = None
    max_tool_calls: NonNegativeInt = None
    round_tool_seconds: NonNegativeNumber = None
    tool_workers: PositiveInt = None


class Tool(ChatTool):
    """envs.tool_env.ToolEnv: tools called in a tag format."""
    format: TagFormat = None
    result_prefix: Text = None
    result_suffix: Text = None


SCHEMAS = {"envs.tool_env.ToolEnv": Tool, "envs.chat_tools.ChatToolEnv": ChatTool}
FALLBACK = Limits
