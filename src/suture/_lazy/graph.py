"""The computation graph behind LazyArray: sources and structural operations.

Every node knows its shape and dtype without reading, and answers
``read(selection) -> np.ndarray`` (see `_selection`) with an array of exactly the selected
elements. Operations push the selection down to their inputs, so a view reads only the
elements it shows: ``stack(xs)[3]`` reads ``xs[3]``; ``x.T[0]`` reads one column of ``x``;
a TensorStore source reads only the chunks that the selection touches.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .._buffers import aligned_empty, assign
from .._errors import ShapeMismatchError, SurgeryError
from .selection import (
    Selection,
    as_range,
    compose,
    full,
    is_full,
    outer_index,
    positions,
    selection_shape,
)


class Node(ABC):
    """One array in the graph: a source, or an operation on other nodes."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @abstractmethod
    def read(self, selection: Selection) -> np.ndarray:
        """The selected elements, as an array of shape ``selection_shape(selection)``."""

    @abstractmethod
    def inputs(self) -> tuple[Node, ...]:
        """The nodes this node reads from (empty for sources)."""

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        """Writes the selected elements into `out` (their shape; cast to ``out.dtype``).

        `out` may be a strided view (a transposed or stacked part of a larger result).
        Nodes that can fill it without a full-size temporary override this.
        """
        assign(out, self.read(selection))


class ReadCost(NamedTuple):
    """What one source read takes: bytes from storage, and bytes held at its peak."""

    disk: int
    memory: int


class SourceNode(Node):
    """A stored array; `path` names it in its checkpoint and `origin` names the checkpoint."""

    path: str | None
    origin: str | None

    def start_opening(self) -> None:
        """Starts opening the stored array without waiting (`open_all`); most sources have
        nothing to open."""

    def finish_opening(self) -> None:
        """Waits for what `start_opening` began."""

    def read_cost(self, selection: Selection, into: bool = False) -> ReadCost:
        """Bytes a read of `selection` takes from storage, and holds (see `_reads.read_memory`).

        By default: the selected elements, read into a temporary result.
        """
        selected = math.prod(selection_shape(selection)) * self.dtype.itemsize
        return ReadCost(selected, selected)


# Casting into a strided (transposed) view element by element runs at about 0.2 GB/s here;
def open_all(sources: list[SourceNode]) -> None:
    """Opens every source at once before any data is read.

    Opening reads metadata (small, scattered reads); doing it all up front, concurrently,
    keeps those reads from interleaving with large data reads on a cold disk.
    """
    for source in sources:
        source.start_opening()
    for source in sources:
        source.finish_opening()


class MemorySource(SourceNode):
    """An array already in memory (numpy, jax, or anything ``np.asarray`` accepts)."""

    def __init__(self, array: Any, path: str | None = None, origin: str | None = None) -> None:
        self.array = array
        self.shape = tuple(int(length) for length in array.shape)
        self.dtype = np.dtype(array.dtype)
        self.path, self.origin = path, origin

    def read(self, selection: Selection) -> np.ndarray:
        return np.array(outer_index(np.asarray(self.array), selection), copy=True)

    def inputs(self) -> tuple[Node, ...]:
        return ()


class IndexNode(Node):
    """``base[index]``: a selection of `base`, minus integer-indexed axes, plus new axes."""

    def __init__(
        self,
        base: Node,
        selection: Selection,
        dropped_axes: tuple[int, ...],
        new_axes: tuple[int, ...],
        shape: tuple[int, ...],
    ) -> None:
        self.base, self.selection = base, selection
        self.dropped_axes, self.new_axes = dropped_axes, new_axes
        self.shape, self.dtype = shape, base.dtype
        kept_axes = [axis for axis in range(len(base.shape)) if axis not in dropped_axes]
        # For each result axis: the base axis it comes from, or None for a new axis.
        self._origin_axes: list[int | None] = []
        kept = iter(kept_axes)
        for position in range(len(shape)):
            self._origin_axes.append(None if position in new_axes else next(kept))

    def base_selection(self, selection: Selection) -> Selection:
        """What `selection` of this view reads of `base`."""
        base_selection = list(self.selection)
        for position, base_axis in enumerate(self._origin_axes):
            if base_axis is not None:
                base_selection[base_axis] = compose(self.selection[base_axis], selection[position])
        return tuple(base_selection)

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        if self.new_axes:
            super().read_into(selection, out)
            return
        # the dropped (integer-indexed) axes as length-1 axes of a view of `out`: no temporary
        self.base.read_into(self.base_selection(selection), np.expand_dims(out, self.dropped_axes))

    def read(self, selection: Selection) -> np.ndarray:
        base_selection = list(self.base_selection(selection))
        values = self.base.read(tuple(base_selection))
        kept_shape = [
            len(base_selection[axis])
            for axis in range(len(self.base.shape))
            if axis not in self.dropped_axes
        ]
        values = values.reshape(kept_shape)
        for position in self.new_axes:
            values = np.expand_dims(values, position)
            wanted = selection[position]
            if not (isinstance(wanted, range) and wanted == range(1)):  # x[None][[0, 0]]
                picked = np.asarray(positions(wanted), dtype=np.int64)
                values = np.take(values, picked, axis=position)
        return values

    def inputs(self) -> tuple[Node, ...]:
        return (self.base,)


class CastNode(Node):
    """`base` converted to `dtype` as it is read."""

    def __init__(self, base: Node, dtype: np.dtype) -> None:
        self.base, self.shape, self.dtype = base, base.shape, dtype

    def read(self, selection: Selection) -> np.ndarray:
        result = aligned_empty(selection_shape(selection), self.dtype)
        self.base.read_into(selection, result)  # the base casts as it fills: no temporary
        return result

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        if out.dtype == self.dtype:
            self.base.read_into(selection, out)
        else:  # cast to this node's dtype first: casting straight to out's could round once less
            assign(out, self.read(selection))

    def inputs(self) -> tuple[Node, ...]:
        return (self.base,)


class TransposeNode(Node):
    """`base` with its axes permuted: result axis ``j`` is base axis ``axes[j]``."""

    def __init__(self, base: Node, axes: tuple[int, ...]) -> None:
        self.base, self.axes = base, axes
        self.shape = tuple(base.shape[axis] for axis in axes)
        self.dtype = base.dtype

    def read(self, selection: Selection) -> np.ndarray:
        base_selection: list[Any] = [None] * len(self.axes)
        for position, base_axis in enumerate(self.axes):
            base_selection[base_axis] = selection[position]
        return self.base.read(tuple(base_selection)).transpose(self.axes)

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        base_selection: list[Any] = [None] * len(self.axes)
        for position, base_axis in enumerate(self.axes):
            base_selection[base_axis] = selection[position]
        self.base.read_into(tuple(base_selection), out.transpose(np.argsort(self.axes)))

    def inputs(self) -> tuple[Node, ...]:
        return (self.base,)


class ReshapeNode(Node):
    """`base` reshaped (C order). Leading axes that the reshape keeps are read selectively."""

    def __init__(self, base: Node, shape: tuple[int, ...]) -> None:
        self.base, self.shape, self.dtype = base, shape, base.dtype
        kept = 0
        while kept < min(len(shape), len(base.shape)) - 1 and shape[kept] == base.shape[kept]:
            kept += 1
        self.kept_leading_axes = kept

    def read(self, selection: Selection) -> np.ndarray:
        kept = self.kept_leading_axes
        base_selection = tuple(selection[:kept]) + full(self.base.shape[kept:])
        values = self.base.read(base_selection)
        values = values.reshape(selection_shape(selection[:kept]) + self.shape[kept:])
        trailing = tuple(range(length) for length in selection_shape(selection[:kept]))
        return outer_index(values, trailing + tuple(selection[kept:]))

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        kept = self.kept_leading_axes
        base_selection = tuple(selection[:kept]) + full(self.base.shape[kept:])
        if not is_full(selection[kept:], self.shape[kept:]):
            super().read_into(selection, out)
            return
        # the same memory in the base's shape, so the base fills `out` itself; where `out`'s
        # strides do not allow that, reshape copies (new memory) and `out` is filled as usual
        target = out.reshape(selection_shape(base_selection))
        if not np.may_share_memory(target, out):
            super().read_into(selection, out)
            return
        self.base.read_into(base_selection, target)

    def inputs(self) -> tuple[Node, ...]:
        return (self.base,)


class StackNode(Node):
    """`members` stacked along a new `axis`."""

    def __init__(self, members: Sequence[Node], axis: int, dtype: np.dtype) -> None:
        self.members, self.axis, self.dtype = tuple(members), axis, dtype
        member_shape = members[0].shape
        self.shape = member_shape[:axis] + (len(members),) + member_shape[axis:]

    def read(self, selection: Selection) -> np.ndarray:
        result = aligned_empty(selection_shape(selection), self.dtype)
        self.read_into(selection, result)
        return result

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        if out.dtype != self.dtype and any(m.dtype != self.dtype for m in self.members):
            assign(out, self.read(selection))  # promote first, as `read` does
            return
        member_selection = selection[: self.axis] + selection[self.axis + 1 :]
        for position, member in enumerate(positions(selection[self.axis])):
            target = (slice(None),) * self.axis + (position,)
            self.members[member].read_into(member_selection, out[target])

    def inputs(self) -> tuple[Node, ...]:
        return self.members


class ConcatNode(Node):
    """`members` joined along an existing `axis`."""

    def __init__(self, members: Sequence[Node], axis: int, dtype: np.dtype) -> None:
        self.members, self.axis, self.dtype = tuple(members), axis, dtype
        lengths = [member.shape[axis] for member in members]
        self._offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        first = members[0].shape
        self.shape = first[:axis] + (int(self._offsets[-1]),) + first[axis + 1 :]

    def read(self, selection: Selection) -> np.ndarray:
        result = np.empty(selection_shape(selection), self.dtype)
        wanted = np.asarray(positions(selection[self.axis]), dtype=np.int64)
        owners = np.searchsorted(self._offsets[1:], wanted, side="right")
        start = 0
        while start < len(wanted):  # one read per run of positions owned by one member
            owner = owners[start]
            stop = start + 1
            while stop < len(wanted) and owners[stop] == owner:
                stop += 1
            local = as_range(wanted[start:stop] - self._offsets[owner])
            member_selection = selection[: self.axis] + (local,) + selection[self.axis + 1 :]
            target = (slice(None),) * self.axis + (slice(start, stop),)
            result[target] = self.members[owner].read(member_selection)
            start = stop
        return result

    def inputs(self) -> tuple[Node, ...]:
        return self.members


class PadNode(Node):
    """`base` zero-padded at the end of each axis up to `shape`; only its in-bounds part is read."""

    def __init__(self, base: Node, shape: tuple[int, ...]) -> None:
        self.base, self.shape, self.dtype = base, shape, base.dtype

    def read(self, selection: Selection) -> np.ndarray:
        result = np.zeros(selection_shape(selection), self.dtype)
        inside_positions, base_selection = [], []
        for axis_selection, base_length in zip(selection, self.base.shape, strict=True):
            indices = np.asarray(positions(axis_selection), dtype=np.int64)
            inside = np.flatnonzero(indices < base_length)
            if len(inside) == 0:
                return result
            inside_positions.append(inside)
            base_selection.append(as_range(indices[inside]))
        result[np.ix_(*inside_positions)] = self.base.read(tuple(base_selection))
        return result

    def inputs(self) -> tuple[Node, ...]:
        return (self.base,)


class MapNode(Node):
    """``fn(*inputs)`` computed when read.

    An `elementwise` function (output element ``i`` depends only on input elements ``i``,
    all shapes equal) reads only the selected elements of its inputs; any other function
    reads its inputs whole.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        inputs: Sequence[Node],
        shape: tuple[int, ...],
        dtype: np.dtype,
        elementwise: bool,
        name: str,
    ) -> None:
        self.fn, self.members = fn, tuple(inputs)
        self.shape, self.dtype, self.elementwise, self.name = shape, dtype, elementwise, name

    def read(self, selection: Selection) -> np.ndarray:
        if self.elementwise:
            values = self.fn(*(member.read(selection) for member in self.members))
            return self._checked(values, selection_shape(selection))
        values = self.fn(*(member.read(full(member.shape)) for member in self.members))
        values = self._checked(values, self.shape)
        return values if is_full(selection, self.shape) else outer_index(values, selection)

    def _checked(self, values: Any, expected_shape: tuple[int, ...]) -> np.ndarray:
        array = np.asarray(values)
        if array.shape != expected_shape:
            raise ShapeMismatchError(
                f"suture.map({self.name}) returned shape {array.shape}, expected "
                f"{expected_shape}. Pass the right shape= to suture.map, or fix the function."
            )
        if array.dtype != self.dtype:
            if not np.can_cast(array.dtype, self.dtype, casting="same_kind"):
                raise SurgeryError(
                    f"suture.map({self.name}) returned dtype {array.dtype}, expected "
                    f"{self.dtype}. Pass dtype={array.dtype.name!r} to suture.map, or cast "
                    f"inside the function."
                )
            array = array.astype(self.dtype)
        return array

    def inputs(self) -> tuple[Node, ...]:
        return self.members


def source_nodes(node: Node) -> list[SourceNode]:
    """The distinct source nodes that `node` reads from, in first-use order."""
    found: dict[int, SourceNode] = {}
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, SourceNode):
            found.setdefault(id(current), current)
        pending.extend(reversed(current.inputs()))
    return list(found.values())
