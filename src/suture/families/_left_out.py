"""Parts of a text checkpoint the target has no place for, left out and given back.

DeepSeek-V4's published checkpoint holds its multi-token-prediction layer (``mtp.0.*``) beside
the model; MaxText's tree has no place for it, and MaxText's converter drops it. A table's
top-level ``leave_out: [patterns]`` names such tensors: converting to the target leaves them
out, saying so (a `LeftOutWarning`: which, and how many), and ``--reverse --like ORIGINAL``
copies them back from the original folder.

Example:
    >>> kept = left_out({"mtp.0.norm.weight": 1, "norm.weight": 2}, (r"mtp\\..*",), "r", "MaxText")
    >>> kept
    {'norm.weight': 2}
"""

from __future__ import annotations

import warnings
from typing import Any

from .._lazy.array import as_lazy
from .._patterns import compile_pattern, fullmatch
from ._multimodal import LeftOutWarning


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    # the table's patterns, matched under a time bound: a user's may backtrack
    return any(fullmatch(compile_pattern(p, "leave_out"), name) for p in patterns)


def left_out(
    hf: dict[str, Any], patterns: tuple[str, ...], recipe: str, target: str
) -> dict[str, Any]:
    """`hf` without the tensors `patterns` match, warning once of those it leaves out."""
    if not patterns:
        return hf
    left = sorted(name for name in hf if _matches(name, patterns))
    if left:
        more = f" and {len(left) - 1} more" if len(left) > 1 else ""
        warnings.warn(
            f"Recipe {recipe!r} leaves out {len(left)} tensor(s) {target}'s model has no place "
            f"for ({left[0]}{more}); `suture convert ... --reverse --like ORIGINAL` restores "
            "them.",
            LeftOutWarning,
            stacklevel=4,
        )
    return {name: value for name, value in hf.items() if name not in set(left)}


def restore(patterns: tuple[str, ...], original: dict[str, Any], tensors: dict[str, Any]) -> None:
    """Copies the tensors `patterns` left out from the `original` folder into `tensors`."""
    for name, value in original.items():
        if name not in tensors and _matches(name, patterns):
            tensors[name] = as_lazy(value, path=name)
