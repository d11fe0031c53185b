"""Tools an environment may call: plain Python callables `fn(arguments: str) -> str` named by `_target_`
(with `_partial_: true`). A tool raises ValueError (or any Exception) on arguments it cannot use; the
environment turns that into an observation saying so, never a crash."""
from __future__ import annotations

import ast
import operator

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
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _eval(tree.body, max_exponent)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value)
    if len(text.lstrip("-").split(".")[0]) > max_digits:
        raise ValueError(f"result has more than {max_digits} digits")
    return text


def _eval(node, max_exponent: int):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand, max_exponent))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, max_exponent), _eval(node.right, max_exponent)
        if isinstance(node.op, ast.Pow) and abs(right) > max_exponent:
            raise ValueError(f"exponent {right} above {max_exponent}")
        try:
            return _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
    raise ValueError(f"unsupported in a calculator expression: {ast.dump(node)[:40]}")
