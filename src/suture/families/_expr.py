"""Arithmetic over a model's config values, as recipes write it: ``"1/sqrt(head_dim)"``.

Only numbers, config names, ``+ - * / // % **``, comparisons, ``and``/``or``/``not`` and
``sqrt`` are allowed; anything else is an error, so a recipe file cannot run code.

Example:
    >>> evaluate("hidden_size // num_attention_heads", {"hidden_size": 64, "num_attention_heads": 4})
    16
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Mapping
from typing import Any

from .._errors import ExpressionError

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_FUNCTIONS = {"sqrt": math.sqrt}


def evaluate(expression: str | int | float, names: Mapping[str, Any]) -> Any:
    """The value of `expression` with `names` (config fields) bound.

    Raises:
        ExpressionError: a name the config lacks, or a value it cannot be computed with
            (a division by zero, text where a number belongs), naming the values used.
    """
    if isinstance(expression, int | float):
        return expression
    tree = _parse(expression)
    try:
        return _value(tree.body, names, str(expression))
    except (ArithmeticError, TypeError, ValueError) as error:
        if isinstance(error, ExpressionError):
            raise
        used = ", ".join(f"{name}={names.get(name)!r:.40}" for name in sorted(names_in(expression)))
        raise ExpressionError(
            f"{expression!r} cannot be computed from the config ({used}): {error}."
        ) from None


def names_in(expression: str | int | float) -> set[str]:
    """The config names `expression` uses.

    Example:
        >>> sorted(names_in("hidden_size // num_attention_heads"))
        ['hidden_size', 'num_attention_heads']
    """
    if isinstance(expression, int | float):
        return set()
    return {node.id for node in ast.walk(_parse(expression)) if isinstance(node, ast.Name)} - set(
        _FUNCTIONS
    )


def _parse(expression: str | int | float) -> ast.Expression:
    try:
        return ast.parse(str(expression), mode="eval")
    except SyntaxError as error:
        raise ExpressionError(f"{expression!r} is not an expression: {error.msg}.") from None


def _value(node: ast.AST, names: Mapping[str, Any], source: str) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float | bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise ExpressionError(
                f"{source!r} uses {node.id!r}, which the model's config.json does not have."
            )
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](
            _value(node.left, names, source), _value(node.right, names, source)
        )
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.Not):
        operand = _value(node.operand, names, source)
        return -operand if isinstance(node.op, ast.USub) else not operand
    if isinstance(node, ast.BoolOp):
        values = [_value(value, names, source) for value in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        left = _value(node.left, names, source)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _value(right_node, names, source)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and len(node.args) == 1
        and not node.keywords
    ):
        return _FUNCTIONS[node.func.id](_value(node.args[0], names, source))
    raise ExpressionError(
        f"{source!r}: only numbers, config names, arithmetic, comparisons and sqrt() are "
        f"allowed in recipe expressions; found {ast.dump(node)[:60]}."
    )
