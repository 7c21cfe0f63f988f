"""Arrays TensorStore opens where Orbax stored them (zarr, in OCDBT or plain files).

`TensorStoreSource` is the graph's source node for them: it reads only the chunks that a
selection touches, decoding straight into the caller's buffer where it can.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from .._buffers import aligned_empty, assign, scratch_buffer
from .._errors import CorruptCheckpointError, SurgeryError
from .._lazy.graph import Node, ReadCost, SourceNode
from .._lazy.selection import Selection, positions, selection_shape, to_slice
from .._location import wait

_TILE_BYTES = 8 << 20  # a read tile, when filling a transposed view


def ts_array(array: np.ndarray) -> Any:
    """`array` as a TensorStore array (no copy)."""
    import tensorstore as ts  # heavy; loaded on the first read, not at import

    return ts.array(array)


class TensorStoreSource(SourceNode):
    """An array stored where TensorStore can open it (Orbax's zarr in OCDBT or plain files).

    The store is opened on first read, once, from any thread; `open_store` returns
    TensorStore's open future, so that many stores can be opened at once (`open_all`).
    `recorded_sharding`, where set, returns the sharding Orbax recorded for the array (its
    JSON description, see `_shardings`) or None. A `remote` array's opening has a deadline
    (`suture._location.wait`); its reads have none of their own, as they decode into the
    caller's buffers, which a cancelled read could still fill: the HTTP client's stall
    limit and capped retries end them.
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
        remote: bool = False,
    ) -> None:
        self.remote = remote
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
            store = self._result(opening)  # waited for outside the lock: others open meanwhile
        except SurgeryError:
            raise
        except ValueError as error:  # TensorStore reports damage as ValueError
            raise self._damaged(error) from error
        with self._lock:
            self._store, self._opening = store, None
        return store

    def start_opening(self) -> None:
        """Starts opening the store without waiting for it (see `graph.open_all`)."""
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

    def _result(self, future: Any) -> Any:
        """A TensorStore open future's result; a remote one's within its deadline."""
        return wait(future, self.origin) if self.remote else future.result()

    def read_cost(self, selection: Selection, into: bool = False) -> ReadCost:
        """Whole chunks are read and decoded (into the caller's array or a result of our own;
        into a transposed view, through a tile of at most the decoded chunks)."""
        selected = math.prod(selection_shape(selection)) * self.dtype.itemsize
        decoded = _chunk_span(selection, self.shape, self.chunk_shape) * self.dtype.itemsize
        return ReadCost(decoded, decoded + min(selected, decoded) if into else decoded + selected)

    def finish_opening(self) -> None:
        self.store()

    def _damaged(self, error: Exception) -> Exception:
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
