"""How ``--help`` shows the commands: paragraphs that wrap to the terminal, flags without a type.

Typer keeps a docstring's line breaks, so a paragraph written at 90 columns breaks into
ragged halves on an 80-column terminal: each paragraph is joined into one line, which the
help wraps to the terminal's width. A flag (``--overwrite``) takes no value, so its help
shows no ``<bool>``.

Example:
    >>> reflowed("First line.\\n\\n    A paragraph\\n    over two lines.\\n")
    'First line.\\n\\nA paragraph over two lines.'
"""

from __future__ import annotations

import inspect
from typing import Any

import typer
from typer.core import TyperOption


def reflowed(doc: str | None) -> str:
    """`doc` with each paragraph on one line."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def tidy_help(app: typer.Typer) -> None:
    """Reflows the docstrings of `app`'s commands (before typer builds their help)."""
    for command in app.registered_commands:
        if command.callback is not None:
            command.callback.__doc__ = reflowed(command.callback.__doc__)


_display_type_rich = TyperOption.display_type_rich


def _type_unless_flag(self: TyperOption, ctx: Any) -> str | None:
    return None if self.is_flag else _display_type_rich(self, ctx)


TyperOption.display_type_rich = _type_unless_flag  # type: ignore[method-assign]
