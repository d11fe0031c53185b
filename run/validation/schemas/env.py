"""The `env` group (conf/env): env=calculator (envs.tool_env.ToolEnv) and env=chat_calculator/chat_python
(envs.chat_tools.ChatToolEnv) are closed; a user's environment class gets the limits every environment takes
(envs/base.py) typed, any other key passed on."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from run.validation.schemas.base import (Mapping, NonNegativeInt, NonNegativeNumber, Node, OpenNode, PositiveInt,
                                         Text, must)

Tag = must(Annotated[str, Field(min_length=1)], "a non-empty string")


class Limits(OpenNode):
    """Any environment (envs.base.Environment): the limits the rollout enforces."""
    max_turns: PositiveInt = None
    max_observation_tokens: PositiveInt = None


class TagFormat(Node):
    open: Tag = None
    close: Tag = None
    separator: Tag = None


class ChatTool(Limits):
    """envs.chat_tools.ChatToolEnv: tools called in the chat template's format (the keys every tool env takes)."""
    model_config = Node.model_config
    tools: Mapping = None
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
