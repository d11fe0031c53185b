"""The `task` group (conf/task): the project's three task factories are closed."""
from __future__ import annotations

from run.validation.schemas.model import Seed
from run.validation.schemas.base import (Bool, Fraction, NonNegativeInt, Node, OpenNode, OptionalPath, Path, PositiveInt,
                                          Text, choice, optional)


class Arithmetic(Node):
    """tasks.arithmetic.arithmetic_task: generated sums with exact answers."""
    digits: PositiveInt = None
    num_heldout: NonNegativeInt = None
    operands_max: optional(PositiveInt, "(the largest number of `digits` digits)") = None
    seed: Seed = None
    teacher: choice("exact", "no_carry_at_ten") = None


class Code(Node):
    """tasks.code.code_task: Python functions with unit tests."""
    path: OptionalPath = None
    num_heldout: NonNegativeInt = None


class Jsonl(Node):
    """tasks.jsonl.jsonl_task: prompts and reference answers from JSON-lines files."""
    train_path: Path = None
    heldout_path: OptionalPath = None
    num_heldout: NonNegativeInt = None
    chat: Bool = None
    prompt_key: Text = None
    answer_key: Text = None


class ToolArithmetic(Node):
    """tasks.tool_arithmetic.tool_arithmetic_task: products for a calculator tool (env=calculator)."""
    a_digits: PositiveInt = None
    b_digits: PositiveInt = None
    num_heldout: PositiveInt = None
    tool: Text = None
    tool_rate: Fraction = None
    seed: Seed = None


class AnyTask(OpenNode):
    num_heldout: NonNegativeInt = None


SCHEMAS = {"tasks.arithmetic.arithmetic_task": Arithmetic, "tasks.code.code_task": Code,
           "tasks.jsonl.jsonl_task": Jsonl, "tasks.tool_arithmetic.tool_arithmetic_task": ToolArithmetic}
FALLBACK = AnyTask
