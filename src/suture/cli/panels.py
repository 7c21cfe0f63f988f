"""The help panels that group a command's options (``suture convert --help``).

Options shared by several commands are declared once (``MaxMemory = Annotated[...]``);
`in_panel` gives one command's use of them a panel without changing the others'.

Example:
    >>> from typing import Annotated, get_args
    >>> import typer
    >>> Shared = Annotated[bool, typer.Option("--verify")]
    >>> get_args(in_panel(Shared, MEMORY_AND_SAFETY))[1].rich_help_panel
    'Memory and safety'
    >>> get_args(Shared)[1].rich_help_panel is None
    True
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, get_args

OUTPUT = "Output"
FAMILIES = "Families"
QUANTIZATION = "Quantization"
ADAPTERS = "Adapters"
MEMORY_AND_SAFETY = "Memory and safety"


def in_panel(option: Any, panel: str) -> Any:
    """The ``Annotated[type, typer.Option(...)]`` `option`, shown in help panel `panel`."""
    kind, info, *rest = get_args(option)
    info = copy.copy(info)
    info.rich_help_panel = panel
    return Annotated[(kind, info, *rest)]  # type: ignore[valid-type]
