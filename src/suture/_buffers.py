"""Memory buffers: aligned arrays, per-thread scratch space, and fast copies into views.

`assign` is ``out[...] = values`` with ``astype``'s casting, fast when `out` is a transposed
view (readers fill a cast or transposed result through a small reused tile instead of a
full-size temporary) and for casts to bfloat16 (`cast_into`).

Example:
    >>> import numpy as np
    >>> out = np.empty((3, 2), np.float32).T
    >>> assign(out, np.arange(6).reshape(2, 3)); out.tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np

from ._casts import cast_bytes_into, cast_into

# casting a contiguous tile into a reused buffer, then copying it in 256 x 256 squares,
# runs at about 2.5 GB/s (measured on a (4096, 11008) float32 -> bfloat16 transpose).
_TILE = 256
_CAST_TILE_BYTES = 8 << 20
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
    """``out[...] = values``, cast as ``astype`` casts, fast when `out` is a transposed view
    (or `values` is: a transposed read, whole or a slice of one, into a layer of a stack)."""
    if out.ndim > 2 and out.shape == values.shape:
        matrices = _as_matrix(out), _as_matrix(values)
        if matrices[0] is not None and matrices[1] is not None:
            assign(*matrices)
            return
    if out.ndim == 2 and out.strides[-1] == out.itemsize and out.size >= _TILE * _TILE:
        columns_first = _transposed_matrix(values)
        if columns_first is not None:  # a transposed read: the same copy, seen the other way
            assign(out.T, columns_first)
            return
    if out.ndim != 2 or out.strides[-1] == out.itemsize or out.size < _TILE * _TILE:
        if out.ndim > 2 and not out.flags.c_contiguous and out.shape[0] <= _TILE:
            for index in range(out.shape[0]):  # a stack of transposed matrices
                assign(out[index], values[index])
            return
        cast_into(out, values)
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
            cast_into(tile, values[row : row + height])
        _transpose_into(out[row : row + height], tile)


def _as_matrix(array: np.ndarray) -> np.ndarray | None:
    """`array` as a (len(array), -1) view when its other axes merge into one, else None."""
    merged = all(
        array.strides[axis] == array.strides[axis + 1] * array.shape[axis + 1]
        for axis in range(1, array.ndim - 1)
    )
    if not merged:
        return None
    return np.lib.stride_tricks.as_strided(
        array,
        shape=(array.shape[0], math.prod(array.shape[1:])),
        strides=(array.strides[0], array.strides[-1]),
        writeable=array.flags.writeable,
    )


def _transposed_matrix(values: np.ndarray) -> np.ndarray | None:
    """``values.T`` for a 2-D `values` read through a transpose (its columns lie in memory
    one after the other, as rows of a wider matrix may), else None; never a copy."""
    if values.ndim != 2 or values.flags.c_contiguous:
        return None
    itemsize = values.itemsize
    row_stride = values.strides[1]
    if values.strides[0] != itemsize or row_stride < values.shape[0] * itemsize:
        return None
    if row_stride % itemsize:
        return None
    return np.lib.stride_tricks.as_strided(
        values,
        shape=(values.shape[1], values.shape[0]),
        strides=(row_stride, itemsize),
        writeable=False,
    )


def _transpose_into(out: np.ndarray, tile: np.ndarray) -> None:
    """``out[...] = tile`` (same dtype, `tile` C-contiguous) for a transposed view `out`.

    Where consecutive rows of `out` are adjacent in memory (`out` is a transposed C array),
    8 // itemsize rows are first interleaved into 64-bit lanes (contiguous passes), and the
    lanes are then copied in squares: a quarter of the strided element copies for 2-byte
    types, which made a bfloat16 transpose 2.6x faster (0.78 against 2.05 ns per element).
    Rows before the first 8-byte boundary and after the last whole lane go one by one.
    """
    rows, columns = out.shape
    itemsize = out.dtype.itemsize
    lanes = 8 // itemsize if itemsize in (1, 2, 4) else 1
    head = _rows_before_alignment(out) if lanes > 1 else None
    if head is None or rows - head < lanes:
        _copy_in_squares(out, tile)
        return
    packed_rows = (rows - head) - (rows - head) % lanes
    _copy_in_squares(out[:head], tile[:head])
    bits = np.dtype(f"u{itemsize}")
    groups = packed_rows // lanes
    packed = scratch_buffer("lanes", packed_rows * columns * itemsize)
    packed = packed.view(bits).reshape(groups, columns, lanes)
    source = tile[head : head + packed_rows].view(bits)
    for lane in range(lanes):
        packed[:, :, lane] = source[lane::lanes]
    wide = packed.view(np.uint64).reshape(groups, columns)
    # (groups, columns), 8-byte aligned
    target = out[head : head + packed_rows].T.view(np.uint64).T
    for column in range(0, columns, _TILE):
        target[:, column : column + _TILE] = wide[:, column : column + _TILE]
    _copy_in_squares(out[head + packed_rows :], tile[head + packed_rows :])


def _copy_in_squares(out: np.ndarray, tile: np.ndarray) -> None:
    if not out.size:
        return
    itemsize = out.dtype.itemsize
    if itemsize in (1, 2, 4, 8):  # as unsigned ints: numpy copies them, not ml_dtypes
        out, tile = out.view(f"u{itemsize}"), tile.view(f"u{itemsize}")
    for column in range(0, out.shape[1], _TILE):
        out[:, column : column + _TILE] = tile[:, column : column + _TILE]


def _rows_before_alignment(out: np.ndarray) -> int | None:
    """How many of `out`'s first rows lie before an 8-byte boundary, where its rows are
    adjacent in memory and its columns stride on 8 bytes; else None."""
    itemsize = out.dtype.itemsize
    if out.strides[0] != itemsize or out.strides[1] % 8:
        return None
    gap = -out.ctypes.data % 8
    return None if gap % itemsize else gap // itemsize


# below this many elements left, `read_cast_into` reads the rest into a buffer of its own
_IN_PLACE_TILE = 1 << 15
# source bytes read at a time (as `FileRangeSource` reads a tile), cast while in the cache
_IN_PLACE_CHUNK = 8 << 20


def read_cast_into(
    out: np.ndarray, dtype: np.dtype, read: Callable[[int, int, np.ndarray], None]
) -> None:
    """Fills C-contiguous `out` with ``out.size`` elements of `dtype`, cast as ``astype``
    casts, using `out`'s own memory as the read buffer: no temporary of the array's size
    and no per-thread read buffer, only a cache-sized tile.

    ``read(start, stop, into)`` must fill the uint8 array `into` with the bytes of source
    elements ``[start, stop)``. A chunk of source elements at a time is read into `out`
    where it can be cast forward into place (a tile at a time, copied out first where it
    overlaps the place it is written to): at its own place for a cast of the same size,
    after its place for one that widens; for one that narrows (float32 to bfloat16) the
    chunks shrink near the end, where the last few elements (at most a tile) are read into
    a buffer of their own. Where `dtype` is `out`'s, the chunks are read into place as they are.

    Example:
        >>> source = np.array([1.0, 2.5, -3.0], np.float16).view(np.uint8)
        >>> out = np.empty(3, np.float32)
        >>> read_cast_into(out, np.dtype(np.float16),
        ...                lambda a, b, into: into.__setitem__(..., source[2 * a : 2 * b]))
        >>> out.tolist()
        [1.0, 2.5, -3.0]
    """
    dtype = np.dtype(dtype)
    flat = out.reshape(-1)  # a view: `out` is C-contiguous
    raw = flat.view(np.uint8)
    count, size, width, done = flat.size, dtype.itemsize, out.itemsize, 0
    chunk = max(_IN_PLACE_TILE, _IN_PLACE_CHUNK // size)
    if dtype == out.dtype:  # nothing to cast: the bytes read are the result
        for start in range(0, count, chunk):
            stop = min(count, start + chunk)
            read(start, stop, raw[start * size : stop * size])
        return
    while done < count:
        fits = min(count - done, chunk, (count - done) * width // size)
        if fits < min(count - done, _IN_PLACE_TILE):  # the space left is too small: via the tile
            stop = min(count, done + _IN_PLACE_TILE)
            tail = aligned_empty(((stop - done) * size,), np.dtype(np.uint8))
            read(done, stop, tail)
            cast_into(flat[done:stop], tail.view(dtype))
            done = stop
            continue
        # element done + i at place + i * size: never below where its result goes, so each
        # tile's results overwrite only source bytes already cast
        place = done * width + fits * max(0, width - size)
        source = raw[place : place + fits * size]
        read(done, done + fits, source)
        cast_bytes_into(flat[done : done + fits], source, dtype)
        done += fits
