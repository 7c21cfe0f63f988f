"""The schema of a declarative (YAML or TOML) recipe rule, read from the rules' signatures.

Each rule of a recipe names one of `suture.rules`' constructors; its arguments are checked
against that constructor's parameters and type hints before it is called, so a wrong type
is a message naming the rule, the field, its line and the type expected, never a traceback
from inside a rule. The schema follows the signatures, so it cannot drift from them.

Example:
    >>> check_arguments("drop", {"pattern": 5}, lambda field: "r.yaml, line 2")
    Traceback (most recent call last):
    ...
    suture._errors.RecipeError: Recipe r.yaml, line 2: drop: field 'pattern' must be a string; got 5 (int).
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

from .._errors import RecipeError
from .._errors import SchemaError as SchemaError
from . import rule_set as rule_module

RULE_NAMES = (
    "rename",
    "drop",
    "keep",
    "stack",
    "unstack",
    "cast",
    "concat",
    "split",
    "transpose",
    "reshape",
    "permute",
    "scale",
)
# Parameters typed Any in Python take richer values than a recipe can express.
_RECIPE_HINTS: dict[tuple[str, str], Any] = {
    ("cast", "dtype"): str,
    ("stack", "fill"): int | float | None,
}


def check_arguments(name: str, arguments: dict[str, Any], where: Callable[[str], str]) -> None:
    """Checks `arguments` against rule `name`'s parameters; `where(field)` locates a field."""
    parameters = _parameters(name)
    for field, value in arguments.items():
        if field not in parameters:
            raise RecipeError(
                f"Recipe {where(str(field))}: {name}: unknown field {field!r}. Fields of {name}: "
                f"{', '.join(parameters)}."
            )
        hint = parameters[field][0]
        if not _fits(value, hint):
            raise RecipeError(
                f"Recipe {where(field)}: {name}: field {field!r} must be {_describe(hint)}; got "
                f"{value!r:.80} ({type(value).__name__})."
            )
    missing = [
        field for field, (_, required) in parameters.items() if required and field not in arguments
    ]
    if missing:
        raise RecipeError(
            f"Recipe {where('')}: {name}: missing field {missing[0]!r} (required: "
            f"{', '.join(f for f, (_, r) in parameters.items() if r)})."
        )


def positional_fields(name: str) -> list[str]:
    """The fields a list of arguments fills, in order (``- rename: [a, b]``)."""
    signature = inspect.signature(getattr(rule_module, name))
    return [p.name for p in signature.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD]


def _parameters(name: str) -> dict[str, tuple[Any, bool]]:
    factory = getattr(rule_module, name)
    hints = typing.get_type_hints(factory)
    return {
        parameter.name: (
            _RECIPE_HINTS.get((name, parameter.name), hints.get(parameter.name, Any)),
            parameter.default is inspect.Parameter.empty,
        )
        for parameter in inspect.signature(factory).parameters.values()
    }


def _fits(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):
        return isinstance(value, (int, float) if hint is float else int) and not isinstance(
            value, bool
        )
    if hint is str:
        return isinstance(value, str)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, option) for option in typing.get_args(hint))
    if origin in (collections.abc.Sequence, list, tuple):
        (item,) = typing.get_args(hint)[:1] or (Any,)
        return isinstance(value, list) and all(_fits(element, item) for element in value)
    return False


def _describe(hint: Any) -> str:
    if hint is type(None):
        return "null"
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
    if hint in names:
        return names[hint]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(option) for option in typing.get_args(hint))
    if origin in (collections.abc.Sequence, list, tuple):
        return f"a list of {_describe(typing.get_args(hint)[0]).removeprefix('a ')}s"
    return str(hint)
