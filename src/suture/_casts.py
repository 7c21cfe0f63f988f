"""Casts to bfloat16 at memory speed, bit for bit what ``astype`` gives.

ml_dtypes converts float32 and float16 to bfloat16 one element at a time (about 1.2 ns per
element here); these casts are most of the CPU a save that changes the dtype spends outside
compression. `cast_into` does the common cases on cache-sized tiles. float32 is rounded with
whole-array integer operations: round to nearest even on the bit pattern, as ml_dtypes
rounds; the values that rule does not cover (NaN) are few and go through ml_dtypes itself.
float16 has only 65536 values, so it is one lookup an element in a table of ml_dtypes' own
results. Either way the result is identical to ``values.astype(bfloat16)`` for every input
(tests/test_casts.py checks all 65536 float16 values and the float32 edge cases). Every
other pair of dtypes is ``np.copyto``.

The temporaries of a cast (a few tiles) come from a pool, not from each thread: a load
reads on 64 threads, and a set of tiles kept by each of them was 14 MiB of its peak. At
most one set per core casts at a time (more would not cast faster), so the pool holds at
most that many sets.

Example:
    >>> import numpy as np, ml_dtypes
    >>> out = np.empty(3, ml_dtypes.bfloat16)
    >>> cast_into(out, np.array([1.0, 1.00390625, 1.01171875], np.float32))
    >>> out.astype(np.float32).tolist()
    [1.0, 1.0, 1.015625]
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterator

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_TILE = 1 << 15  # elements: a tile and its temporaries stay in the core's L2 cache
_SMALL = 1 << 12  # below this many elements, the per-tile calls cost more than they save
_scratch = threading.local()  # `buffers`: the pooled set this thread casts with now
_free: list[dict] = []  # sets of temporaries no cast is using
_free_lock = threading.Lock()
_casting = threading.BoundedSemaphore(max(2, os.cpu_count() or 1))


def cast_into(out: np.ndarray, values: np.ndarray) -> None:
    """``out[...] = values`` with ``astype``'s casting; fast for float32/float16 -> bfloat16
    where both arrays' rows are contiguous (`assign` turns transposed reads around first)."""
    kernel = _KERNELS.get((np.dtype(values.dtype), np.dtype(out.dtype)))
    fast = (
        kernel is not None
        and out.shape == values.shape
        and out.size >= _SMALL
        and values.dtype.isnative
    )
    if fast and out.flags.c_contiguous and values.flags.c_contiguous:
        with _pooled():
            _cast_flat(kernel, values.reshape(-1), out.reshape(-1).view(np.uint16))
    elif fast and out.ndim >= 2 and _rows_contiguous(out) and _rows_contiguous(values):
        with _pooled():  # a layer of a stack, or a slice of a wider matrix
            for index in np.ndindex(out.shape[:-2]):
                _cast_rows(kernel, out[index], values[index])
    else:
        cast_elementwise(out, values)


def cast_elementwise(out: np.ndarray, values: np.ndarray) -> None:
    """``out[...] = values`` by numpy (ml_dtypes element by element for bfloat16)."""
    np.copyto(out, values, casting="unsafe")


def _rows_contiguous(array: np.ndarray) -> bool:
    return array.strides[-1] == array.itemsize


def cast_bytes_into(out: np.ndarray, raw: np.ndarray, dtype: np.dtype) -> None:
    """`cast_into` of the bytes `raw` seen as `dtype` into the flat C-contiguous `out`, where
    `raw` may overlap `out` (a cast in place): a tile of `raw` that overlaps the elements
    it holds is copied out before they are written, so writing ``out[:k]`` may overwrite
    the bytes of the elements before ``k``, never those of later ones (their bytes lie at
    or after ``out[:k]``'s end; `_buffers.read_cast_into` places them so).

    Example:
        >>> values = np.array([1.0, 2.0], np.float16)
        >>> cast_bytes_into(values.view(BFLOAT16), values.view(np.uint8), values.dtype)
        >>> values.view(BFLOAT16).tolist()
        [1.0, 2.0]
    """
    dtype = np.dtype(dtype)
    kernel = _KERNELS.get((dtype, np.dtype(out.dtype)))
    fast = kernel is not None and dtype.isnative
    with _pooled():
        for start in range(0, out.size, _TILE):
            stop = min(out.size, start + _TILE)
            tile = raw[start * dtype.itemsize : stop * dtype.itemsize]
            # copied where it overlaps its results (most tiles of a narrowing cast do not)
            if np.may_share_memory(tile, out[start:stop]) or tile.ctypes.data % dtype.itemsize:
                tile = _buffer("source", np.uint8, tile.nbytes)
                tile[:] = raw[start * dtype.itemsize : stop * dtype.itemsize]
            if fast and stop - start >= _SMALL:
                kernel(tile.view(dtype), out[start:stop].view(np.uint16))
            else:
                np.copyto(out[start:stop], tile.view(dtype), casting="unsafe")


@contextlib.contextmanager
def _pooled() -> Iterator[None]:
    """Runs the block with a set of temporaries taken from the pool (re-entrant)."""
    if getattr(_scratch, "buffers", None) is not None:
        yield
        return
    with _casting:
        with _free_lock:
            buffers = _free.pop() if _free else {}
        _scratch.buffers = buffers
        try:
            yield
        finally:
            _scratch.buffers = None
            with _free_lock:
                _free.append(buffers)


def _cast_flat(kernel: Callable, source: np.ndarray, target: np.ndarray) -> None:
    for start in range(0, source.size, _TILE):
        kernel(source[start : start + _TILE], target[start : start + _TILE])


def _cast_rows(kernel: Callable, out: np.ndarray, values: np.ndarray) -> None:
    """2-D arrays whose rows lie apart: gather a tile of rows, cast it, then copy it out."""
    rows, columns = out.shape
    height = max(1, _TILE // columns)
    staging = _buffer("rows", np.uint16, height * columns)
    bits = out.view(np.uint16)
    for row in range(0, rows, height):
        source = values[row : row + height]
        if not source.flags.c_contiguous:  # its rows are: copied at memory speed
            gathered = _buffer("rows_in", source.dtype, source.size).reshape(source.shape)
            gathered[...] = source
            source = gathered
        source = source.reshape(-1)
        tile = staging[: source.size]
        _cast_flat(kernel, source, tile)
        bits[row : row + height] = tile.reshape(-1, columns)


def _float32_to_bfloat16(values: np.ndarray, out: np.ndarray) -> None:
    """Round to nearest even: add 0x7FFF plus the lowest kept bit, keep the high half."""
    bits = values.view(np.uint32)
    work = _buffer("f32", np.uint32, bits.size)
    np.right_shift(bits, 16, out=work)
    np.bitwise_and(work, 1, out=work)
    np.add(work, 0x7FFF, out=work)
    np.add(work, bits, out=work)
    np.right_shift(work, 16, out=work)
    np.copyto(out, work, casting="unsafe")
    odd = _buffer("odd", np.bool_, bits.size)
    np.isnan(values, out=odd)  # the rounding would turn some NaN payloads into infinity
    _patch(odd, values, out)


def _float16_to_bfloat16(values: np.ndarray, out: np.ndarray) -> None:
    """One lookup an element in a table of ml_dtypes' own result for each of the 65536
    float16 bit patterns: a third less CPU than the integer rounding it replaced, and
    every value, subnormals and NaN payloads included, is ml_dtypes' by construction."""
    # clip: every uint16 is an index of the table; and it writes `out` unbuffered
    np.take(_float16_table(), values.view(np.uint16), out=out, mode="clip")


@functools.cache
def _float16_table() -> np.ndarray:
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    with np.errstate(invalid="ignore"):
        table = every.astype(BFLOAT16).view(np.uint16)
    table.flags.writeable = False  # shared by every cast
    return table


def _patch(odd: np.ndarray, values: np.ndarray, out: np.ndarray) -> None:
    """The elements `odd` marks, cast by ml_dtypes itself."""
    if odd.any():
        where = np.flatnonzero(odd)
        with np.errstate(invalid="ignore"):
            out[where] = values[where].astype(BFLOAT16).view(np.uint16)


def _buffer(name: str, dtype: type, size: int) -> np.ndarray:
    """A reused temporary of at least one tile, from the set this thread took (`_pooled`)."""
    buffers = _scratch.buffers
    key = (name, np.dtype(dtype))
    if key not in buffers or buffers[key].size < size:
        buffers[key] = np.empty(max(size, _TILE), dtype)
    return buffers[key][:size]


_KERNELS = {
    (np.dtype(np.float32), BFLOAT16): _float32_to_bfloat16,
    (np.dtype(np.float16), BFLOAT16): _float16_to_bfloat16,
}
