"""The host buffers a leaf read from a local file is handed to its devices in.

jax takes a host array as a CPU device's buffer without a copy when it is C-contiguous and
starts on a 64-byte boundary; any other view (a column block of a box, a row block at an
odd byte offset) it copies, so a box read whole and cut into such views is held twice.
A tensor in a local file (safetensors) is read instead straight into one buffer per
distinct shard: a shard of whole rows is one read (cast in place as it is read); shards
that cut the columns are filled from strips of the box's rows, a strip of at most
`STRIP_BYTES` at a time, so the leaf is held once, plus one strip.

Example:
    >>> import numpy as np
    >>> from suture._lazy.array import LazyArray
    >>> reads_a_file(LazyArray.from_array(np.zeros(3)))
    False
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .._buffers import aligned_empty
from .._lazy.array import LazyArray
from .._lazy.views import CastNode
from ..sources.filesource import FileRangeSource

Ranges = tuple[tuple[int, int], ...]  # a shard as (start, stop) on every axis

STRIP_BYTES = 1 << 20
# Leaves filled from strips at once, each with a strip from the pool: a load reads up to 64
# leaves at a time, and strips freed by 64 threads stayed in their malloc arenas (0.1 GiB).
_STRIPPING = threading.BoundedSemaphore(8)
_free_strips: list[np.ndarray] = []
_strips_lock = threading.Lock()


def reads_a_file(array: LazyArray) -> bool:
    """Whether `array` is a tensor of a local file, perhaps cast as it is read."""
    node = array.node
    while isinstance(node, CastNode):
        node = node.base
    return isinstance(node, FileRangeSource) and not node.remote


def whole_rows(shape: tuple[int, ...], shards: set[Ranges]) -> bool:
    """Whether every shard is a run of whole rows (it spans every axis but the first)."""
    return all(shard[1:] == tuple((0, n) for n in shape[1:]) for shard in shards)


def read_in_strips(array: LazyArray, shards: set[Ranges], box: Ranges) -> dict[Ranges, np.ndarray]:
    """Each shard of `array` in a buffer of its own, filled from strips of `box`'s rows
    (the box the shards tile): one read of the box, never all of it at once."""
    buffers = {
        shard: aligned_empty(tuple(stop - start for start, stop in shard), array.dtype)
        for shard in shards
    }
    (low, high), rest = box[0], box[1:]
    row_bytes = math.prod(stop - start for start, stop in rest) * array.dtype.itemsize
    step = max(1, STRIP_BYTES // max(1, row_bytes))
    with _STRIPPING:
        with _strips_lock:
            pooled = _free_strips.pop() if _free_strips else None
        if pooled is None or pooled.nbytes < step * row_bytes:
            pooled = aligned_empty((max(STRIP_BYTES, step * row_bytes),), np.dtype(np.uint8))
        try:
            for start in range(low, high, step):
                stop = min(high, start + step)
                shape = (stop - start, *(b - a for a, b in rest))
                strip = pooled[: math.prod(shape) * array.dtype.itemsize].view(array.dtype)
                strip = strip.reshape(shape)
                selection = (range(start, stop), *(range(a, b) for a, b in rest))
                array.node.read_into(selection, strip)
                for shard, buffer in buffers.items():
                    first, last = max(shard[0][0], start), min(shard[0][1], stop)
                    if first < last:
                        part = tuple(
                            slice(a - base, b - base)
                            for (a, b), (base, _) in zip(shard[1:], rest, strict=True)
                        )
                        rows = slice(first - start, last - start)
                        buffer[first - shard[0][0] : last - shard[0][0]] = strip[(rows, *part)]
        finally:
            with _strips_lock:
                _free_strips.append(pooled)
    return buffers
