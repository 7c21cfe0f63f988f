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

Declarative recipes are bounded: a regular UTF-8 file of at most 1 MiB, at most 100,000 YAML
nodes once aliases are expanded, and every rule's fields checked against the rule's
signature (`suture._surgery.recipe_schema`), so a mistake names the field and its line.
"""

from __future__ import annotations

import importlib.util
import os
import re
import stat
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import RecipeError as RecipeError
from .._errors import SurgeryError
from .._yaml import check_brackets
from .._yaml import parse as parse_yaml
from ..sources.checkpoint import Checkpoint
from ..sources.open import open as open_checkpoint
from . import rule_set as rule_module
from .recipe_schema import RULE_NAMES, check_arguments, positional_fields
from .recorded_input import check_gives, check_like, forward_metadata, read_record

MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of rules; a larger file is a mistake or hostile


@dataclass
class Recipe:
    """What a recipe file says: the transform (rules or a function), and optional target/init."""

    transform: Any
    target: Any = None
    init: Any = None


def load_recipe(path: str | Path) -> Recipe:
    """Reads a recipe file (see the module docstring).

    Raises:
        RecipeError: naming the file, the rule (and its line) and what is wrong.
    """
    file = Path(path)
    _check_regular(file)
    suffix = file.suffix.lower()
    if suffix == ".py":
        return _python_recipe(file)
    if suffix in (".yaml", ".yml"):
        return Recipe(_rules_from_yaml(file, _read_text(file)))
    if suffix == ".toml":
        return Recipe(_rules_from_toml(file, _checked_nesting(_read_text(file), file)))
    raise RecipeError(f"Recipe {str(file)!r}: expected a .py, .yaml, .yml or .toml file.")


def _check_regular(file: Path) -> None:
    check_regular(file, f"Recipe {str(file)!r}", "a recipe file", RecipeError)


def check_regular(file: Path, label: str, wanted: str, error: type[SurgeryError]) -> None:
    """Refuses what is not a regular file before opening it: opening a FIFO for reading
    blocks until a writer comes, and a device can be endless. `label` starts the message.
    """
    try:
        mode = file.stat().st_mode
    except (OSError, ValueError):
        raise error(f"{label} does not exist.") from None
    if not stat.S_ISREG(mode):
        raise _not_regular(label, wanted, error)


def read_limited(
    file: Path, label: str, wanted: str, limit: int, error: type[SurgeryError]
) -> bytes:
    """The bytes of the regular file `file`, refusing one over `limit` bytes without reading on.

    The file is opened non-blocking and checked again once open, so that a FIFO swapped in
    after the check cannot hang the read either.

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile(suffix=".json") as f:
        ...     _ = f.write(b"{}"); f.flush()
        ...     read_limited(Path(f.name), "Config", "a config", 10, RecipeError)
        b'{}'
    """
    check_regular(file, label, wanted, error)
    try:
        descriptor = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as failure:
        raise error(f"{label} cannot be read: {failure.strerror}.") from None
    with os.fdopen(descriptor, "rb") as stream:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # swapped in after the check
            raise _not_regular(label, wanted, error)
        raw = stream.read(limit + 1)
    if len(raw) > limit:
        raise error(f"{label} is over {limit // 1024} KiB; {wanted} is small. Check the path.")
    return raw


def _not_regular(label: str, wanted: str, error: type[SurgeryError]) -> SurgeryError:
    return error(
        f"{label} is not a regular file (a folder, pipe or device); give the path of {wanted}."
    )


def _read_text(file: Path) -> str:
    raw = read_limited(
        file, f"Recipe {str(file)!r}", "a recipe file", MAX_RECIPE_BYTES, RecipeError
    )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise RecipeError(
            f"Recipe {str(file)!r}, line {line}: not UTF-8 text (byte {raw[error.start]:#04x} "
            f"at offset {error.start}). Save the recipe as UTF-8."
        ) from None


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


def _rules_from_yaml(file: Path, text: str) -> list[rule_module.Rule]:
    data, root = parse_yaml(text, f"Recipe {str(file)!r}", "a recipe", RecipeError)
    items, nodes = _rule_items(data, file), _rule_nodes(root)
    if len(nodes) != len(items):
        nodes = [None] * len(items)
    return [
        _rule(item, _yaml_locator(file, node, i))
        for i, (item, node) in enumerate(zip(items, nodes, strict=True))
    ]


def _checked_nesting(text: str, file: Path) -> str:
    """TOML whose brackets nest at most 64 deep (`suture._yaml.MAX_NESTING`): tomllib recurses."""
    check_brackets(text, f"Recipe {str(file)!r}", "a recipe", RecipeError)
    return text


def _yaml_locator(file: Path, node: Any, index: int) -> Callable[[str], str]:
    """``where(field)``: the file and line of a rule's field (the rule's line without one)."""
    import yaml  # a format parser: loaded for YAML files only

    if node is None:
        return lambda field: f"{file}, rule {index + 1}"
    lines = {"": node.start_mark.line + 1}
    for _, arguments in node.value if isinstance(node, yaml.MappingNode) else []:
        if isinstance(arguments, yaml.MappingNode):
            for key, value in arguments.value:
                lines[str(key.value)] = value.start_mark.line + 1
    return lambda field: f"{file}, line {lines.get(field, lines[''])}"


def _rule_nodes(root: Any) -> list[Any]:
    import yaml  # a format parser: loaded for YAML files only

    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if key.value == "rules":
                root = value
    return list(root.value) if isinstance(root, yaml.SequenceNode) else []


def _rules_from_toml(file: Path, text: str) -> list[rule_module.Rule]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise RecipeError(f"Recipe {str(file)!r} is not valid TOML: {error}.") from error
    except RecursionError:
        raise RecipeError(
            f"Recipe {str(file)!r} nests too deeply to be a recipe; a recipe is a flat list of "
            f"rules."
        ) from None
    built = []
    tables = _toml_table_lines(text)
    for index, table in enumerate(_rule_items(data, file)):
        where = _toml_locator(file, text, tables[index] if index < len(tables) else None, index)
        if not isinstance(table, dict) or "rule" not in table:
            raise RecipeError(
                f'Recipe {where("")}: each [[rules]] table needs rule = "rename" (or another rule).'
            )
        if not isinstance(table["rule"], str):
            raise RecipeError(
                f"Recipe {where('rule')}: field 'rule' must be a string naming the rule (one of "
                f"{', '.join(RULE_NAMES)}); got {table['rule']!r:.80}."
            )
        arguments = {key: value for key, value in table.items() if key != "rule"}
        built.append(_rule({table["rule"]: arguments}, where))
    return built


def _toml_table_lines(text: str) -> list[int]:
    """The line (0-based) of each ``[[rules]]`` header."""
    header = re.compile(r"\s*\[\[\s*rules\s*\]\]")
    return [number for number, line in enumerate(text.splitlines()) if header.match(line)]


def _toml_locator(file: Path, text: str, first: int | None, index: int) -> Callable[[str], str]:
    if first is None:
        return lambda field: f"{file}, rule {index + 1}"
    lines = text.splitlines()

    def where(field: str) -> str:
        for number in range(first + 1, len(lines)):
            if lines[number].lstrip().startswith("["):
                break
            if field and re.match(rf"\s*[\"']?{re.escape(field)}[\"']?\s*=", lines[number]):
                return f"{file}, line {number + 1}"
        return f"{file}, line {first + 1}"

    return where


def _rule_items(data: Any, file: Path) -> list[Any]:
    items = data.get("rules") if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        family = isinstance(data, dict) and isinstance(data.get("leaves"), list)
        raise RecipeError(
            f"Recipe {str(file)!r} holds no rules: expected a list, or 'rules:' with a list."
            + (
                f" It is a model-family table (leaves:): convert with it, `suture convert "
                f"SOURCE OUT --recipe {file}` (suture.convert(..., recipe=...))."
                if family
                else ""
            )
        )
    return items


def _rule(item: Any, where: Callable[[str], str]) -> rule_module.Rule:
    if not isinstance(item, dict) or len(item) != 1:
        raise RecipeError(
            f"Recipe {where('')}: a rule is one name with its arguments, e.g. '- drop: opt_state'; "
            f"got {item!r:.200}."
        )
    ((name, arguments),) = item.items()
    if name not in RULE_NAMES:
        raise RecipeError(
            f"Recipe {where('')}: unknown rule {name!r:.80}. Known rules: {', '.join(RULE_NAMES)}."
        )
    if not isinstance(arguments, (dict, list)):
        arguments = {positional_fields(name)[0]: arguments}
    elif isinstance(arguments, list):
        fields = positional_fields(name)
        if len(arguments) > len(fields):
            raise RecipeError(
                f"Recipe {where('')}: {name} takes at most {len(fields)} values in a list "
                f"({', '.join(fields)}); got {len(arguments)}."
            )
        arguments = dict(zip(fields, arguments, strict=False))
    check_arguments(name, arguments, where)
    try:
        return getattr(rule_module, name)(**arguments)
    except (TypeError, ValueError) as error:
        raise RecipeError(f"Recipe {where('')}: {name}: {error}.") from error


def reversed_rules(
    transform: Any, like: str | None, source: Checkpoint | None = None
) -> list[rule_module.Rule]:
    """The inverse of a rule recipe (`rules.reverse`), checked against what `source` records.

    `like` is the forward input's path; without it, the input `source` (the forward run's
    output) records is used. A like that is not that input, or on which the recipe does not
    give `source`, is refused (`recorded_input`).
    """
    if isinstance(transform, rule_module.Rule):
        transform = [transform]
    if not isinstance(transform, list | tuple) or not all(
        isinstance(rule, rule_module.Rule) for rule in transform
    ):
        raise RecipeError(
            "--reverse needs a recipe of rules (RULES = [...] or a YAML/TOML rule list): a "
            "transform function or a transformations tree has no inverse."
        )
    forward = list(transform)
    where = str(source.location) if source is not None else ""
    recorded = read_record(source.custom_metadata, where) if source is not None else None
    if recorded is not None and recorded.dtype is not None:
        forward = with_cast(forward, recorded.dtype)  # the forward run's --dtype
    like_tree: Any = None
    if like is not None:
        like_tree = open_checkpoint(like).tree
        if recorded is not None:
            check_like(like_tree, recorded, like, where)
    elif recorded is not None:
        like_tree = recorded.tree()
    if like_tree is not None and source is not None:
        named = f"--like {like!r}" if like is not None else "the recorded input"
        check_gives(forward, like_tree, source.tree, named, where)
    strict = recorded is not None and recorded.strict_casts
    return rule_module.reverse(forward, like=like_tree, allow_lossy=strict)


def forward_record(
    transform: Any,
    sources: list[Any],
    dtype: str | None,
    strict_casts: bool,
    target: Any = None,
    init: Any = None,
) -> dict[str, str] | None:
    """Custom metadata recording a rule recipe's input in its output (`recorded_input`);
    None for other transforms (or rules with a target or init), several sources, or a tree
    too large to record."""
    if isinstance(transform, rule_module.Rule):
        transform = [transform]
    rules_only = isinstance(transform, list | tuple) and all(
        isinstance(rule, rule_module.Rule) for rule in transform
    )
    if not rules_only or len(sources) != 1 or target is not None or init is not None:
        return None
    return forward_metadata(sources[0], dtype, strict_casts)


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
