"""Tools an environment may call: plain Python callables `fn(arguments: str) -> str` named by `_target_`
(with `_partial_: true`). A tool raises ValueError (or any Exception) on arguments it cannot use; the
environment turns that into an observation saying so, never a crash. `calculator` is pure Python (an AST
walk); `python` runs model-written code, so only ever inside the sandbox (conf/env/python_tool.yaml)."""
from __future__ import annotations

import ast
import operator

from envs.base import BudgetSpent

ECHO_CHARS = 60  # characters of the model's expression an error message repeats

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculator(expression: str, max_digits: int, max_exponent: int) -> str:
    """Evaluate an arithmetic expression of numbers, + - * / // % ** and parentheses, in pure Python (an
    AST walk: no names, calls or attributes, so nothing but arithmetic can run). Integers stay exact;
    a result with more than `max_digits` digits, an exponent above `max_exponent` or a division by zero
    raises ValueError."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, RecursionError, MemoryError, ValueError):  # ValueError: a literal past 4,300 digits
        raise ValueError(f"not an arithmetic expression: {clip(expression, ECHO_CHARS)!r}") from None
    try:
        value = _eval(tree.body, max_exponent, max_digits)
    except RecursionError:
        raise ValueError("expression nested too deeply") from None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value)
    if len(text.lstrip("-").split(".")[0]) > max_digits:
        raise ValueError(f"result has more than {max_digits} digits")
    return text


def _eval(node, max_exponent: int, max_digits: int):
    """Every intermediate result is bounded too (a nested power would otherwise build a huge number)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value, max_digits)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, max_exponent, max_digits))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, max_exponent, max_digits), _eval(node.right, max_exponent, max_digits)
        if isinstance(node.op, ast.Pow) and abs(right) > max_exponent:
            raise ValueError(f"exponent {right} above {max_exponent}")
        try:
            return _bounded(_BINARY[type(node.op)](left, right), max_digits)
        except (ZeroDivisionError, OverflowError) as e:
            raise ValueError(str(e) or type(e).__name__) from None
    raise ValueError(f"unsupported in a calculator expression: {ast.dump(node)[:40]}")


def _bounded(value, max_digits: int):
    if isinstance(value, complex):
        raise ValueError("complex result")
    magnitude = abs(value).bit_length() if isinstance(value, int) else abs(value)
    if (isinstance(value, int) and magnitude > max_digits * 3.33 + 4) or (isinstance(value, float)
                                                                          and magnitude >= 10.0 ** max_digits):
        raise ValueError(f"result has more than {max_digits} digits")
    return value


def clip(text: str, n: int) -> str:
    """`text` cut to `n` characters (an ellipsis saying so)."""
    return text if len(text) <= n else text[:n] + "…"


def python(code: str, sandbox, max_chars: int, seconds_left: float | None = None) -> str:
    """Run a Python program and return what it printed: always inside the OS sandbox that code rewards use
    (rewards/sandbox.py: namespaces, a read-only minimal root, no network, CPU/memory/process/time limits),
    never in this process. A program that fails or times out raises ValueError with the last line of its
    stderr, which the environment turns into an observation `error: ...`. Output and error are cut to
    `max_chars` characters; a program that printed more than the sandbox reads back (`max_output_kb`, then
    it is killed) returns its first `max_chars`. `seconds_left` (the round's tool time left, bound by the
    environment) stops the run sooner than the sandbox's wall seconds: then BudgetSpent."""
    if not isinstance(code, str) or not code.strip():
        raise ValueError("no code to run")
    wall = sandbox.wall_seconds if seconds_left is None else min(sandbox.wall_seconds, seconds_left)
    result = sandbox.run({"main.py": code}, ["main.py"], wall_seconds=wall)
    out = result.stdout.decode("utf-8", "replace")
    if result.output_limited:
        return out[:max_chars].rstrip("\n")
    if result.timed_out:
        if wall < sandbox.wall_seconds:
            raise BudgetSpent(f"stopped after {wall:.3g} s")
        raise ValueError(f"timed out after {sandbox.wall_seconds:g} s")
    if result.returncode != 0:
        lines = result.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ValueError(clip(lines[-1], max_chars) if lines else f"exit status {result.returncode}")
    return out[:max_chars].rstrip("\n")
