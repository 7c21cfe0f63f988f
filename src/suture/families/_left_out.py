"""Parts of a text checkpoint the target has no place for, left out and given back.

DeepSeek-V4's published checkpoint holds its multi-token-prediction layer (``mtp.0.*``) beside
the model; MaxText's tree has no place for it, and MaxText's converter drops it. A table's
top-level ``leave_out: [patterns]`` names such tensors: converting to the target leaves them
out, saying so (a `LeftOutWarning`: which, and how many), and ``--reverse --like ORIGINAL``
copies them back from the original folder.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     kept = left_out({"mtp.0.norm.weight": 1, "norm.weight": 2}, (r"mtp\\..*",), "r", "MaxText")
    >>> kept, caught[0].category.__name__
    ({'norm.weight': 2}, 'LeftOutWarning')
"""

from __future__ import annotations

from typing import Any

from .._lazy.array import as_lazy
from ._multimodal import matches_any, warn_left_out


def left_out(
    hf: dict[str, Any], patterns: tuple[str, ...], recipe: str, target: str
) -> dict[str, Any]:
    """`hf` without the tensors `patterns` match, warning once of those it leaves out."""
    if not patterns:
        return hf
    left = sorted(name for name in hf if matches_any(name, patterns, "leave_out"))
    if left:
        warn_left_out(f"Recipe {recipe!r}", left, f"{target}'s model", stacklevel=4)
    return {name: value for name, value in hf.items() if name not in set(left)}


def restore(patterns: tuple[str, ...], original: dict[str, Any], tensors: dict[str, Any]) -> None:
    """Copies the tensors `patterns` left out from the `original` folder into `tensors`."""
    for name, value in original.items():
        if name not in tensors and matches_any(name, patterns, "leave_out"):
            tensors[name] = as_lazy(value, path=name)
