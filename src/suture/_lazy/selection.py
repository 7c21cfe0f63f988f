"""Selections: which elements of each axis a read wants.

A *selection* has one entry per axis: a ``range`` (a strided run, from slices and integers)
or a 1-D integer ``np.ndarray`` (a gather). Entries act independently per axis ("outer"
indexing), so the result of reading a selection has shape ``tuple(len(s) for s in sel)``.
Selections compose (`compose`), which is how a view of a view still reads only what it needs.

`parse_index` turns what users write between brackets (ints, slices, ``...``, ``None``,
one integer or boolean array) into a selection plus the axes to drop and insert.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import InvalidIndexError

AxisSelection = range | np.ndarray
Selection = tuple[AxisSelection, ...]


def full(shape: tuple[int, ...]) -> Selection:
    """The selection of every element of `shape`."""
    return tuple(range(length) for length in shape)


def is_full(selection: Selection, shape: tuple[int, ...]) -> bool:
    return all(
        isinstance(axis, range) and axis == range(length)
        for axis, length in zip(selection, shape, strict=True)
    )


def selection_shape(selection: Selection) -> tuple[int, ...]:
    return tuple(len(axis) for axis in selection)


def positions(axis: AxisSelection) -> Sequence[int]:
    """The indices an axis selection picks, in order (a range stays a range)."""
    return axis if isinstance(axis, range) else axis.tolist()


def indices(axis: AxisSelection, dtype: Any = np.int64) -> np.ndarray:
    """The indices an axis selection picks, as an array (`np.arange` for a range, which
    ``np.asarray`` would convert element by element); an index array of `dtype` comes back
    as it is, not copied, so callers must not change it.

    Example:
        >>> indices(range(6, 0, -2)).tolist()
        [6, 4, 2]
    """
    if isinstance(axis, range):
        return np.arange(axis.start, axis.stop, axis.step, dtype=dtype)
    return np.asarray(axis, dtype=dtype)


def extent(axis: AxisSelection) -> tuple[int, int] | None:
    """The smallest and largest index an axis selection picks (None where it picks none);
    O(1) for a range, which `np.min` would first turn into an array element by element.

    Example:
        >>> extent(range(10, 0, -3)), extent(np.array([4, 1, 7])), extent(range(0))
        ((1, 10), (1, 7), None)
    """
    if len(axis) == 0:
        return None
    if isinstance(axis, range):
        return min(axis[0], axis[-1]), max(axis[0], axis[-1])
    return int(np.min(axis)), int(np.max(axis))


def to_slice(axis: range) -> slice:
    """The slice that selects `axis` (a normalized range) from a sequence."""
    if len(axis) == 0:
        return slice(0, 0, 1)
    stop = axis.stop if axis.stop >= 0 else None  # range(2, -1, -1) is [2, 1, 0]
    return slice(axis.start, stop, axis.step)


def compose(outer: AxisSelection, inner: AxisSelection) -> AxisSelection:
    """The selection of ``base[outer][inner]`` expressed directly on ``base``."""
    if isinstance(outer, range):
        if isinstance(inner, range):
            step = outer.step * inner.step
            start = outer.start + inner.start * outer.step if len(inner) else 0
            return range(start, start + step * len(inner), step) if len(inner) else range(0)
        return outer.start + inner.astype(np.int64) * outer.step
    if isinstance(inner, range):
        return outer[to_slice(inner)]
    return outer[inner]


def as_range(indices: np.ndarray) -> AxisSelection:
    """`indices` as a range when they are an arithmetic progression, else unchanged."""
    if len(indices) == 0:
        return range(0)
    if len(indices) == 1:
        return range(int(indices[0]), int(indices[0]) + 1)
    steps = np.diff(indices)
    if steps[0] != 0 and np.all(steps == steps[0]):
        step = int(steps[0])
        return range(int(indices[0]), int(indices[-1]) + step, step)
    return indices


def outer_index(array: np.ndarray, selection: Selection) -> np.ndarray:
    """``array`` indexed by `selection` with numpy (a view where every entry is a range)."""
    if all(isinstance(axis, range) for axis in selection):
        return array[tuple(to_slice(axis) for axis in selection)]
    result = array
    for axis, entry in enumerate(selection):
        if isinstance(entry, range):
            result = result[(slice(None),) * axis + (to_slice(entry),)]
        else:
            result = np.take(result, entry, axis=axis)
    return result


@dataclass(frozen=True)
class ParsedIndex:
    """A user's index, split into what to read and how to reshape it.

    Attributes:
        selection: one entry per axis of the indexed array.
        dropped_axes: axes of the indexed array that an integer removed.
        new_axes: positions in the result where ``None`` inserted an axis of length 1.
        shape: the shape of the result, before `array_axis_to_front`.
        array_axis_to_front: the result axis that numpy moves to the front, or None. numpy
            does so when an array and integers index non-adjacent axes
            (``x[1, :, [0, 2]]`` has the array's axis first).
    """

    selection: Selection
    dropped_axes: tuple[int, ...]
    new_axes: tuple[int, ...]
    shape: tuple[int, ...]
    array_axis_to_front: int | None = None


def parse_index(index: Any, shape: tuple[int, ...], path: str | None = None) -> ParsedIndex:
    """Parses ``x[index]`` for an array of `shape`, with numpy's meaning.

    Supports integers, slices, ``...``, ``None`` and at most one integer or boolean array.

    Raises:
        InvalidIndexError: out-of-range integers, too many indices, several arrays.
    """
    where = f" of {path!r}" if path else ""
    entries = list(index) if isinstance(index, tuple) else [index]
    if sum(entry is Ellipsis for entry in entries) > 1:
        raise InvalidIndexError(f"Index{where} has more than one '...'.")
    consumed = sum(entry is not None and entry is not Ellipsis for entry in entries)
    if consumed > len(shape):
        raise InvalidIndexError(
            f"Too many indices{where}: the array has {len(shape)} axes (shape {shape}), the "
            f"index {index!r} uses {consumed}."
        )
    # where each entry stood in the index as written: numpy counts an Ellipsis as separating
    # an integer from an array even where it stands for no axis
    written_at = list(range(len(entries)))
    if any(entry is Ellipsis for entry in entries):
        position = next(i for i, entry in enumerate(entries) if entry is Ellipsis)
        entries[position : position + 1] = [slice(None)] * (len(shape) - consumed)
        written_at[position : position + 1] = [position] * (len(shape) - consumed)
    else:
        entries += [slice(None)] * (len(shape) - consumed)

    selection: list[AxisSelection] = []
    dropped: list[int] = []
    new_axes: list[int] = []
    out_shape: list[int] = []
    arrays_seen = 0
    array_axis = None
    advanced_entries = []  # where ints and arrays stood in the index, for numpy's rule
    axis = 0
    for position_in_index, entry in enumerate(entries):
        if entry is None:
            new_axes.append(len(out_shape))
            out_shape.append(1)
            continue
        length = shape[axis]
        if isinstance(entry, slice):
            selection.append(range(length)[entry])
            out_shape.append(len(selection[-1]))
        elif _is_integer(entry):
            position = _checked_position(int(entry), length, axis, where)
            selection.append(range(position, position + 1))
            dropped.append(axis)
            advanced_entries.append(written_at[position_in_index])
        else:
            arrays_seen += 1
            if arrays_seen > 1:
                raise InvalidIndexError(
                    f"Index{where} has more than one array; LazyArray supports one array per "
                    f"index. Index one axis at a time: x[a][:, b]."
                )
            indices = _array_positions(entry, length, axis, where)
            selection.append(as_range(indices))
            array_axis = len(out_shape)
            out_shape.append(len(indices))
            advanced_entries.append(written_at[position_in_index])
        axis += 1
    adjacent = (
        advanced_entries == list(range(advanced_entries[0], advanced_entries[-1] + 1))
        if advanced_entries
        else True
    )
    to_front = array_axis if array_axis is not None and not adjacent else None
    return ParsedIndex(
        tuple(selection), tuple(dropped), tuple(new_axes), tuple(out_shape), to_front
    )


def _is_integer(entry: Any) -> bool:
    if isinstance(entry, (bool, np.bool_)):
        return False
    if isinstance(entry, numbers.Integral):
        return True
    return isinstance(entry, np.ndarray) and entry.ndim == 0 and entry.dtype.kind in "iu"


def _checked_position(position: int, length: int, axis: int, where: str) -> int:
    if not -length <= position < length:
        raise InvalidIndexError(
            f"Index {position} is out of bounds for axis {axis}{where}, which has length {length}."
        )
    return position % length


def _array_positions(entry: Any, length: int, axis: int, where: str) -> np.ndarray:
    array = np.asarray(entry)
    if array.dtype == bool:
        if array.shape != (length,):
            raise InvalidIndexError(
                f"Boolean index for axis {axis}{where} has shape {array.shape}; expected "
                f"({length},)."
            )
        return np.flatnonzero(array)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise InvalidIndexError(
            f"Unsupported index {entry!r}{where}: expected an int, a slice, '...', None, or "
            f"a 1-D array of integers or booleans."
        )
    array = array.astype(np.int64)
    if array.size and (array.min() < -length or array.max() >= length):
        raise InvalidIndexError(
            f"Index array for axis {axis}{where} holds values outside [-{length}, {length})."
        )
    return np.where(array < 0, array + length, array)
