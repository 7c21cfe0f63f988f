"""Targets: what each leaf of `suture.load`'s ``target`` asks for, and `placeholders`.

A target leaf may be (Orbax's meaning in each case):

- ``suture.PLACEHOLDER`` (``...``): do not read; the result holds ``...``.
- a ``jax.ShapeDtypeStruct``: a ``jax.Array`` of that shape and dtype, laid out by its
  ``sharding`` when it has one (each device reads only its own shard). With no sharding,
  Orbax follows the checkpoint: the sharding it recorded for a saved ``jax.Array``, and a
  numpy array (of the wanted dtype) for a leaf saved as numpy or as a Python number.
- a concrete ``jax.Array``: the same, with the array's shape, dtype and sharding.
- a concrete ``np.ndarray`` or numpy scalar: a numpy array of that dtype, in the stored
  shape (Orbax v1 ignores a numpy target's shape; with ``pad_truncate=True`` the shape is
  padded or truncated to the target's, except for the idiom ``np.array([])``).
- the type ``np.ndarray`` or ``jax.Array``: that kind of array, as stored.
- a Python ``int``, ``float`` or ``bool``: a Python number of that type.
- Orbax's own metadata: v1 ``NumpyShapeDtype``/``NumpyMetadata`` (numpy of that dtype),
  v1 ``ArrayMetadata`` (a jax.Array with its recorded sharding), v0 ``ArrayMetadata``
  (a jax.Array when it records a sharding, else numpy), v0 ``ScalarMetadata`` (a Python
  number), ``StringMetadata`` (as stored).
- an empty container (``optax.EmptyState()``, ``optax.MaskedNode()``, ``{}``): the
  target's own object; nothing is read.
- anything else (a string, None, a dataclass jax does not register): the stored value.

A stored ``None`` (an Optax-masked leaf) restores as ``None`` whatever the target asks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import ArgumentError, did_you_mean
from .._jaxtypes import is_shape_dtype_struct, jax_array_type
from .._paths import ancestor_paths, flatten, map_leaves_with_path, match_path_or_ancestor
from .._patterns import compile_pattern
from ..sources.checkpoint import Checkpoint
from ..sources.open import open as open_checkpoint

PLACEHOLDER = ...


@dataclass(frozen=True)
class LeafTarget:
    """What one target leaf asks for.

    Attributes:
        kind: ``"skip"``, ``"empty"`` (an empty container: the target's own object),
            ``"numpy"``, ``"jax"``, ``"python"`` or ``"stored"`` (as saved).
        shape: the wanted shape, or None for the stored one.
        dtype: the wanted dtype, or None for the stored one.
        sharding: for ``"jax"``: a jax Sharding, Orbax sharding metadata, or None (the
            checkpoint's recorded sharding).
        python_type: int, float or bool for ``"python"``.
        shape_needs_pad_truncate: the shape applies only with ``pad_truncate=True``
            (numpy targets: Orbax restores them in the stored shape).
        abstract: the leaf describes an array but holds no value (a ShapeDtypeStruct, a
            type, Orbax metadata); a concrete leaf is kept as it is when the checkpoint
            lacks its path and ``partial=True``.
        numpy_if_saved_as_numpy: a ShapeDtypeStruct with no sharding: a leaf Orbax saved
            as numpy or as a Python number comes back as numpy, as Orbax restores it.
    """

    kind: str
    shape: tuple[int, ...] | None = None
    dtype: np.dtype | None = None
    sharding: Any = None
    python_type: type | None = None
    shape_needs_pad_truncate: bool = False
    abstract: bool = False
    numpy_if_saved_as_numpy: bool = False


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


def unfilled_as_placeholders(tree: Any) -> Any:
    """`tree` with the leaves `placeholders_as_stored` marked, that nothing filled, back to ``...``.

    Orbax's ``apply_transformations`` keeps the new tree's value where neither a
    transformation nor the original tree gives one; for ``...`` that value is ``...``.
    """
    return map_leaves_with_path(
        lambda _, leaf: PLACEHOLDER if leaf is AS_STORED_MARKER else leaf, tree
    )


def classify(leaf: Any) -> LeafTarget:
    """The `LeafTarget` that a target leaf means (see the module docstring)."""
    if leaf is PLACEHOLDER:
        return LeafTarget("skip", abstract=True)
    jax_array = jax_array_type()
    if leaf is np.ndarray:
        return LeafTarget("numpy", abstract=True)
    if jax_array is not None and leaf is jax_array:
        return LeafTarget("jax", abstract=True)
    if is_shape_dtype_struct(leaf):
        sharding = getattr(leaf, "sharding", None)
        return LeafTarget(
            "jax",
            tuple(leaf.shape),
            np.dtype(leaf.dtype),
            sharding,
            abstract=True,
            numpy_if_saved_as_numpy=sharding is None,
        )
    if jax_array is not None and isinstance(leaf, jax_array):
        return LeafTarget("jax", tuple(leaf.shape), np.dtype(leaf.dtype), leaf.sharding)
    if isinstance(leaf, np.ndarray):
        if leaf.ndim == 1 and leaf.size == 0:
            return LeafTarget("numpy", dtype=leaf.dtype)  # Orbax's `np.array([])` idiom
        return LeafTarget("numpy", leaf.shape, leaf.dtype, shape_needs_pad_truncate=True)
    if isinstance(leaf, np.generic):
        return LeafTarget("numpy", dtype=leaf.dtype)
    if isinstance(leaf, (bool, int, float)):
        return LeafTarget("python", python_type=type(leaf))
    if is_empty_container(leaf):
        return LeafTarget("empty")
    return _orbax_metadata_target(leaf) or AS_STORED


_PYTHON_TYPE_OF_KIND = {"b": bool, "i": int, "u": int, "f": float}


def _orbax_metadata_target(leaf: Any) -> LeafTarget | None:
    """What a leaf of Orbax's metadata tree (v1 ``ocp.metadata``, v0 ``.metadata``) asks for."""
    kind = type(leaf)
    if not kind.__module__.startswith("orbax.") or not hasattr(leaf, "dtype"):
        return None
    dtype = None if leaf.dtype is None else np.dtype(leaf.dtype)
    shape = None if getattr(leaf, "shape", None) is None else tuple(leaf.shape)
    name = kind.__name__
    if name in ("NumpyShapeDtype", "NumpyMetadata", "NumpyShapeDtypeStruct"):
        return LeafTarget("numpy", shape, dtype, shape_needs_pad_truncate=True, abstract=True)
    if name == "ScalarMetadata":
        python_type = _PYTHON_TYPE_OF_KIND.get(dtype.kind) if dtype is not None else None
        return LeafTarget("python", python_type=python_type, abstract=True) if python_type else None
    if name == "ArrayMetadata":
        if hasattr(leaf, "sharding_metadata"):  # v1: always a jax.Array
            return LeafTarget("jax", shape, dtype, leaf.sharding_metadata, abstract=True)
        if getattr(leaf, "sharding", None) is None:  # v0: saved as numpy
            return LeafTarget("numpy", shape, dtype, shape_needs_pad_truncate=True, abstract=True)
        return LeafTarget("jax", shape, dtype, leaf.sharding, abstract=True)
    return None


def is_empty_container(value: Any) -> bool:
    """A container with no leaves (``{}``, ``()``, ``optax.EmptyState()``, ``MaskedNode()``)."""
    return isinstance(value, (Mapping, list, tuple)) and len(value) == 0


def unwrap_metadata_tree(target: Any) -> Any:
    """The tree inside Orbax's ``TreeMetadata`` (v0 ``Checkpointer.metadata(p).item_metadata``)."""
    if "TreeMetadata" in type(target).__name__ and hasattr(target, "tree"):
        return target.tree
    return target


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
    if isinstance(tree, (Checkpoint, str)) or hasattr(tree, "__fspath__"):
        tree = open_checkpoint(tree).abstract()
    pattern = compile_pattern(skip, "skip=")

    def skipped(path: str) -> bool:
        return match_path_or_ancestor(pattern, path) is not None

    paths = list(flatten(tree))
    if not any(skipped(path) for path in paths):
        raise ArgumentError(
            f"skip={skip!r} matches no leaf or subtree path (it must match a whole path)."
            f"{did_you_mean(skip, ancestor_paths(paths))} Paths look like {paths[0]!r}."
        )
    return map_leaves_with_path(lambda path, leaf: PLACEHOLDER if skipped(path) else leaf, tree)
