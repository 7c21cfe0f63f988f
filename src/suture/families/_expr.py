"""Arithmetic over a model's config values, as recipes write it: ``"1/sqrt(head_dim)"``.

Only numbers, config names, ``+ - * / // % **``, comparisons, ``and``/``or``/``not`` and
``sqrt``, and ``len`` of a list field (Qwen3-VL's ``deepstack_visual_indexes``) are allowed;
anything else is an error, so a recipe file cannot run code. It cannot
hang either: an expression is at most `MAX_LENGTH` characters, arithmetic takes numbers only
(no text or list repetition), and no whole number may pass ``2**MAX_BITS``, checked before a
power or product is computed (``9**9**9`` would take hours). A table's expressions are
`Expression` strings that know where the table has them, and errors say so.

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
_FUNCTIONS = {"sqrt": math.sqrt, "len": len}
MAX_LENGTH = 256  # characters; the built-in tables' longest expression has 73
MAX_BITS = 256  # whole numbers up to 2**256: far past any size or count, and instant to compute


class Expression(str):
    """An expression as a table writes it, knowing where: ``"Family table 'my.yaml', leaf
    'decoder/norm/scale', when"`` (`where`), which starts every error about it."""

    where: str

    def __new__(cls, text: str, where: str = "") -> Expression:
        made = super().__new__(cls, text)
        made.where = where
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        return (Expression, (str(self), self.where))


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
        return _value(tree.body, names, expression)
    except (ArithmeticError, TypeError, ValueError, RecursionError) as error:
        if isinstance(error, ExpressionError):
            raise
        used = ", ".join(f"{name}={names.get(name)!r:.40}" for name in sorted(names_in(expression)))
        raise ExpressionError(
            f"{located(expression)}{expression!r} cannot be computed from the config ({used}): "
            f"{error}."
        ) from None


def whole(expression: str | int | float, names: Mapping[str, Any], what: str) -> int:
    """The value of `expression` as a whole number of at least 1 (`what` it is: "a size"),
    never cut silently: 4.5 is an error, not 4.

    Example:
        >>> whole("hidden_size // 4", {"hidden_size": 64}, "a size")
        16
    """
    value = evaluate(expression, names)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ExpressionError(
            f"{located(expression)}{str(expression)!r} is {value!r:.40} with this config; it is "
            f"{what}, a whole number of at least 1. Check the expression and the config."
        )
    return value


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


def check(expression: str | int | float) -> None:
    """Refuses, before any config is read, an expression that is not one or that uses what
    the language does not have (text, attributes, calls other than ``sqrt`` and ``len``)."""
    if isinstance(expression, int | float):
        return
    for node in ast.walk(_parse(expression).body):
        if isinstance(node, ast.Constant) and not isinstance(node.value, int | float | bool):
            found = f"the constant {node.value!r:.40}"
        elif isinstance(node, ast.Call) and not (
            isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS
            and len(node.args) == 1
            and not node.keywords
        ):
            found = "a call other than sqrt(x) or len(x)"
        elif isinstance(node, _ALLOWED) or type(node) in _BINARY or type(node) in _COMPARE:
            continue
        else:
            found = type(node).__name__
        raise ExpressionError(
            f"{located(expression)}{str(expression)!r}: only numbers, config names, arithmetic, "
            f"comparisons, sqrt() and len() are allowed in recipe expressions; found {found}."
        )


_ALLOWED = (
    ast.Constant,
    ast.Name,
    ast.Load,
    ast.BinOp,
    ast.UnaryOp,
    ast.USub,
    ast.Not,
    ast.BoolOp,
    ast.And,
    ast.Or,
    ast.Compare,
    ast.Call,
)


def located(expression: Any) -> str:
    """``"Family table 'my.yaml', leaf 3 ('...').when: "``: where a table has `expression`
    (empty for one that is not a table's), to start a message about it."""
    where = getattr(expression, "where", "")
    return f"{where}: " if where else ""


def _parse(expression: str | int | float) -> ast.Expression:
    text = str(expression)
    if len(text) > MAX_LENGTH:
        raise ExpressionError(
            f"{located(expression)}{text[:60]!r}... is {len(text):,} characters long; a recipe "
            f"expression is at most {MAX_LENGTH}. Shorten it (a default can name a part)."
        )
    try:
        return ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        why = error.msg if isinstance(error, SyntaxError) else "it nests too deeply"
        raise ExpressionError(
            f"{located(expression)}{expression!r} is not an expression: {why}."
        ) from None


def _value(node: ast.AST, names: Mapping[str, Any], source: str) -> Any:
    return _bounded(_computed(node, names, source), source)


def _computed(node: ast.AST, names: Mapping[str, Any], source: str) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float | bool):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise ExpressionError(
                f"{located(source)}{source!r} uses {node.id!r}, which the model's config.json "
                f"does not have."
            )
        return names[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left, names, source), _value(node.right, names, source)
        for operand in (left, right):
            _number(operand, source)
        _check_size(type(node.op), left, right, source)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.Not):
        operand = _value(node.operand, names, source)
        if isinstance(node.op, ast.Not):
            return not operand
        return -_number(operand, source)
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
        argument = _value(node.args[0], names, source)
        if node.func.id == "len":
            return _length(argument, source)
        return _FUNCTIONS[node.func.id](_number(argument, source))
    raise ExpressionError(
        f"{located(source)}{source!r}: only numbers, config names, arithmetic, comparisons, "
        f"sqrt() and len() are allowed in recipe expressions; found {ast.dump(node)[:60]}."
    )


def _length(value: Any, source: str) -> int:
    """The length of a list field (``len(deepstack_visual_indexes)``), else an error."""
    if not isinstance(value, list | tuple):
        raise ExpressionError(
            f"{located(source)}{source!r} takes len() of {value!r:.60} "
            f"({type(value).__name__}); len() counts the items of a list field."
        )
    return len(value)


def _number(value: Any, source: str) -> Any:
    """`value` when it is a number (true and false count as 1 and 0), else an error: text or
    a list times a number would repeat it."""
    if not isinstance(value, int | float):
        raise ExpressionError(
            f"{located(source)}{source!r} does arithmetic on {value!r:.60} "
            f"({type(value).__name__}); only numbers can be computed with."
        )
    return value


def _check_size(op: type, left: Any, right: Any, source: str) -> None:
    """Refuses a power or product of whole numbers past ``2**MAX_BITS`` before computing it."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return  # a float result overflows to an error (or inf, refused after) at once
    if op is ast.Mult:
        bits = left.bit_length() + right.bit_length()
    elif op is ast.Pow and right > 0 and abs(left) > 1:
        bits = right * (abs(left).bit_length() - 1) + 1
    else:
        return
    if bits > MAX_BITS + 1:
        raise _too_large(source)


def _bounded(value: Any, source: str) -> Any:
    """`value`, refused when a whole number past ``2**MAX_BITS`` or a float that is not finite."""
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise _too_large(source)
    if isinstance(value, float) and not math.isfinite(value):
        raise ExpressionError(
            f"{located(source)}{source!r} computes {value} with this config; a recipe "
            f"expression must give a finite number. Check the expression and the config."
        )
    return value


def _too_large(source: str) -> ExpressionError:
    return ExpressionError(
        f"{located(source)}{source!r} computes a whole number past 2**{MAX_BITS} with this "
        f"config; recipe expressions are sizes and counts. Check the expression (a ** or * "
        f"too many?) and the config."
    )
