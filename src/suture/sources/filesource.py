"""Arrays stored as raw bytes at a known place in a file (safetensors, uncompressed npz).

`FileRangeSource` reads only the rows of the first axis that a selection spans (ranged
reads of its `Location`: positional reads locally, ranged GETs remotely). A read of whole rows lands straight in the result (no copy);
a read of some columns goes through a bounded strip of rows at a time, so its memory is
the result plus one strip, never the whole span (`read_into`, into a caller's array: one
strip). `read_into` of whole rows reads into a caller's array
(a cast or transposed view of it) through a small per-thread tile, which fuses the read,
the cast and the transpose without a full-size temporary; from a remote store it reads the
rows whole (one ranged read, in parts at once) and casts them into place, as a round trip
per tile, one after another, would cost more than the temporary.

Linux returns at most 2,147,479,552 bytes from one ``preadv``; `read_fully` loops until
every byte is read, so tensors over 2 GiB read like any other. Each read of a local file
checks that the file is still the one opened (device, inode, size, modification time), so a
file replaced or rewritten meanwhile is an error, not a mix of old and new data.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._buffers import aligned_empty, assign, read_cast_into
from .._errors import CorruptCheckpointError, InvalidIndexError
from .._lazy.graph import Node, ReadCost, SourceNode
from .._lazy.reads import estimate_reads
from .._lazy.selection import Selection, full, outer_index, selection_shape
from .._location import Location
from .._location.direct import direct_reads, should_read_direct

if TYPE_CHECKING:
    from .._lazy.array import LazyArray

# A column read holds one strip of rows at a time; `read_into` one tile (kept per thread).
STRIP_BYTES = 32 << 20
TILE_BYTES = 8 << 20
# A read of part of each row (the gate half of fused experts) reads each row's run alone when
# the run is this long; shorter runs go a strip of whole rows at a time (fewer, larger reads).
MIN_RUN_BYTES = 256 << 10


class FileRangeSource(SourceNode):
    """A C-ordered array of `shape` and `dtype` at byte `offset` of `file`."""

    def __init__(
        self,
        file: Location,
        offset: int,
        shape: tuple[int, ...],
        dtype: np.dtype,
        path: str | None = None,
        identity: tuple[int, ...] | None = None,
    ) -> None:
        self.file, self.offset = file, offset
        self.shape, self.dtype = shape, dtype
        self.path, self.origin = path, str(file)
        self.identity = identity  # the file as opened; a read of another one is an error

    @property
    def remote(self) -> bool:  # type: ignore[override]
        return self.file.is_remote

    @property
    def _row_bytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape[1:])

    def read(self, selection: Selection) -> np.ndarray:
        if not self.shape:
            return self._read_rows(0, 1, aligned_empty((1,), self.dtype)).reshape(())
        rows = _whole_rows(selection, self.shape)
        if rows is not None:  # straight into the result: no copy
            result = aligned_empty((rows[1] - rows[0], *self.shape[1:]), self.dtype)
            return self._read_rows(*rows, result)
        result = aligned_empty(selection_shape(selection), self.dtype)
        runs = self._runs(selection)
        if runs is not None:  # as `read_into` reads (and the plan counts): a run of each row
            self._read_runs(selection[0], runs, result)
            return result
        for target, block, local in self._strips(selection):
            result[target] = outer_index(block, local)
        return result

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        rows = _whole_rows(selection, self.shape) if self.shape else None
        runs = self._runs(selection) if rows is None else None
        if runs is not None:
            # a run of each row (gate or up of fused experts): those bytes only, not the rows
            self._read_runs(selection[0], runs, out)
        elif rows is None and self._strips_into(selection):
            # some columns: a strip of rows at a time straight into `out`, whose memory is
            # one strip instead of a whole-size temporary (a transposed block of lm_head)
            for target, block, local in self._strips(selection):
                assign(out[target], outer_index(block, local))
        elif rows is None:
            super().read_into(selection, out)
        elif out.dtype == self.dtype and out.flags.c_contiguous:
            self._read_rows(*rows, out)
        elif self.remote:  # one read (its parts at once), not a round trip per tile in turn
            span = aligned_empty((rows[1] - rows[0], *self.shape[1:]), self.dtype)
            assign(out, self._read_rows(*rows, span))
        elif out.flags.c_contiguous and out.flags.writeable:  # a cast: read into out's memory
            self._read_cast_rows(*rows, out)
        else:  # a tile at a time through this thread's scratch: cast and transpose stay in cache
            step = max(1, TILE_BYTES // max(1, self._row_bytes))
            for start in range(rows[0], rows[1], step):
                stop = min(start + step, rows[1])
                assign(out[start - rows[0] : stop - rows[0]], self._read_rows_scratch(start, stop))

    def read_cost(self, selection: Selection, into: bool = False) -> ReadCost:
        """Bytes read from the file (whole row spans) and bytes held while reading."""
        result = math.prod(selection_shape(selection)) * self.dtype.itemsize
        if not self.shape:
            return ReadCost(result, result)
        if _whole_rows(selection, self.shape) is not None:
            tile = result if self.remote else min(result, TILE_BYTES)  # see `read_into`
            return ReadCost(result, tile if into else result)
        runs = self._runs(selection)
        if runs is not None:  # see `read_into`: each row's run, one at a time (`read` too)
            run_bytes = (runs[1] - runs[0]) * self._inner_bytes
            return ReadCost(
                len(selection[0]) * run_bytes, min(result, run_bytes) if into else result
            )
        spans = [stop - start for start, stop, _ in _row_groups(selection[0], self._strip_rows)]
        strip = max(spans, default=0) * self._row_bytes
        if into and self._strips_into(selection):  # a strip (and a copy of the part selected
            # where an axis picks single elements: `outer_index` is a view of ranges)
            views = all(isinstance(axis, range) for axis in selection)
            return ReadCost(
                sum(spans) * self._row_bytes, strip + (0 if views else min(result, strip))
            )
        return ReadCost(sum(spans) * self._row_bytes, result + strip)

    def _strips_into(self, selection: Selection) -> bool:
        """Whether `read_into` reads `selection` (not whole rows) a strip at a time into the
        caller's array: locally, for a run of rows (their places in the result are views)."""
        return bool(self.shape) and not self.remote and isinstance(selection[0], range)

    @property
    def _inner_bytes(self) -> int:
        """Bytes of one step along axis 1."""
        return self.dtype.itemsize * math.prod(self.shape[2:])

    def _runs(self, selection: Selection) -> tuple[int, int] | None:
        """`_row_runs` of `selection`, when `read_into` reads it a run per row: locally,
        runs of `MIN_RUN_BYTES` or more (shorter ones go a strip of whole rows at a time)."""
        if not self._strips_into(selection):
            return None
        runs = _row_runs(selection, self.shape)
        if runs is None or (runs[1] - runs[0]) * self._inner_bytes < MIN_RUN_BYTES:
            return None
        return runs

    @property
    def _strip_rows(self) -> int:
        return max(1, STRIP_BYTES // max(1, self._row_bytes))

    def _strips(self, selection: Selection) -> Any:
        """``(result rows, strip of rows, selection within the strip)`` for a partial read."""
        groups = list(_row_groups(selection[0], self._strip_rows))
        largest = max((stop - start for start, stop, _ in groups), default=0)
        buffer = aligned_empty((largest * self._row_bytes,), np.dtype(np.uint8))
        for start, stop, (targets, local_rows) in groups:
            rows = buffer[: (stop - start) * self._row_bytes].view(self.dtype)
            block = self._read_rows(start, stop, rows.reshape((stop - start, *self.shape[1:])))
            yield targets, block, (local_rows, *selection[1:])

    def _read_runs(self, rows: range, runs: tuple[int, int], out: np.ndarray) -> None:
        """Rows `rows`, of each only ``[runs[0], runs[1])`` along axis 1, into `out`: one
        read per row, straight into `out` or through this thread's scratch (cast, transposed)."""
        low, high = runs
        if high == low or not len(rows):
            return
        inner = self._inner_bytes
        shape = (high - low, *self.shape[2:])
        self._check_rows(min(rows), max(rows) + 1)
        for index, row in enumerate(rows):
            offset = self.offset + row * self._row_bytes + low * inner
            target = out[index]
            self._check_same_file()
            if target.dtype == self.dtype and target.flags.c_contiguous:
                self.file.read_into(offset, target, self.path or "")
            else:
                raw = self.file.read_scratch(offset, (high - low) * inner, self.path or "")
                assign(target, raw.view(self.dtype).reshape(shape))
            self._check_same_file()  # a swap during the read would have mixed files

    def _read_rows(self, low: int, high: int, into: np.ndarray) -> np.ndarray:
        """Reads rows ``[low, high)`` into `into` (C-contiguous, exactly that size)."""
        self._check_rows(low, high)
        self._check_same_file()
        self.file.read_into(self.offset + low * self._row_bytes, into, self.path or "")
        self._check_same_file()  # a swap during the read would have mixed files
        return into

    def _read_cast_rows(self, low: int, high: int, out: np.ndarray) -> None:
        """Rows ``[low, high)`` cast into `out` (C-contiguous), read into its own memory
        (`read_cast_into`): no temporary and no read buffer kept by the thread."""
        self._check_rows(low, high)
        self._check_same_file()
        start = self.offset + low * self._row_bytes
        size = self.dtype.itemsize

        def read(first: int, stop: int, into: np.ndarray) -> None:
            self.file.read_into(
                start + first * size, into[: (stop - first) * size], self.path or ""
            )

        read_cast_into(out, self.dtype, read)
        self._check_same_file()  # a swap during the read would have mixed files

    def _read_rows_scratch(self, low: int, high: int) -> np.ndarray:
        """Rows ``[low, high)`` in this thread's read buffer (valid until its next read)."""
        self._check_rows(low, high)
        self._check_same_file()
        raw = self.file.read_scratch(
            self.offset + low * self._row_bytes, (high - low) * self._row_bytes, self.path or ""
        )
        self._check_same_file()
        return raw.view(self.dtype).reshape((high - low, *self.shape[1:]))

    def _check_rows(self, low: int, high: int) -> None:
        """Rows past the tensor's are another tensor's bytes: never read as this one's."""
        rows = self.shape[0] if self.shape else 1
        if not 0 <= low <= high <= rows:
            raise InvalidIndexError(
                f"A read of rows {low}-{high} of tensor {self.path!r} in {str(self.file)!r} "
                f"reaches past its {rows} rows (shape {self.shape}); the bytes there are not "
                f"this tensor's, and nothing was read. This is a bug in suture: please report it."
            )

    def _check_same_file(self) -> None:
        if self.identity is not None and local_identity(self.file) != self.identity:
            raise CorruptCheckpointError(
                f"{str(self.file)!r} changed since it was opened (another file was moved into "
                f"its place, or it was modified): tensor {self.path!r} would mix old and new "
                f"data. Open the checkpoint again once it stops changing."
            )

    def inputs(self) -> tuple[Node, ...]:
        return ()


def file_identity(status: os.stat_result) -> tuple[int, ...]:
    """What tells one file from its replacement: device, inode, size, modification time."""
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns)


def local_identity(file: Location) -> tuple[int, ...] | None:
    """`file_identity` of a local file (None for remote objects, which have no inode)."""
    if file.is_remote:
        return None
    try:
        return file_identity(os.stat(file))
    except OSError as error:
        raise CorruptCheckpointError(f"Cannot read {str(file)!r}: {error}.") from error


def _whole_rows(selection: Selection, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """``(low, high)`` when `selection` is a contiguous run of whole rows, else None."""
    return _run_along(selection, shape, 0)


def _row_runs(selection: Selection, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """``(low, high)`` when `selection` takes a range of axis 1, ``[low, high)`` with step 1,
    of a range of rows, and the axes after it whole: one run of bytes in each row (gate or
    up of a fused expert tensor), else None.

    Example:
        >>> _row_runs((range(0, 4), range(2, 5), range(0, 3)), (4, 8, 3))
        (2, 5)
    """
    if len(shape) < 2 or not isinstance(selection[0], range):
        return None
    return _run_along(selection, shape, 1)


def _run_along(selection: Selection, shape: tuple[int, ...], axis: int) -> tuple[int, int] | None:
    """``(low, high)`` when `selection` takes ``[low, high)`` of `axis` (step 1) and every axis
    after it whole: one run of bytes within each index of the axes before it, else None."""
    taken = selection[axis]
    if not isinstance(taken, range) or (taken.step != 1 and len(taken) > 1):
        return None
    if any(
        not (isinstance(after, range) and after == range(length))
        for after, length in zip(selection[axis + 1 :], shape[axis + 1 :], strict=True)
    ):
        return None
    low = taken.start if len(taken) else 0
    return low, low + len(taken)


def _row_groups(first: Any, strip_rows: int) -> Any:
    """Runs of selected rows, each spanning at most `strip_rows` rows (one row at least).

    Yields ``(start, stop, (result positions, rows within the run))``; ranges stay ranges,
    so a strided read of a long axis builds no index arrays.
    """
    if isinstance(first, range):
        if len(first) == 0:
            return
        ascending = first if first.step > 0 else first[::-1]
        step = ascending.step
        per_group = max(1, (strip_rows - 1) // step + 1)
        for index in range(0, len(ascending), per_group):
            count = min(per_group, len(ascending) - index)
            start = ascending.start + index * step
            stop = start + (count - 1) * step + 1
            if first.step > 0:
                targets: Any = slice(index, index + count)
            else:  # descending: the first picked rows are the highest ones
                high = len(first) - index
                targets = slice(high - 1, high - count - 1 if high - count > 0 else None, -1)
            yield start, stop, (targets, range(0, stop - start, step))
        return
    wanted = np.asarray(first, dtype=np.int64)
    order = np.argsort(wanted, kind="stable")
    ordered = wanted[order]
    index = 0
    while index < len(ordered):
        start = int(ordered[index])
        end = int(np.searchsorted(ordered, start + strip_rows, side="left"))
        stop = int(ordered[end - 1]) + 1
        yield start, stop, (order[index:end], ordered[index:end] - start)
        index = end


def bytes_from_local_files(arrays: Iterable[LazyArray]) -> int:
    """Bytes that reading all of `arrays` takes from local files (each source counted once)."""
    sources: dict[int, int] = {}
    for array in arrays:
        for key, (source, disk) in estimate_reads(array.node, full(array.shape)).items():
            if isinstance(source, FileRangeSource) and not source.file.is_remote:
                sources[key] = max(disk, sources.get(key, 0))
    return sum(sources.values())


def reading_directly(arrays: Iterable[LazyArray]) -> contextlib.AbstractContextManager[None]:
    """A block in which large reads of local files go around the page cache, if reading all
    of `arrays` takes a quarter of the machine's memory or more (see `_location.direct`)."""
    unique = {id(array): array for array in arrays}.values()
    return direct_reads(should_read_direct(bytes_from_local_files(unique)))
