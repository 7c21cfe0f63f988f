"""Two 4-bit codes a byte times a group's scale, as one table lookup a byte.

A block's scales take few distinct values when they are stored in 8 or 16 bits (bfloat16
INT4 scales, FP8 E4M3 NVFP4 scales): for each distinct stored scale and each byte, the two
output values ``out_dtype(float32(value(code)) * float32(scale))``, low nibble first, are
computed once into a table; the block is then one gather a byte, straight into the output's
bytes. The values are those of the multiply-then-cast route, bit for bit: the table is that
route applied to every (scale, byte) pair the block can hold.

Example:
    >>> import ml_dtypes
    >>> codes = np.arange(16, dtype=np.float32) - 8           # INT4: q = code - 8
    >>> scales = np.array([[0.5, 2.0]], ml_dtypes.bfloat16)      # a scale per 4 values
    >>> packed = np.array([[0x98, 0x7F, 0x98, 0x00]], np.uint8)  # codes 8, 9, 15, 7 | 8, 9, 0, 0
    >>> table, rows = build(scales, lambda s: s.astype(np.float32), codes, scales.dtype, 8, 1024)
    >>> out = np.empty((1, 8), ml_dtypes.bfloat16)
    >>> gather_into(out, packed, rows, table)
    >>> out.astype(np.float32).tolist()
    [[0.0, 0.5, 3.5, -0.5, 0.0, 2.0, -16.0, -16.0]]
"""

from __future__ import annotations

from collections.abc import Callable

import ml_dtypes
import numpy as np

from .._buffers import scratch_buffer

TILE_BYTES = 1 << 17  # packed bytes a tile: its gather index (8 bytes a byte) stays in cache


def build(
    stored: np.ndarray,
    scale_of: Callable[[np.ndarray], np.ndarray],
    codes: np.ndarray,
    dtype: np.dtype,
    largest: float,
    most: int,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The flat table (`pair_table` of each distinct stored scale) and each scale's row in it
    (intp, `stored`'s shape); None where the scales are wider than 16 bits, take more than
    `most` entries, or are not all finite with ``largest * |scale|`` within `dtype` (the
    multiply-then-cast route says where and how)."""
    if stored.dtype.itemsize not in (1, 2) or stored.size == 0:
        return None
    bits = np.ascontiguousarray(stored).view(np.uint8 if stored.dtype.itemsize == 1 else np.uint16)
    present = np.bincount(bits.reshape(-1), minlength=1 << (8 * stored.dtype.itemsize)) > 0
    distinct = np.flatnonzero(present)
    if len(distinct) * 256 > most:
        return None
    scales = np.asarray(scale_of(distinct.astype(bits.dtype).view(stored.dtype)), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        fine = np.isfinite(scales).all() and float(np.abs(scales).max()) * largest <= float(
            ml_dtypes.finfo(dtype).max
        )
    if not fine:
        return None
    number = np.cumsum(present, dtype=np.intp) - 1  # stored bits -> its row of the table
    return pair_table(scales, codes, dtype).reshape(-1), number[bits] * 256


def pair_table(scales: np.ndarray, codes: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``(len(scales), 256)`` entries of two `dtype` values each (as one unsigned integer):
    ``dtype(codes[byte & 15] * scale)`` then ``dtype(codes[byte >> 4] * scale)``, the
    products in float32."""
    byte = np.arange(256)
    values = np.stack([codes[byte & 0x0F], codes[byte >> 4]], axis=-1).astype(np.float32)
    products = values[None] * scales.astype(np.float32)[:, None, None]
    cast = np.ascontiguousarray(products.astype(dtype))
    return cast.view(np.dtype(f"u{2 * np.dtype(dtype).itemsize}")).reshape(len(scales), 256)


def gather_into(out: np.ndarray, packed: np.ndarray, rows: np.ndarray, table: np.ndarray) -> None:
    """``out (n, 2 w)`` (C-contiguous) from `packed` ``(n, w)`` bytes, whose groups of
    ``w / g`` bytes use table rows `rows` ``(n, g)`` (as `build` gives them)."""
    count, width = packed.shape
    groups = rows.shape[-1]
    half = width // groups  # bytes a group
    pairs = out.view(table.dtype).reshape(count, width)
    step = max(1, TILE_BYTES // max(1, width))
    index = scratch_buffer("byte table index", min(count, step) * width * 8)
    for start in range(0, count, step):
        stop = min(count, start + step)
        tile = index[: (stop - start) * width * 8].view(np.intp)
        tile = tile.reshape(stop - start, groups, half)
        np.copyto(tile, packed[start:stop].reshape(stop - start, groups, half), casting="unsafe")
        tile += rows[start:stop, :, None]
        # clip: every index is in range (a stored scale's row plus a byte), and unlike the
        # default ("raise") it writes `out` unbuffered: a third of the gather's CPU
        np.take(table, tile.reshape(stop - start, width), out=pairs[start:stop], mode="clip")
