"""The `env` group (conf/env): env=calculator (envs.tool_env.ToolEnv) is closed; a user's environment class
gets the limits every environment takes (envs/base.py) typed, any other key passed on."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from run.validation.schemas.base import Mapping, NonNegativeInt, Node, OpenNode, PositiveInt, Text, must

Tag = must(Annotated[str, Field(min_length=1)], "a non-empty string")


class Limits(OpenNode):
    """Any environment (envs.base.Environment): the limits the rollout enforces."""
    max_turns: PositiveInt = None
    max_observation_tokens: PositiveInt = None


class TagFormat(Node):
    open: Tag = None
    close: Tag = None
    separator: Tag = None


class Tool(Limits):
    """envs.tool_env.ToolEnv: tools called in a tag format."""
    model_config = Node.model_config
    tools: Mapping = None
    format: TagFormat = None
    result_prefix: Text = None
    result_suffix: Text = None
    max_tool_calls: NonNegativeInt = None


SCHEMAS = {"envs.tool_env.ToolEnv": Tool}
FALLBACK = Limits
