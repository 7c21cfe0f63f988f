"""Arrays stored as raw bytes at a known place in a file (safetensors, uncompressed npz).

`FileRangeSource` reads only the rows of the first axis that a selection spans (one
ranged read of its `Location`: ``os.pread`` locally, a ranged GET remotely), then indexes
the other axes in memory, so slicing a row of a 1 GiB tensor reads about one row.
"""

from __future__ import annotations

import math

import numpy as np

from ._location import Location
from ._nodes import Node, SourceNode
from ._selection import Selection, outer_index


class FileRangeSource(SourceNode):
    """A C-ordered array of `shape` and `dtype` at byte `offset` of `file`."""

    def __init__(
        self,
        file: Location,
        offset: int,
        shape: tuple[int, ...],
        dtype: np.dtype,
        path: str | None = None,
    ) -> None:
        self.file, self.offset = file, offset
        self.shape, self.dtype = shape, dtype
        self.path, self.origin = path, str(file)

    def read(self, selection: Selection) -> np.ndarray:
        if not self.shape:
            return self._rows(0, 1).reshape(())
        first = selection[0]
        positions = first if not isinstance(first, range) else None
        if len(first) == 0:
            return np.empty(tuple(len(axis) for axis in selection), self.dtype)
        low = int(min(first) if positions is not None else min(first[0], first[-1]))
        high = int(max(first) if positions is not None else max(first[0], first[-1])) + 1
        block = self._rows(low, high).reshape((high - low, *self.shape[1:]))
        local = (
            (first - low)
            if positions is not None
            else range(first.start - low, first.stop - low, first.step)
        )
        return np.array(outer_index(block, (local, *selection[1:])), copy=True)

    def _rows(self, low: int, high: int) -> np.ndarray:
        row_bytes = self.dtype.itemsize * math.prod(self.shape[1:])
        count = (high - low) * row_bytes
        buffer = self.file.read_range(self.offset + low * row_bytes, count, self.path or "")
        return buffer.view(self.dtype)

    def inputs(self) -> tuple[Node, ...]:
        return ()
