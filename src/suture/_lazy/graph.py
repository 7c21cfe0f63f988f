"""The computation graph behind LazyArray: sources and structural operations.

Every node knows its shape and dtype without reading, and answers
``read(selection) -> np.ndarray`` (see `_selection`) with an array of exactly the selected
elements. Operations push the selection down to their inputs, so a view reads only the
elements it shows: ``stack(xs)[3]`` reads ``xs[3]``; ``x.T[0]`` reads one column of ``x``;
a TensorStore source reads only the chunks that the selection touches.

Each node type says, in one place, what a read of a selection needs: `input_selections`
(which parts of which inputs; `read` and the estimates in `reads` both follow it),
`held_while_reading` (its memory) and `describe` (its line in a plan).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from .._buffers import aligned_empty, assign
from .._errors import ShapeMismatchError
from .selection import (
    AxisSelection,
    Selection,
    as_range,
    compose,
    full,
    is_full,
    outer_index,
    positions,
    selection_shape,
    to_slice,
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

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        """``(input, selection of it)`` for each part of an input that reading `selection`
        needs; inputs the selection does not touch are left out.

        By default every input whole (sources: nothing).

        Example:
            >>> a, b = MemorySource(np.zeros((4, 2))), MemorySource(np.ones((4, 2)))
            >>> joined = ConcatNode([a, b], 0, a.dtype)  # shape (8, 2)
            >>> [(m is b, part) for m, part in joined.input_selections((range(5, 7), range(2)))]
            [(True, (range(1, 3), range(0, 2)))]
        """
        return [(member, full(member.shape)) for member in self.inputs()]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        """Bytes held at most while `selection` is read, besides the result itself.

        With `into`, the result goes into the caller's array (`read_into`): nodes that fill
        it in place hold only a tile; the others build a temporary result, counted here.
        Without it, the array `read` returns is counted too. By default: the inputs as
        `input_selections` reads them, and a result of its own.

        Example:
            >>> x = MemorySource(np.zeros((4, 2), np.float32))
            >>> CastNode(x, np.dtype("float64")).held_while_reading((range(1), range(2)))
            24
        """
        held = sum(
            member.held_while_reading(part) for member, part in self.input_selections(selection)
        )
        return held + _selected_bytes(self, selection)

    def describe(self) -> str:
        """How the node appears among a plan's operations (``"cast bfloat16"``)."""
        return type(self).__name__

    @property
    def computes_whole(self) -> bool:
        """Whether any read computes the node's whole result (so blocks of it would
        compute it once per block)."""
        return False

    @property
    def stack_axis(self) -> int | None:
        """The axis along which this array is a stack of members read one at a time (seen
        through casts and one-input elementwise maps), or None."""
        return None

    def working_bytes(self, output_bytes: int) -> int:
        """Working memory of a block of `output_bytes` of the result that
        `held_while_reading` does not count (a function's temporaries)."""
        return 0

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        """Writes the selected elements into `out` (their shape; cast to ``out.dtype``).

        `out` may be a strided view (a transposed or stacked part of a larger result).
        Nodes that can fill it without a full-size temporary override this.
        """
        assign(out, self.read(selection))


def _selected_bytes(node: Node, selection: Selection) -> int:
    return math.prod(selection_shape(selection)) * node.dtype.itemsize


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
        selected = _selected_bytes(self, selection)
        return ReadCost(selected, selected)

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        return self.read_cost(selection, into=into).memory


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

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return [(self.base, self.base_selection(selection))]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        if self.new_axes:  # built as a temporary (np.take may copy it again)
            held = self.base.held_while_reading(self.base_selection(selection))
            return held + _selected_bytes(self, selection)
        return self.base.held_while_reading(self.base_selection(selection), into=into)

    def describe(self) -> str:
        return "slice"

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

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return [(self.base, selection)]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        held = self.base.held_while_reading(selection, into=True)
        return held + (0 if into else _selected_bytes(self, selection))

    def describe(self) -> str:
        return f"cast {self.dtype.name}"

    @property
    def stack_axis(self) -> int | None:
        return self.base.stack_axis

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

    def _base_selection(self, selection: Selection) -> Selection:
        base_selection: list[Any] = [None] * len(self.axes)
        for position, base_axis in enumerate(self.axes):
            base_selection[base_axis] = selection[position]
        return tuple(base_selection)

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return [(self.base, self._base_selection(selection))]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        return self.base.held_while_reading(self._base_selection(selection), into=into)

    def describe(self) -> str:
        return "transpose"

    def read(self, selection: Selection) -> np.ndarray:
        return self.base.read(self._base_selection(selection)).transpose(self.axes)

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        target = out.transpose(np.argsort(self.axes))
        self.base.read_into(self._base_selection(selection), target)

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

    def _base_selection(self, selection: Selection) -> Selection:
        """The kept leading axes as selected, the rest whole."""
        kept = self.kept_leading_axes
        return tuple(selection[:kept]) + full(self.base.shape[kept:])

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return [(self.base, self._base_selection(selection))]

    def describe(self) -> str:
        return "reshape"

    def read(self, selection: Selection) -> np.ndarray:
        kept = self.kept_leading_axes
        values = self.base.read(self._base_selection(selection))
        values = values.reshape(selection_shape(selection[:kept]) + self.shape[kept:])
        trailing = tuple(range(length) for length in selection_shape(selection[:kept]))
        return outer_index(values, trailing + tuple(selection[kept:]))

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        kept = self.kept_leading_axes
        base_selection = self._base_selection(selection)
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

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        member_selection = selection[: self.axis] + selection[self.axis + 1 :]
        touched = sorted(set(positions(selection[self.axis])))
        return [(self.members[member], member_selection) for member in touched]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        held = max(  # members are read one after another, each into its place
            (m.held_while_reading(part, into=True) for m, part in self.input_selections(selection)),
            default=0,
        )
        return held + (0 if into else _selected_bytes(self, selection))

    def describe(self) -> str:
        return f"stack {len(self.members)} on axis {self.axis}{_promoted(self)}"

    @property
    def stack_axis(self) -> int | None:
        return self.axis

    def read(self, selection: Selection) -> np.ndarray:
        result = aligned_empty(selection_shape(selection), self.dtype)
        self.read_into(selection, result)
        return result

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        if out.dtype != self.dtype and any(m.dtype != self.dtype for m in self.members):
            assign(out, self.read(selection))  # promote first, as `read` does
            return
        member_selection = selection[: self.axis] + selection[self.axis + 1 :]
        # one read per selected position (a repeated member is read again, into its place)
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

    def _parts(self, selection: Selection) -> list[tuple[Node, Selection, AxisSelection]]:
        """``(member, its selection, positions of the result along the axis)`` for each
        member the selection touches, in member order: one read per member."""
        wanted = np.asarray(positions(selection[self.axis]), dtype=np.int64)
        owners = np.searchsorted(self._offsets[1:], wanted, side="right")
        order = np.argsort(owners, kind="stable")
        touched, starts = np.unique(owners[order], return_index=True)
        parts: list[tuple[Node, Selection, AxisSelection]] = []
        if len(wanted) == 0:
            return parts
        for owner, where in zip(touched.tolist(), np.split(order, starts[1:]), strict=True):
            local = as_range(wanted[where] - self._offsets[owner])
            member_selection = selection[: self.axis] + (local,) + selection[self.axis + 1 :]
            parts.append((self.members[owner], member_selection, as_range(where)))
        return parts

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return [(member, part) for member, part, _ in self._parts(selection)]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        held = max(  # members are read one after another into the result (see `read`)
            (
                member.held_while_reading(part, into=isinstance(where, range))
                for member, part, where in self._parts(selection)
            ),
            default=0,
        )
        return held + _selected_bytes(self, selection)

    def describe(self) -> str:
        return f"concat {len(self.members)} on axis {self.axis}{_promoted(self)}"

    def read(self, selection: Selection) -> np.ndarray:
        result = np.empty(selection_shape(selection), self.dtype)
        for member, part, where in self._parts(selection):
            if isinstance(where, range):  # a view of the result: the member fills it
                member.read_into(part, result[(slice(None),) * self.axis + (to_slice(where),)])
            else:
                result[(slice(None),) * self.axis + (where,)] = member.read(part)
        return result

    def inputs(self) -> tuple[Node, ...]:
        return self.members


class PadNode(Node):
    """`base` zero-padded at the end of each axis up to `shape`; only its in-bounds part is read."""

    def __init__(self, base: Node, shape: tuple[int, ...]) -> None:
        self.base, self.shape, self.dtype = base, shape, base.dtype

    def _inside(self, selection: Selection) -> tuple[list[np.ndarray], Selection] | None:
        """Where the selection is within `base` (result positions per axis, and the base's
        selection), or None when it is all padding."""
        inside_positions, base_selection = [], []
        for axis_selection, base_length in zip(selection, self.base.shape, strict=True):
            indices = np.asarray(positions(axis_selection), dtype=np.int64)
            inside = np.flatnonzero(indices < base_length)
            if len(inside) == 0:
                return None
            inside_positions.append(inside)
            base_selection.append(as_range(indices[inside]))
        return inside_positions, tuple(base_selection)

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        inside = self._inside(selection)
        return [] if inside is None else [(self.base, inside[1])]

    def describe(self) -> str:
        return "pad"

    def read(self, selection: Selection) -> np.ndarray:
        result = np.zeros(selection_shape(selection), self.dtype)
        inside = self._inside(selection)
        if inside is not None:
            result[np.ix_(*inside[0])] = self.base.read(inside[1])
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

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        if self.elementwise:
            return [(member, selection) for member in self.members]
        return super().input_selections(selection)

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        inputs = sum(m.held_while_reading(part) for m, part in self.input_selections(selection))
        selected = _selected_bytes(self, selection)
        if self.elementwise:
            # the function's temporaries, its result and a cast of it, all the size of the
            # selection; counted at the selection the map sees: a stack of maps computes
            # one at a time
            return inputs + self._temporaries(selected) + 2 * selected
        whole = math.prod(self.shape) * self.dtype.itemsize
        return inputs + selected + self._temporaries(whole)  # computed whole, then selected

    def _temporaries(self, output_bytes: int) -> int:
        """Working memory of the function producing `output_bytes`: a temporary per input,
        and one more."""
        return (len(self.members) + 1) * output_bytes

    def describe(self) -> str:
        return f"map {self.name}"

    @property
    def computes_whole(self) -> bool:
        return not self.elementwise

    @property
    def stack_axis(self) -> int | None:
        return self.members[0].stack_axis if self.elementwise and len(self.members) == 1 else None

    def read(self, selection: Selection) -> np.ndarray:
        values = self.fn(*(member.read(part) for member, part in self.input_selections(selection)))
        if self.elementwise:
            return self._checked(values, selection_shape(selection))
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
                raise ShapeMismatchError(
                    f"suture.map({self.name}) returned dtype {array.dtype}, expected "
                    f"{self.dtype}. Pass dtype={array.dtype.name!r} to suture.map, or cast "
                    f"inside the function."
                )
            array = array.astype(self.dtype)
        return array

    def inputs(self) -> tuple[Node, ...]:
        return self.members


def _promoted(node: StackNode | ConcatNode) -> str:
    """`` as <dtype>`` when joining converts some member, else nothing."""
    same = all(member.dtype == node.dtype for member in node.members)
    return "" if same else f" as {node.dtype.name}"


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
