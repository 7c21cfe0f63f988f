"""Errors that blame a user's own family table when the table is what is wrong.

A typo in a table's ``hf:`` name (``c_atn`` for ``c_attn``) matches no tensor, and a typo in
an expression (``num_attention_head``) reads a field no config has; both used to read as a
config that does not fit the weights. For a table file of the user's, these errors name the
table leaf and the line of the file, and suggest the closest tensor names or config fields.

Example:
    >>> line_of_word("a: 1\\nb: x_y + 2\\n", "x_y")
    2
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._errors import ConfigMismatchError, RecipeError


def line_of_word(text: str, word: str) -> int | None:
    """The first line (from 1) of `text` holding `word` on its own (not inside a longer name)."""
    pattern = re.compile(rf"(?<![\w.]){re.escape(word)}(?![\w])")
    for number, line in enumerate(text.splitlines(), 1):
        if pattern.search(line.split("#", 1)[0]):
            return number
    return None


def _where(table_file: str, leaf: str | None, needle: str) -> str:
    """``table leaf 'x', my.yaml line 12``: as much of it as can be found."""
    try:
        line = line_of_word(Path(table_file).read_text(encoding="utf-8"), needle)
    except (OSError, UnicodeDecodeError):
        line = None
    parts = [f"table leaf {leaf!r}"] if leaf else []
    parts.append(f"{table_file} line {line}" if line else table_file)
    return ", ".join(parts)


def closest(word: str, candidates: Iterable[str], count: int = 3) -> list[str]:
    """Up to `count` of `candidates` close to `word`, closest first."""
    return difflib.get_close_matches(word, sorted(set(candidates)), n=count, cutoff=0.6)


def no_tensor_matches(
    recipe: str, table_file: str, leaf: str, hf_name: str, hf: Iterable[str]
) -> RecipeError:
    """The error for a table leaf whose ``hf:`` name (with ``{layer}``) matches no tensor."""
    placeholder = re.search(r"\{[a-z_]+\}", hf_name)
    shown = placeholder.group(0) if placeholder else "{layer}"
    # the checkpoint's names with their layer numbers as the table writes them
    templates = {re.sub(r"(?<=\.)\d+(?=\.)", shown, name) for name in hf}
    near = closest(hf_name, templates)
    hint = (
        f" Closest tensor names in the checkpoint: {', '.join(repr(n) for n in near)}."
        if near
        else ""
    )
    return RecipeError(
        f"Recipe {recipe!r} ({_where(table_file, leaf, hf_name)}): no tensor of the checkpoint "
        f"matches the leaf's hf: name {hf_name!r}, for any layer.{hint} Check the hf: name in "
        f"the table."
    )


def unknown_field(
    recipe: str, table_file: str, leaves: Iterable[Any], field: str, names: Iterable[Any]
) -> ConfigMismatchError:
    """The error for a table expression that reads `field`, which the config lacks;
    `names` are the fields known (the config's, the table's defaults)."""
    leaf = next((leaf.maxtext for leaf in leaves if _reads(_expressions(leaf), field)), None)
    near = closest(field, (name for name in names if isinstance(name, str)))
    hint = f" Did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
    return ConfigMismatchError(
        f"Recipe {recipe!r} ({_where(table_file, leaf, field)}) reads the config field "
        f"{field!r}, which config.json does not have.{hint} Fix the table's expression, or "
        f"pass the model's own config.json (--config)."
    )


def _expressions(leaf: Any) -> list[Any]:
    return [leaf.when or 0, *(e for op in leaf.operations for e in op.expressions())]


def _reads(expressions: Iterable[Any], field: str) -> bool:
    from ._expr import names_in

    return any(field in names_in(expression) for expression in expressions)
