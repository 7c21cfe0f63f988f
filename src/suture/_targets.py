"""Targets: what each leaf of `suture.load`'s ``target`` asks for, and `placeholders`.

A target leaf may be:

- ``suture.PLACEHOLDER`` (``...``): do not read; the result holds ``...``.
- a ``jax.ShapeDtypeStruct``: a ``jax.Array`` of that shape and dtype, laid out by its
  ``sharding`` when it has one (each device reads only its own shard).
- a concrete ``jax.Array``: the same, with the array's shape, dtype and sharding.
- a concrete ``np.ndarray``: a numpy array of that shape and dtype.
- the type ``np.ndarray`` or ``jax.Array``: that kind of array, as stored. Orbax's idiom
  ``np.array([])`` means the same as ``np.ndarray``.
- a Python ``int``, ``float`` or ``bool``: a Python number of that type.
- anything else (a string, None): the stored value.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._errors import SurgeryError, did_you_mean
from ._paths import ancestor_paths, flatten, map_leaves_with_path, match_path_or_ancestor
from ._patterns import compile_pattern

PLACEHOLDER = ...


@dataclass(frozen=True)
class LeafTarget:
    """What one target leaf asks for.

    Attributes:
        kind: ``"skip"``, ``"numpy"``, ``"jax"``, ``"python"`` or ``"stored"`` (as saved).
        shape: the wanted shape, or None for the stored one.
        dtype: the wanted dtype, or None for the stored one.
        sharding: a jax Sharding for ``"jax"``, or None.
        python_type: int, float or bool for ``"python"``.
    """

    kind: str
    shape: tuple[int, ...] | None = None
    dtype: np.dtype | None = None
    sharding: Any = None
    python_type: type | None = None


AS_STORED = LeafTarget("stored")


class _AsStoredMarker:
    """A target leaf meaning "whatever the result holds, as stored" (internal)."""

    def __repr__(self) -> str:
        return "AS_STORED"


AS_STORED_MARKER = _AsStoredMarker()


def placeholders_as_stored(target: Any) -> Any:
    """`target` with ``...`` read as Orbax's new_tree reads it: "the value comes from the transforms"."""
    return map_leaves_with_path(
        lambda _, leaf: AS_STORED_MARKER if leaf is PLACEHOLDER else leaf, target
    )


def _jax_array_type() -> type | None:
    jax = sys.modules.get("jax")
    return jax.Array if jax is not None else None


def classify(leaf: Any) -> LeafTarget:
    """The `LeafTarget` that a target leaf means (see the module docstring)."""
    if leaf is PLACEHOLDER:
        return LeafTarget("skip")
    jax_array = _jax_array_type()
    if leaf is np.ndarray:
        return LeafTarget("numpy")
    if jax_array is not None and leaf is jax_array:
        return LeafTarget("jax")
    if type(leaf).__name__ == "ShapeDtypeStruct":
        return LeafTarget(
            "jax", tuple(leaf.shape), np.dtype(leaf.dtype), getattr(leaf, "sharding", None)
        )
    if jax_array is not None and isinstance(leaf, jax_array):
        return LeafTarget("jax", tuple(leaf.shape), np.dtype(leaf.dtype), leaf.sharding)
    if isinstance(leaf, np.ndarray):
        if leaf.shape == (0,) and leaf.dtype == np.float64:
            return LeafTarget("numpy")  # Orbax's `np.array([])`: "a numpy array, as stored"
        return LeafTarget("numpy", leaf.shape, leaf.dtype)
    if isinstance(leaf, (bool, int, float)) and not isinstance(leaf, np.generic):
        return LeafTarget("python", python_type=type(leaf))
    if isinstance(leaf, np.generic):
        return LeafTarget("numpy", (), leaf.dtype)
    return AS_STORED


def placeholders(tree: Any, skip: str) -> Any:
    """A target that loads everything but the leaves under paths matching `skip`.

    Args:
        tree: an abstract tree (``ckpt.abstract()``), an opened Checkpoint, or a path.
        skip: a regular expression that must match a whole path: a leaf's, or a subtree's
            to skip everything below it (``"opt_state"`` or ``r"opt_state/.*"``).

    Returns:
        `tree` with ``suture.PLACEHOLDER`` (``...``) on every skipped leaf.

    Raises:
        SurgeryError: when `skip` matches no path, or is not a valid regular expression.

    Example:
        >>> import numpy as np, suture
        >>> ckpt = suture.open({"params": {"w": np.ones(2)}, "opt_state": {"mu": np.ones(2)}})
        >>> target = suture.placeholders(ckpt, skip="opt_state")
        >>> target["opt_state"]["mu"], target["params"]["w"].shape
        (Ellipsis, (2,))
    """
    from ._checkpoint import Checkpoint
    from ._open import open as open_checkpoint

    if isinstance(tree, (Checkpoint, str)) or hasattr(tree, "__fspath__"):
        tree = open_checkpoint(tree).abstract()
    pattern = compile_pattern(skip, "skip=")

    def skipped(path: str) -> bool:
        return match_path_or_ancestor(pattern, path) is not None

    paths = list(flatten(tree))
    if not any(skipped(path) for path in paths):
        raise SurgeryError(
            f"skip={skip!r} matches no leaf or subtree path (it must match a whole path)."
            f"{did_you_mean(skip, ancestor_paths(paths))} Paths look like {paths[0]!r}."
        )
    return map_leaves_with_path(lambda path, leaf: PLACEHOLDER if skipped(path) else leaf, tree)
