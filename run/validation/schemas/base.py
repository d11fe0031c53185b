"""The building blocks of the config schemas: value types that carry what they must be (for the one-line
message), and the base node, whose `_target_`, `_partial_` and `_convert_` keys pydantic sees as
`target`, `partial` and `convert`.

A field written `hidden_size: PositiveInt = None` is checked when the key is present (an explicit null
too); a key that is absent is left to instantiate time, where a missing argument fails (DESIGN.md §3).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Must:
    """What a value must be, as the message says it: `trainer.max_steps=2.5 must be a positive integer`."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return f"Must({self.text!r})"


def must(tp, text: str):
    return Annotated[tp, Must(text)]


class Targeted:
    """A field holding a node (or, with `each`, a mapping of named nodes) whose schema is chosen by the node's
    own `_target_` from `table` (`fallback` for any other target): run/validation/schemas/__init__.py binds
    each such node to its schema, with its key path as the prefix of its messages."""

    def __init__(self, table: dict, fallback, each: bool):
        self.table, self.fallback, self.each = table, fallback, each

    def __repr__(self) -> str:
        return f"Targeted({'each' if self.each else 'one'})"


def node(table: dict, fallback, text: str, each: bool = False, nullable: bool = True, non_empty: bool = False):
    """A field holding a node (or a mapping of named nodes, `each`) checked against its own schema."""
    tp = Annotated[dict[str, Any], Field(min_length=1)] if non_empty else dict[str, Any]
    if not each:
        tp = tp | str  # a node may be written as an interpolation of another (`${reward}`): checked where it is
    return Annotated[tp | None if nullable else tp, Must(text), Targeted(table, fallback, each)]


def choice(*values: str, why: str = ""):
    """One of `values` (a Literal), said as 'one of a, b, c' (+ why)."""
    return must(Literal[values], "one of " + ", ".join(str(v) for v in values) + (f" ({why})" if why else ""))


def optional(tp, null_means: str):
    """`tp` or null, said as '<what tp must be>, or null <null_means>'."""
    return must(tp | None, f"{what(tp)}, or null {null_means}")


def what(tp) -> str:
    for item in reversed(getattr(tp, "__metadata__", ())):
        if isinstance(item, Must):
            return item.text
    return "valid"


PositiveInt = must(Annotated[int, Field(gt=0)], "a positive integer")
NonNegativeInt = must(Annotated[int, Field(ge=0)], "an integer ≥ 0")
PositiveNumber = must(Annotated[float, Field(gt=0)], "a positive number")
NonNegativeNumber = must(Annotated[float, Field(ge=0)], "a number ≥ 0")
Fraction = must(Annotated[float, Field(ge=0, le=1)], "a number in [0, 1]")
Bool = must(bool, "true or false")
Text = must(str, "a string")
Path = must(str, "a path (a string)")
OptionalPath = must(str | None, "a path (a string), or null")
Mapping = must(dict[str, Any], "a mapping ({key: value, ...})")


class Node(BaseModel):
    """A config node with a closed set of keys (an unknown key is refused, with the nearest known one)."""
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True, arbitrary_types_allowed=True)
    target: Text = Field(None, alias="_target_")
    partial: Bool = Field(None, alias="_partial_")
    convert: choice("none", "partial", "object", "all") = Field(None, alias="_convert_")


class OpenNode(Node):
    """A node whose `_target_` may take more keyword arguments than the schema names (a user's class, a
    torch optimizer): the named keys are checked, any other key is passed on."""
    model_config = ConfigDict(extra="allow")
