"""Lazy arrays made from several others, or reshaped to a target: stack, concatenate, fit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._errors import InvalidIndexError, ShapeMismatchError
from .._jaxtypes import is_tracer
from .array import LazyArray, as_lazy, common_path
from .array import map as lazy_map
from .joins import ConcatNode, PadNode, StackNode


def _joined(arrays: Sequence[Any], axis: int, operation: str, new_axis: bool) -> tuple:
    if not arrays:
        raise ShapeMismatchError(f"suture.{operation} needs at least one array.")
    lazy = [as_lazy(array) for array in arrays]
    ndim = lazy[0].ndim + (1 if new_axis else 0)
    if not -ndim <= axis < ndim:
        raise InvalidIndexError(f"suture.{operation}: axis {axis} is out of range for {ndim} axes.")
    axis %= ndim
    for array in lazy[1:]:
        same = (
            array.shape == lazy[0].shape
            if new_axis
            else array.ndim == lazy[0].ndim
            and all(
                a == b
                for i, (a, b) in enumerate(zip(array.shape, lazy[0].shape, strict=True))
                if i != axis
            )
        )
        if not same:
            raise ShapeMismatchError(
                f"suture.{operation}: {array.path or 'an array'} has shape {array.shape}, which "
                f"does not fit {lazy[0].path or 'the first array'} with shape {lazy[0].shape}"
                + ("" if new_axis else f" along axis {axis}")
                + ". Slice or pad them to matching shapes first."
            )
    dtype = np.result_type(*(array.dtype for array in lazy))
    return lazy, axis, dtype


def _traced(arrays: Sequence[Any]) -> bool:
    return any(is_tracer(array) for array in arrays)


def stack(arrays: Sequence[Any], axis: int = 0) -> LazyArray:
    """Stacks equally shaped arrays along a new axis, lazily.

    Reading one index of the stacked axis reads only that member.

    Example:
        >>> import numpy as np, suture
        >>> layers = [suture.LazyArray.from_array(np.full((2,), i)) for i in range(3)]
        >>> suture.stack(layers).shape
        (3, 2)
        >>> suture.stack(layers)[2].read()
        array([2, 2])
    """
    if _traced(arrays):  # inside a function jax traces (see suture._lazy.trace): jax's own stack
        import jax.numpy as jnp  # heavy: loaded on first use, not at import

        return jnp.stack(arrays, axis=axis)
    lazy, axis, dtype = _joined(arrays, axis, "stack", new_axis=True)
    return LazyArray(StackNode([array.node for array in lazy], axis, dtype), common_path(lazy))


def concatenate(arrays: Sequence[Any], axis: int = 0) -> LazyArray:
    """Joins arrays along an existing axis, lazily.

    Example:
        >>> import numpy as np, suture
        >>> q, k = (suture.LazyArray.from_array(np.full((2, 2), i)) for i in (1, 2))
        >>> suture.concatenate([q, k], axis=1)[0].read()
        array([1, 1, 2, 2])
    """
    if _traced(arrays):
        import jax.numpy as jnp  # heavy: loaded on first use, not at import

        return jnp.concatenate(arrays, axis=axis)
    lazy, axis, dtype = _joined(arrays, axis, "concatenate", new_axis=False)
    return LazyArray(ConcatNode([array.node for array in lazy], axis, dtype), common_path(lazy))


def fit_shape(array: LazyArray, shape: tuple[int, ...], fill: Any = "zeros") -> LazyArray:
    """`array` truncated or padded at the end of each axis to `shape`, lazily.

    Truncation reads only the kept part; padding reads the whole (smaller) source. The new
    elements are zeros (`fill` ``"zeros"``); with ``"mean"``, the mean of the existing rows
    along the one axis that grows (new tokens of a bigger vocabulary, as people initialize
    them); with an array of `shape` (a model's own initial values), its elements there.

    Example:
        >>> x = LazyArray.from_array(np.arange(6).reshape(2, 3))
        >>> fit_shape(x, (3, 2)).read().tolist()
        [[0, 1], [3, 4], [0, 0]]
        >>> fit_shape(LazyArray.from_array(np.asarray([[1.0], [3.0]])), (3, 1), "mean").read().tolist()
        [[1.0], [3.0], [2.0]]
    """
    if len(shape) != array.ndim:
        raise ShapeMismatchError(
            f"Leaf {array.path!r} has shape {array.shape} and cannot be padded or truncated to "
            f"{shape}: the number of axes differs. Reshape it with a rule first."
        )
    if any(want < 0 for want in shape):
        raise ShapeMismatchError(
            f"Leaf {array.path!r} has shape {array.shape} and cannot be padded or truncated to "
            f"{shape}, which has a negative size; no array can. Give the sizes it should have."
        )
    kept = tuple(slice(0, min(have, want)) for have, want in zip(array.shape, shape, strict=True))
    truncated = (
        array[kept]
        if any(want < have for have, want in zip(array.shape, shape, strict=True))
        else array
    )
    if truncated.shape == shape:
        return truncated
    if isinstance(fill, str) and fill == "zeros":
        return truncated.with_node(PadNode(truncated.node, shape))
    return _padded_with(truncated, shape, fill)


def _padded_with(array: LazyArray, shape: tuple[int, ...], fill: Any) -> LazyArray:
    """`array` grown along its one growing axis with the mean of its rows, or `fill`'s."""
    grown = [
        axis
        for axis, (have, want) in enumerate(zip(array.shape, shape, strict=True))
        if want > have
    ]
    if len(grown) != 1:
        raise ShapeMismatchError(
            f"Leaf {array.path!r}: padding {array.shape} to {shape} grows {len(grown)} axes; "
            f"padding with the mean or with initial values grows one (the vocabulary's). Pad "
            f"with zeros (pad_truncate=True), or reshape it first."
        )
    axis = grown[0]
    extra = tuple(
        want - have if i == axis else want
        for i, (have, want) in enumerate(zip(array.shape, shape, strict=True))
    )
    if isinstance(fill, str):
        if fill != "mean":
            raise ShapeMismatchError(
                f"Unknown padding {fill!r}: pad with 'zeros', 'mean', or initial values."
            )
        if array.shape[axis] == 0 and 0 not in extra:
            raise ShapeMismatchError(
                f"Leaf {array.path!r} has no rows along axis {axis} (shape {array.shape}) to "
                f"average: padding it to {shape} with their mean would fill NaN. Pad with "
                f"zeros (pad_truncate=True), or give it initial values."
            )
        dtype = array.dtype

        def mean_rows(values: np.ndarray) -> np.ndarray:
            mean = np.mean(values, axis=axis, keepdims=True, dtype=np.float64)
            return np.broadcast_to(mean.astype(dtype), extra)

        mean_rows.__name__ = f"mean_of_rows_{axis}"
        new = lazy_map(mean_rows, array, shape=extra, dtype=dtype)
    else:
        values = as_lazy(fill)
        if tuple(values.shape) != tuple(shape):
            raise ShapeMismatchError(
                f"Leaf {array.path!r}: the initial values for its new rows have shape "
                f"{tuple(values.shape)}, not the target's {shape}."
            )
        rows = tuple(
            slice(array.shape[i], None) if i == axis else slice(None) for i in range(len(shape))
        )
        new = values[rows].astype(array.dtype)
    return concatenate([array, new], axis=axis)
