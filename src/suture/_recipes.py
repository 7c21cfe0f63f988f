"""Recipes: a surgery described in a file, for the command line.

- **Python** (``.py``): a module that defines ``RULES = [...]`` (suture.rules objects) or a
  function ``transform(*trees)``, and optionally ``TARGET`` and ``init``. A Python recipe is
  code: running it runs whatever it holds, so run only recipes you trust.
- **YAML** (``.yaml``, ``.yml``) or **TOML** (``.toml``): a declarative list of rules, loaded
  safely (no code runs). Each rule is a one-key mapping from the rule's name to its pattern,
  or to its arguments::

      rules:
        - drop: opt_state
        - rename: {pattern: 'params/linear(\\d+)', to: 'params/layer\\1'}
        - stack: {pattern: 'params/layer(?P<i>\\d+)', into: params/layers}
        - cast: {pattern: params, dtype: bfloat16}

  In TOML: ``[[rules]]`` tables with a ``rule`` key (``rule = "drop"``) and the arguments.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import rules as rule_module
from ._errors import SurgeryError

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


class RecipeError(SurgeryError):
    """A recipe file that cannot be read or holds an invalid rule."""


@dataclass
class Recipe:
    """What a recipe file says: the transform (rules or a function), and optional target/init."""

    transform: Any
    target: Any = None
    init: Any = None


def load_recipe(path: str | Path) -> Recipe:
    """Reads a recipe file (see the module docstring).

    Raises:
        RecipeError: naming the file, the rule (and its line, for YAML) and what is wrong.
    """
    file = Path(path)
    if not file.is_file():
        raise RecipeError(f"Recipe {str(file)!r} does not exist.")
    suffix = file.suffix.lower()
    if suffix == ".py":
        return _python_recipe(file)
    if suffix in (".yaml", ".yml"):
        return Recipe(_rules_from_yaml(file))
    if suffix == ".toml":
        return Recipe(_rules_from_toml(file))
    raise RecipeError(f"Recipe {str(file)!r}: expected a .py, .yaml, .yml or .toml file.")


def _python_recipe(file: Path) -> Recipe:
    spec = importlib.util.spec_from_file_location(f"suture_recipe_{abs(hash(file))}", file)
    if spec is None or spec.loader is None:
        raise RecipeError(f"Recipe {str(file)!r} cannot be loaded as Python.")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        raise RecipeError(f"Recipe {str(file)!r}, line {error.lineno}: {error.msg}.") from error
    transform = getattr(module, "RULES", None) or getattr(module, "transform", None)
    if transform is None:
        raise RecipeError(
            f"Recipe {str(file)!r} defines neither RULES = [...] nor def transform(*trees)."
        )
    return Recipe(transform, getattr(module, "TARGET", None), getattr(module, "init", None))


def _rules_from_yaml(file: Path) -> list[rule_module.Rule]:
    import yaml

    text = file.read_text()
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text)
    except yaml.YAMLError as error:
        raise RecipeError(f"Recipe {str(file)!r} is not valid YAML: {error}") from error
    items, nodes = _rule_items(data, file), _rule_nodes(root)
    lines = (
        [node.start_mark.line + 1 for node in nodes]
        if len(nodes) == len(items)
        else [None] * len(items)
    )
    return [
        _rule(item, f"{file}, line {line}" if line else f"{file}, rule {i + 1}")
        for i, (item, line) in enumerate(zip(items, lines, strict=True))
    ]


def _rule_nodes(root: Any) -> list[Any]:
    import yaml

    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if key.value == "rules":
                root = value
    return list(root.value) if isinstance(root, yaml.SequenceNode) else []


def _rules_from_toml(file: Path) -> list[rule_module.Rule]:
    import tomllib

    try:
        data = tomllib.loads(file.read_text())
    except tomllib.TOMLDecodeError as error:
        raise RecipeError(f"Recipe {str(file)!r} is not valid TOML: {error}.") from error
    built = []
    for index, table in enumerate(_rule_items(data, file)):
        where = f"{file}, rule {index + 1}"
        if not isinstance(table, dict) or "rule" not in table:
            raise RecipeError(
                f'Recipe {where}: each [[rules]] table needs rule = "rename" (or another rule).'
            )
        arguments = {key: value for key, value in table.items() if key != "rule"}
        built.append(_rule({table["rule"]: arguments}, where))
    return built


def _rule_items(data: Any, file: Path) -> list[Any]:
    items = data.get("rules") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise RecipeError(
            f"Recipe {str(file)!r} holds no rules: expected a list, or 'rules:' with a list."
        )
    return items


def _rule(item: Any, where: str) -> rule_module.Rule:
    if not isinstance(item, dict) or len(item) != 1:
        raise RecipeError(
            f"Recipe {where}: a rule is one name with its arguments, e.g. '- drop: opt_state'; got {item!r}."
        )
    ((name, arguments),) = item.items()
    if name not in RULE_NAMES:
        raise RecipeError(
            f"Recipe {where}: unknown rule {name!r}. Known rules: {', '.join(RULE_NAMES)}."
        )
    factory = getattr(rule_module, name)
    try:
        if isinstance(arguments, dict):
            return factory(**arguments)
        if isinstance(arguments, str):
            return factory(arguments)
        if isinstance(arguments, list):
            return factory(*arguments)
    except TypeError as error:
        raise RecipeError(f"Recipe {where}: {name}: {error}.") from error
    raise RecipeError(
        f"Recipe {where}: {name} takes a pattern or a mapping of arguments; got {arguments!r}."
    )


def reversed_rules(transform: Any, like: str | None) -> list[rule_module.Rule]:
    """The inverse of a rule recipe (`rules.reverse`); `like` is the forward input's path."""
    if isinstance(transform, rule_module.Rule):
        transform = [transform]
    if not isinstance(transform, list | tuple) or not all(
        isinstance(rule, rule_module.Rule) for rule in transform
    ):
        raise RecipeError(
            "--reverse needs a recipe of rules (RULES = [...] or a YAML/TOML rule list): a "
            "transform function or a transformations tree has no inverse."
        )
    from ._open import open as open_checkpoint

    return rule_module.reverse(transform, like=open_checkpoint(like) if like else None)


def with_cast(transform: Any, dtype: str) -> Any:
    """`transform` followed by a cast of every floating-point leaf to `dtype`."""
    cast = rule_module.cast(".*", dtype, optional=True)
    if transform is None:
        return [cast]
    if isinstance(transform, rule_module.Rule):
        transform = [transform]
    if isinstance(transform, (list, tuple)):
        return [*transform, cast]
    if isinstance(transform, dict):
        raise RecipeError(
            "--dtype cannot follow an Orbax-style transformations tree; add a cast to the recipe "
            "(a 'cast' rule, or value_fn=lambda v: v.astype(...))."
        )

    def transform_then_cast(*trees: Any) -> Any:
        return rule_module.apply_rules([cast], transform(*trees))

    return transform_then_cast
