"""Human-readable sizes and counts, and parsing of sizes such as ``4GiB``.

Example:
    >>> human_bytes(1536 * 1024**2)
    '1.5 GiB'
    >>> parse_bytes("500MB")
    500000000
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ._errors import ArgumentError

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_UNIT_FACTORS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "k": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tib": 1024**4,
}


def human_bytes(count: float) -> str:
    """``1536`` -> ``'1.5 KiB'``; whole bytes below 1 KiB."""
    value = float(count)
    for unit in _BINARY_UNITS:
        if abs(value) < 1024 or unit == _BINARY_UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def first_and_more(names: Sequence[str], first: int, show: Callable[[str], str] = str) -> str:
    """The first `first` of `names` (each as `show` gives it), and how many more there are.

    Example:
        >>> first_and_more(["a", "b", "c", "d"], 2, repr)
        "'a', 'b' and 2 more"
        >>> first_and_more(["a"], 1)
        'a'
    """
    shown = ", ".join(show(name) for name in names[:first])
    return shown + (f" and {len(names) - first} more" if len(names) > first else "")


def human_count(count: int) -> str:
    """``1_234_567`` -> ``'1.2M'``."""
    for unit, factor in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if count >= factor:
            return f"{count / factor:.1f}{unit}"
    return str(count)


def parse_bytes(text: str | int) -> int:
    """``'4GiB'`` -> 4294967296, ``'500MB'`` -> 500000000, ``'1.5g'`` -> 1610612736.

    Raises:
        ArgumentError: when the text is not a size.
    """
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNIT_FACTORS:
        raise ArgumentError(
            f"Cannot read {text!r} as a size: expected a number and a unit, such as '4GiB', "
            f"'500MB' or '1073741824'."
        )
    return int(float(match.group(1)) * _UNIT_FACTORS[match.group(2).lower()])


def format_table(rows: list[list[str]], rule_under_header: bool = False) -> list[str]:
    """Rows as left-aligned columns two spaces apart; rows may be shorter than others.

    Example:
        >>> format_table([["name", "size"], ["w", "4 B"]], rule_under_header=True)
        ['name  size', '----  ----', 'w     4 B']
    """
    columns = max((len(row) for row in rows), default=0)
    widths = [max((len(row[i]) for row in rows if len(row) > i), default=0) for i in range(columns)]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    ]
    if rule_under_header and lines:
        lines.insert(1, "  ".join("-" * width for width in widths))
    return lines
