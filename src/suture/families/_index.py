"""Which built-in table holds which family: each table's head, read without parsing the rest.

Recognising a recipe name (``qwen3-moe:maxtext``) needs only each table's ``names:``,
``target:`` and ``layouts:``; parsing every table whole with PyYAML's pure-Python loader to
learn them cost over a second before a conversion's first byte. A table's head is the lines
of those top-level keys (with the indented lines that continue them), parsed with the same
guarded loader (`suture._yaml.parse`) as a whole table; a table is parsed whole only when a
recipe of it is used (`_tables`). A test holds every built-in table's head to its whole parse.

Example:
    >>> head = table_heads()["qwen3-moe.yaml"]
    >>> head.names, head.target, head.layouts
    (('qwen3-moe',), 'maxtext', None)
"""

from __future__ import annotations

import functools
import importlib.resources
from dataclasses import dataclass

from .._errors import RecipeError
from .._yaml import parse as parse_yaml

HEAD_KEYS = ("names", "target", "layouts")


@dataclass(frozen=True)
class TableHead:
    """A table's file name, its families, its target, the layouts it offers (None: all)."""

    file: str
    names: tuple[str, ...]
    target: str
    layouts: tuple[str, ...] | None


def head_text(text: str) -> str:
    """The lines of `text` that hold its top-level `HEAD_KEYS` and their continuations.

    Example:
        >>> head_text("names: [a]\\nleaves:\\n  - {x: 1}\\ntarget: tunix\\n")
        'names: [a]\\ntarget: tunix'
    """
    kept, taking = [], False
    for line in text.splitlines():
        # an indented line, a comment or a block list item at column 0 continues the key above
        item = line.startswith("- ") or line.rstrip() == "-"
        if line[:1] not in ("", " ", "\t", "#") and not item:
            taking = line.split(":", 1)[0].strip() in HEAD_KEYS
        if taking:
            kept.append(line)
    return "\n".join(kept)


def read_head(file: str, text: str) -> TableHead:
    """The head of the built-in table `file` whose text is `text`."""
    label = f"Built-in family table {file!r}"
    data, _ = parse_yaml(head_text(text), label, "a table", RecipeError)
    data = data or {}
    layouts = data.get("layouts")
    return TableHead(
        file,
        tuple(data.get("names") or ()),
        data.get("target", "maxtext"),
        None if layouts is None else tuple(layouts),
    )


@functools.cache
def table_heads() -> dict[str, TableHead]:
    """Every built-in table's head, by file name, in file name order."""
    files = importlib.resources.files(__package__)
    return {
        entry.name: read_head(entry.name, entry.read_text(encoding="utf-8"))
        for entry in sorted(files.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".yaml")
    }


@functools.cache
def read_table(file: str) -> dict:
    """The built-in table `file`, parsed whole (once), with its ``source_file``."""
    label = f"Built-in family table {file!r}"
    text = importlib.resources.files(__package__).joinpath(file).read_text(encoding="utf-8")
    data, _ = parse_yaml(text, label, "a table", RecipeError)
    return {**data, "source_file": file}
