"""In-memory pytrees as sources: arrays become LazyArrays, everything else stays a value."""

from __future__ import annotations

from typing import Any

from .._lazy.array import LazyArray
from .._paths import map_leaves_with_path
from .checkpoint import Checkpoint


def open_memory(tree: Any) -> Checkpoint:
    """Wraps an in-memory tree (numpy or jax arrays, nested in any containers) as a source.

    The arrays are not copied; reading a LazyArray of the result reads the original array.
    """
    return Checkpoint(wrap_arrays(tree), location="<memory>", format="memory")


def wrap_arrays(tree: Any) -> Any:
    """`tree` with every in-memory array wrapped as a LazyArray (not copied)."""

    def wrap(path: str, leaf: Any) -> Any:
        if isinstance(leaf, LazyArray):
            return leaf
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype") and hasattr(leaf, "__array__"):
            return LazyArray.from_array(leaf, path=path)
        return leaf

    return map_leaves_with_path(wrap, tree)
