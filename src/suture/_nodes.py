"""The computation graph behind LazyArray: sources and structural operations.

Every node knows its shape and dtype without reading, and answers
``read(selection) -> np.ndarray`` (see `_selection`) with an array of exactly the selected
elements. Operations push the selection down to their inputs, so a view reads only the
elements it shows: ``stack(xs)[3]`` reads ``xs[3]``; ``x.T[0]`` reads one column of ``x``;
a TensorStore source reads only the chunks that the selection touches.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from ._errors import ShapeMismatchError, SurgeryError
from ._selection import (
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

    def read_cost(self, selection: Selection, into: bool = False) -> ReadCost:
        """Bytes a read of `selection` takes from storage, and holds (see `_reads.read_memory`).

        By default: the selected elements, read into a temporary result.
        """
        selected = math.prod(selection_shape(selection)) * self.dtype.itemsize
        return ReadCost(selected, selected)


# Casting into a strided (transposed) view element by element runs at about 0.2 GB/s here;
# casting a contiguous tile into a reused buffer, then copying it in 256 x 256 squares,
# runs at about 2.5 GB/s (measured on a (4096, 11008) float32 -> bfloat16 transpose).
_TILE = 256
_CAST_TILE_BYTES = 8 << 20
_TILE_BYTES = 8 << 20  # a source's read tile
_scratch = threading.local()


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype, alignment: int = 64) -> np.ndarray:
    """An uninitialized array whose data starts on an `alignment`-byte boundary."""
    dtype = np.dtype(dtype)
    size = math.prod(shape) * dtype.itemsize
    raw = np.empty(size + alignment, np.uint8)
    offset = -raw.ctypes.data % alignment
    return raw[offset : offset + size].view(dtype).reshape(shape)


def scratch_buffer(name: str, nbytes: int) -> np.ndarray:
    """A reusable aligned byte buffer of at least `nbytes`, per thread and `name` (no new pages)."""
    buffers = _scratch.__dict__.setdefault("buffers", {})
    buffer = buffers.get(name)
    if buffer is None or buffer.nbytes < nbytes:
        buffer = buffers[name] = aligned_empty((nbytes,), np.dtype(np.uint8), alignment=4096)
    return buffer[:nbytes]


def assign(out: np.ndarray, values: np.ndarray) -> None:
    """``out[...] = values``, cast as ``astype`` casts, fast when `out` is a transposed view."""
    if out.ndim != 2 or out.flags.c_contiguous or out.size < _TILE * _TILE:
        if out.ndim > 2 and not out.flags.c_contiguous and out.shape[0] <= _TILE:
            for index in range(out.shape[0]):  # a stack of transposed matrices
                assign(out[index], values[index])
            return
        np.copyto(out, values, casting="unsafe")
        return
    rows, columns = out.shape
    tile_rows = max(1, min(_TILE, _CAST_TILE_BYTES // (columns * out.dtype.itemsize)))
    for row in range(0, rows, tile_rows):
        height = min(tile_rows, rows - row)
        if values.dtype == out.dtype and values.flags.c_contiguous:  # nothing to cast
            tile = values[row : row + height]
        else:
            tile = scratch_buffer("cast", height * columns * out.dtype.itemsize)
            tile = tile.view(out.dtype).reshape(height, columns)
            np.copyto(tile, values[row : row + height], casting="unsafe")
        _transpose_into(out[row : row + height], tile)


def _transpose_into(out: np.ndarray, tile: np.ndarray) -> None:
    """``out[...] = tile`` (same dtype, `tile` C-contiguous) for a transposed view `out`.

    Where consecutive rows of `out` are adjacent in memory (`out` is a transposed C array),
    8 // itemsize rows are first interleaved into 64-bit lanes (contiguous passes), and the
    lanes are then copied in squares: a quarter of the strided element copies for 2-byte
    types, which made a bfloat16 transpose 2.6x faster (0.78 against 2.05 ns per element).
    """
    rows, columns = out.shape
    itemsize = out.dtype.itemsize
    lanes = 8 // itemsize if itemsize in (1, 2, 4) else 1
    packed_rows = rows - rows % lanes if lanes > 1 and _lanes_aligned(out) else 0
    if packed_rows:
        bits = np.dtype(f"u{itemsize}")
        groups = packed_rows // lanes
        packed = scratch_buffer("lanes", packed_rows * columns * itemsize)
        packed = packed.view(bits).reshape(groups, columns, lanes)
        source = tile.view(bits)
        for lane in range(lanes):
            packed[:, :, lane] = source[lane:packed_rows:lanes]
        wide = packed.view(np.uint64).reshape(groups, columns)
        target = out[:packed_rows].T.view(np.uint64).T  # (groups, columns), 8-byte aligned
        for column in range(0, columns, _TILE):
            target[:, column : column + _TILE] = wide[:, column : column + _TILE]
    if packed_rows < rows:
        rest, source = out[packed_rows:], tile[packed_rows:]
        for column in range(0, columns, _TILE):
            rest[:, column : column + _TILE] = source[:, column : column + _TILE]


def _lanes_aligned(out: np.ndarray) -> bool:
    """Whether `out`'s rows are adjacent in memory, starting and striding on 8 bytes."""
    return (
        out.strides[0] == out.dtype.itemsize
        and out.ctypes.data % 8 == 0
        and out.strides[1] % 8 == 0
    )


def ts_array(array: np.ndarray) -> Any:
    import tensorstore as ts

    return ts.array(array)


class TensorStoreSource(SourceNode):
    """An array stored where TensorStore can open it (Orbax's zarr in OCDBT or plain files).

    The store is opened on first read, once, from any thread; `open_store` returns
    TensorStore's open future, so that many stores can be opened at once (`open_all`).
    `recorded_sharding`, where set, returns the sharding Orbax recorded for the array (its
    JSON description, see `_shardings`) or None.
    """

    recorded_sharding: Callable[[], str | None] | None = None

    def __init__(
        self,
        open_store: Callable[[], Any],
        shape: tuple[int, ...],
        dtype: np.dtype,
        path: str | None = None,
        origin: str | None = None,
        chunk_shape: tuple[int, ...] | Callable[[], tuple[int, ...] | None] | None = None,
    ) -> None:
        self._open_store = open_store
        self._chunk_shape = chunk_shape  # the stored read granularity, or how to find it
        self._store: Any = None
        self._opening: Any = None  # a TensorStore open future, once started
        self.shape, self.dtype, self.path, self.origin = shape, dtype, path, origin

    @property
    def chunk_shape(self) -> tuple[int, ...] | None:
        """The shape of the chunks a read decodes, when known (worked out on first use)."""
        if callable(self._chunk_shape):
            self._chunk_shape = self._chunk_shape()
        return self._chunk_shape

    # One lock for all sources: creating one per leaf costs more than it saves (10^4 leaves).
    _lock = threading.Lock()

    def store(self) -> Any:
        """The opened TensorStore (opened here, or awaited if `start_opening` began it)."""
        if self._store is not None:
            return self._store
        self.start_opening()
        opening = self._opening
        if opening is None:  # another thread finished opening in the meantime
            return self._store
        try:
            store = opening.result()  # waited for outside the lock: other sources open meanwhile
        except ValueError as error:  # TensorStore reports damage as ValueError
            raise self._damaged(error) from error
        with self._lock:
            self._store, self._opening = store, None
        return store

    def start_opening(self) -> None:
        """Starts opening the store without waiting for it (see `open_all`)."""
        with self._lock:
            if self._store is None and self._opening is None:
                self._opening = self._open_store()

    @staticmethod
    def _view(store: Any, selection: Selection) -> Any:
        if all(isinstance(axis, range) for axis in selection):
            return store[tuple(to_slice(axis) for axis in selection)]
        return store.oindex[
            tuple(to_slice(axis) if isinstance(axis, range) else axis for axis in selection)
        ]

    def read(self, selection: Selection) -> np.ndarray:
        view = self._view(self.store(), selection)
        # Decoding straight into our own buffer saves TensorStore a copy (about 20% faster);
        # aligning it to 64 bytes lets jax.device_put use it without another copy.
        result = aligned_empty(view.shape, view.dtype.numpy_dtype)
        try:
            ts_array(result).write(view).result()
        except ValueError as error:
            raise self._damaged(error) from error
        return result.astype(self.dtype, copy=False)

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        store = self.store()
        if out.dtype != self.dtype or store.dtype.numpy_dtype != self.dtype:
            super().read_into(selection, out)
            return
        first = selection[0] if selection else None
        try:
            if out.flags.c_contiguous or not isinstance(first, range) or first.step != 1:
                ts_array(out).write(self._view(store, selection)).result()
                return
            # TensorStore fills a transposed view at half the speed of a contiguous tile
            # copied in squares (`assign`); tiles are whole chunks along the first axis
            row_bytes = math.prod(selection_shape(selection[1:])) * self.dtype.itemsize
            chunk_rows = (self.chunk_shape or (1,))[0]
            step = chunk_rows * max(1, _TILE_BYTES // max(1, chunk_rows * row_bytes))
            start = first.start
            while start < first.stop:
                stop = min((start // step + 1) * step, first.stop)
                tile = scratch_buffer("decode", (stop - start) * row_bytes).view(self.dtype)
                tile = tile.reshape((stop - start, *selection_shape(selection[1:])))
                part = (range(start, stop), *selection[1:])
                ts_array(tile).write(self._view(store, part)).result()
                assign(out[start - first.start : stop - first.start], tile)
                start = stop
        except ValueError as error:
            raise self._damaged(error) from error

    def read_cost(self, selection: Selection, into: bool = False) -> ReadCost:
        """Whole chunks are read and decoded (into the caller's array or a result of our own;
        into a transposed view, through a tile of at most the decoded chunks)."""
        selected = math.prod(selection_shape(selection)) * self.dtype.itemsize
        decoded = _chunk_span(selection, self.shape, self.chunk_shape) * self.dtype.itemsize
        return ReadCost(decoded, decoded + min(selected, decoded) if into else decoded + selected)

    def _damaged(self, error: Exception) -> Exception:
        from ._errors import CorruptCheckpointError

        return CorruptCheckpointError(
            f"Leaf {self.path!r} of {self.origin!r} cannot be read: {error}. Its data is missing, "
            f"damaged, or was changed while being read; restore the checkpoint from a copy."
        )

    def inputs(self) -> tuple[Node, ...]:
        return ()


def _chunk_span(
    selection: Selection, shape: tuple[int, ...], chunks: tuple[int, ...] | None
) -> int:
    """Elements of the whole chunks that `selection` touches (the selection, chunks unknown)."""
    if chunks is None:
        return math.prod(selection_shape(selection))
    total = 1
    for axis, length, chunk in zip(selection, shape, chunks, strict=True):
        if len(axis) == 0:
            return 0
        picked = positions(axis)
        low, high = min(picked), max(picked)
        chunk = max(1, chunk)
        total *= min((high // chunk + 1) * chunk - (low // chunk) * chunk, length)
    return total


def open_all(sources: list[SourceNode]) -> None:
    """Opens every TensorStore source at once before any data is read.

    Opening reads metadata (small, scattered reads); doing it all up front, concurrently,
    keeps those reads from interleaving with large data reads on a cold disk.
    """
    pending = [source for source in sources if isinstance(source, TensorStoreSource)]
    for source in pending:
        source.start_opening()
    for source in pending:
        source.store()


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
        self._kept_leading_axes = kept

    def read(self, selection: Selection) -> np.ndarray:
        kept = self._kept_leading_axes
        base_selection = tuple(selection[:kept]) + full(self.base.shape[kept:])
        values = self.base.read(base_selection)
        values = values.reshape(selection_shape(selection[:kept]) + self.shape[kept:])
        trailing = tuple(range(length) for length in selection_shape(selection[:kept]))
        return outer_index(values, trailing + tuple(selection[kept:]))

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        kept = self._kept_leading_axes
        base_selection = tuple(selection[:kept]) + full(self.base.shape[kept:])
        if not is_full(selection[kept:], self.shape[kept:]):
            super().read_into(selection, out)
            return
        target = out.view()
        try:  # the same memory in the base's shape: no copy, so the base fills `out` itself
            target.shape = selection_shape(base_selection)
        except AttributeError:
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
