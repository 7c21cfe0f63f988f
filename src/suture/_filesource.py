"""Arrays stored as raw bytes at a known place in a file (safetensors, uncompressed npz).

`FileRangeSource` reads with ``os.pread`` only the rows of the first axis that a selection
spans, then indexes the other axes in memory, so slicing a row of a 1 GiB tensor reads
about one row. Each read checks that the file is still the one opened (device, inode,
size, modification time), so a file replaced or rewritten meanwhile is an error, not a mix
of old and new data.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from ._errors import CorruptCheckpointError
from ._iostats import record_read
from ._nodes import Node, SourceNode, aligned_empty
from ._selection import Selection, outer_index


class FileRangeSource(SourceNode):
    """A C-ordered array of `shape` and `dtype` at byte `offset` of `file`."""

    def __init__(
        self,
        file: Path,
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
        buffer = aligned_empty((count,), np.dtype(np.uint8))
        with open(self.file, "rb", buffering=0) as stream:
            self._check_same_file(stream.fileno())
            got = (
                os.preadv(stream.fileno(), [buffer], self.offset + low * row_bytes) if count else 0
            )
        if got != count:
            raise CorruptCheckpointError(
                f"{str(self.file)!r} is shorter than its header says: tensor {self.path!r} needs "
                f"{count} bytes at offset {self.offset + low * row_bytes}, the file gave {got}. "
                f"The file is truncated or was changed while being read."
            )
        record_read(count)
        return buffer.view(self.dtype)

    def _check_same_file(self, descriptor: int) -> None:
        if self.identity is not None and file_identity(os.fstat(descriptor)) != self.identity:
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
