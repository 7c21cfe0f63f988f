"""The arithmetic of quantized formats, on numpy arrays of one block of rows.

Each function follows a reference that the tests run against it:

- FP8 with block scales: DeepSeek-V3's ``inference/fp8_cast_bf16.py`` (``weight_dequant``:
  ``float32(w) * s`` per ``128 x 128`` block, edge blocks ragged) and transformers'
  ``integrations/finegrained_fp8.py`` (``Fp8Dequantize._dequantize_one``); ``ue8m0`` scales
  are powers of two, ``2 ** (s - 127)`` when stored as bytes.
- FP8 quantization: transformers' ``Fp8Quantize._quantize_one`` (the scale is
  ``448 * (1 / max|block|)``, as torch evaluates ``448 / max|block|``, ``weight_scale_inv`` its float32 reciprocal, values clamped to
  ``[-448, 448]`` and rounded to float8_e4m3fn); a ragged edge block is the same formula over
  the elements it has.
- MXFP4: transformers' ``integrations/mxfp4.py`` (``convert_moe_packed_tensors``): two E2M1
  values per byte, low nibble first, times ``2 ** (scale - 127)``, 32 values per scale; the
  result is transposed on its last two axes, as transformers' GptOss experts hold it.

Example:
    >>> import numpy as np, ml_dtypes
    >>> w = np.full((3, 5), 2.0, ml_dtypes.float8_e4m3fn)
    >>> dequantize_fp8(w, np.array([[0.5, 4.0], [1.0, 1.0]], np.float32), (2, 4))[:, 3:]
    array([[1., 8.],
           [1., 8.],
           [2., 2.]], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import ml_dtypes
import numpy as np

from .._buffers import assign, scratch_buffer

FP8_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)  # 448.0
FLOAT32_MAX = np.float32(np.finfo(np.float32).max)
SMALLEST_INVERSE = np.float64(np.finfo(np.float32).smallest_subnormal)


def _largest_inverse() -> np.float32:
    """The largest float32 ``scale_inv`` that dequantizes 448 to a finite float32."""
    value = np.float32(FLOAT32_MAX / np.float32(FP8_MAX))
    with np.errstate(over="ignore"):
        while not np.isfinite(np.float32(FP8_MAX) * value):
            value = np.nextafter(value, np.float32(0))
    return value


LARGEST_INVERSE = np.float64(_largest_inverse())
FP4_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float32,
)
MXFP4_BLOCK = 32  # values per scale; 16 bytes of two values each


def scale_values(scales: np.ndarray) -> np.ndarray:
    """Stored scales as float32 multipliers: floats as they are, E8M0 bytes as ``2**(s-127)``.

    Example:
        >>> scale_values(np.array([127, 128, 125], np.uint8)).tolist()
        [1.0, 2.0, 0.25]
    """
    if scales.dtype == np.uint8:
        with np.errstate(over="ignore"):  # byte 255 is E8M0's NaN; 2**128 overflows to inf
            return np.ldexp(np.float32(1.0), scales.astype(np.int32) - 127).astype(np.float32)
    return scales.astype(np.float32)  # float8_e8m0fnu converts exactly to 2**(s-127)


def dequantize_fp8_into(
    out: np.ndarray, weight: np.ndarray, scales: np.ndarray, row_blocks: Any, col_blocks: Any
) -> bool:
    """``out[...] = float32(weight) * scale`` of each element's block, a strip at a time.

    `weight` and `out` have the selected elements' shape ``(..., rows, cols)``; `scales`
    ``(..., scale rows, scale cols)`` (leading axes as `weight`'s); ``row_blocks[i]`` and
    ``col_blocks[j]`` are the scale row and column of selected row ``i`` and column ``j``.

    Each block has its own 256-entry table, ``float32(code) * scale`` already cast to
    `out`'s dtype (the same two roundings, so the same values as multiplying element by
    element), and one lookup per element reads it: ``table[block * 256 + code]``. In
    strips that stay in cache, written straight into `out` where it is contiguous. Within
    one block row the index fits 16 bits (up to 256 column blocks): it is summed as
    ``uint16`` and widened for `np.take` in one copy, which costs less than half of adding
    the bytes to a wider offset (numpy casts mixed operands in buffered steps).

    Returns whether some block's table holds inf or NaN for a finite code (a scale that is
    not finite, or a product beyond `out`'s dtype): then `out` may hold such values, which
    the caller can look for (`unheld_values`).
    """
    if out.size == 0:
        return False
    overflow = False
    lookup = _FP8_TABLES[weight.dtype.name]
    values = scale_values(scales)
    row_blocks = np.asarray(row_blocks, dtype=np.intp)
    column_blocks = np.asarray(col_blocks, dtype=np.intp)
    column_offsets = column_blocks * 256
    narrow = column_offsets.astype(np.uint16) if int(column_blocks.max()) < 256 else None
    raw = weight.view(np.uint8)
    rows, cols = weight.shape[-2:]
    strip = max(1, STRIP_ELEMENTS // cols)
    index_buffer = scratch_buffer("fp8 index", min(rows, strip) * cols * 8)
    narrow_buffer = scratch_buffer("fp8 narrow index", min(rows, strip) * cols * 2)
    for lead in np.ndindex(*weight.shape[:-2]):
        lead_values, lead_raw, lead_out = values[lead], raw[lead], out[lead]
        row_width = lead_values.shape[-1] * 256  # table entries per block row
        whole = lead_values.size * 256 * out.dtype.itemsize <= TABLE_BYTES
        if whole:  # every block's table at once; else those of each strip's block rows
            table = _block_tables(lookup, lead_values, out.dtype)
            overflow = overflow or _overflows(table, lookup)
        for start, stop in _strips(row_blocks, strip):
            if whole:
                local = row_blocks[start:stop]
            else:
                used, local = np.unique(row_blocks[start:stop], return_inverse=True)
                table = _block_tables(lookup, lead_values[used], out.dtype)
                overflow = overflow or _overflows(table, lookup)
            count = (stop - start) * cols
            index = index_buffer[: count * 8].view(np.intp).reshape(stop - start, cols)
            block_row = int(local[0])
            source = table
            if local.min() != local.max():
                np.add(lead_raw[start:stop], column_offsets, out=index)
                index += (local.reshape(-1) * row_width)[:, None]
            elif narrow is not None:  # one block row: its own table, a 16-bit index
                source = table[block_row * row_width : (block_row + 1) * row_width]
                small = narrow_buffer[: count * 2].view(np.uint16).reshape(stop - start, cols)
                np.add(lead_raw[start:stop], narrow, out=small)
                np.copyto(index, small)
            else:  # one block row: one pass over the index
                np.add(lead_raw[start:stop], column_offsets + block_row * row_width, out=index)
            target = lead_out[start:stop]
            if target.flags.c_contiguous:
                np.take(source, index, out=target, mode="clip")  # clip: unbuffered; in range
            else:
                assign(target, np.take(source, index, mode="clip"))  # fast into transposed views
    return overflow


def _strips(row_blocks: np.ndarray, strip: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` of strips of at most `strip` rows, cut where the block row changes
    (the rows are those of a selection, in its order), unless it changes so often (rows
    picked out of order) that strips that short would cost more than mixed ones."""
    changes = np.flatnonzero(np.diff(row_blocks)) + 1
    if len(changes) * 32 > len(row_blocks):
        changes = changes[:0]
    edges = [0, *changes.tolist(), len(row_blocks)]
    for low, high in zip(edges[:-1], edges[1:], strict=False):
        for start in range(low, high, strip):
            yield start, min(high, start + strip)


def _block_tables(lookup: np.ndarray, scales: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``dtype(lookup * scale)`` for every scale of ``(block rows, block cols)``, flat:
    the product in float32 (as torch and DeepSeek's kernel compute it), then one cast."""
    with np.errstate(over="ignore", invalid="ignore"):  # found by `_overflows`, said by the node
        return (lookup * scales[..., None]).astype(dtype).reshape(-1)


def _overflows(table: np.ndarray, lookup: np.ndarray) -> bool:
    """Whether `table` holds inf or NaN where `lookup` (its codes) is finite."""
    return not np.isfinite(table.reshape(-1, 256)[:, np.isfinite(lookup)]).all()


def unheld_values(out: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Where dequantized `out` is inf or NaN although its code in `codes` is finite."""
    return ~np.isfinite(out) & np.isfinite(codes.astype(np.float32))


def dequantize_fp8(weight: np.ndarray, scales: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """A whole FP8 weight ``(..., rows, cols)`` times its block scales, as float32."""
    out = np.empty(weight.shape, np.float32)
    rows, cols = weight.shape[-2:]
    dequantize_fp8_into(
        out, weight, scales, np.arange(rows) // block[0], np.arange(cols) // block[1]
    )
    return out


STRIP_ELEMENTS = 1 << 18  # an index strip of 2 MiB (intp)
TABLE_BYTES = 8 << 20  # the most the lookup tables of one read take
_FP8_TABLES = {
    name: np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, name)).astype(np.float32)
    for name in ("float8_e4m3fn", "float8_e5m2")
}


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
    """``(..., rows, groups, 16)`` bytes and ``(..., rows, groups)`` E8M0 scales -> `dtype`
    ``(..., rows, groups * 32)``, before transformers' final transpose.

    An E8M0 scale has 256 values and a byte two E2M1 ones: one table holds, for every
    (scale, byte), ``ldexp(value, scale - 127)`` of the byte's two values (as torch.ldexp: in
    float32), cast to `dtype`; each byte is then one lookup of both its values. Byte 255
    (E8M0's NaN) is read as transformers reads it: ``ldexp(value, 128)``, so 0 stays 0,
    ±0.5 is ±2**127 and the rest ±inf (the node says so).
    """
    dtype = np.dtype(dtype)
    if dtype.itemsize > 4:  # no integer holds two: the float32 values, then cast
        return dequantize_mxfp4(blocks, scales).astype(dtype)
    table = _MXFP4_TABLES.get(dtype)
    if table is None:
        table = _MXFP4_TABLES[dtype] = _mxfp4_table(dtype)
    index = np.left_shift(scales.view(np.uint8), 8, dtype=np.intp)[..., None]
    index = index + blocks.view(np.uint8)
    pairs = np.take(table, index, mode="clip")  # clip: unbuffered; every index is in range
    return pairs.view(dtype).reshape(*blocks.shape[:-2], blocks.shape[-2] * blocks.shape[-1] * 2)


def _mxfp4_table(dtype: np.dtype) -> np.ndarray:
    """For index ``scale * 256 + byte``: the byte's two values, scaled, as one wide integer."""
    codes = np.arange(256)
    pairs = np.stack([FP4_VALUES[codes & 0x0F], FP4_VALUES[codes >> 4]], axis=-1)
    exponents = (codes.astype(np.int32) - 127)[:, None, None]
    with np.errstate(over="ignore"):  # past float32 (bytes 253 up): inf, as in torch
        # ldexp, not times 2**(s-127): 2**128 (byte 255) is inf, and 0 * inf would be NaN
        table = np.ldexp(pairs[None, :, :], exponents).astype(np.float32).astype(dtype)
    return np.ascontiguousarray(table).view(np.dtype(f"u{2 * dtype.itemsize}")).reshape(-1)


_MXFP4_TABLES: dict[np.dtype, np.ndarray] = {}


def mxfp4_overflow_scale(dtype: Any) -> int:
    """The smallest E8M0 scale byte at which some FP4 value overflows `dtype` (257: none);
    byte 255 (E8M0's NaN) aside."""
    dtype = np.dtype(dtype)
    if dtype not in _MXFP4_LIMITS:
        with np.errstate(over="ignore"):
            largest = np.ldexp(np.float32(6.0), np.arange(255) - 127).astype(np.float32)
            cast = largest.astype(dtype) if dtype.itemsize <= 4 else largest
        over = np.flatnonzero(~np.isfinite(cast))
        _MXFP4_LIMITS[dtype] = int(over[0]) if len(over) else 257
    return _MXFP4_LIMITS[dtype]


_MXFP4_LIMITS: dict[np.dtype, int] = {}


def quantize_fp8(
    values: np.ndarray,
    block: tuple[int, int],
    unheld: Callable[[np.ndarray, str], None] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """FP8 E4M3 values and float32 ``scale_inv`` per block of the last two axes.

    The block rows and columns of `values` start at multiples of `block`; the last block of
    an axis may be shorter (ragged). Bytes equal transformers' ``Fp8Quantize`` where the
    shape divides; a ragged block uses the same formula over its elements.

    Where that formula breaks, the block's finite values still come back close: NaN and
    infinities (FP8 E4M3 has no infinity) are written as NaN and left out of the block's
    largest magnitude, a float64 value beyond float32's range saturates at float32's largest
    (its dequantized value must fit the float32 the scales are), and a block so small that
    ``448 / max`` overflows float32 (or so large that ``448 * scale_inv`` does) gets
    ``scale_inv = max / 448``, kept within float32 (at least its smallest subnormal),
    instead of an infinite or zero scale. A block whose nonzero float64 values all flush to
    zero in float32 (below its smallest subnormal) is written as zeros with scale 1.
    `unheld`, when given, is called first with the mask of the values that FP8 cannot hold
    and why: ``"range"`` (inf, NaN, beyond float32) or ``"tiny"`` (a block flushed to zero);
    it may raise.
    """
    with np.errstate(over="ignore"):  # float64 beyond float32's range: inf here, seen below
        x = values.astype(np.float32)
    tiles, max_abs = _tiles(x, block)
    not_a_number = None
    if not np.isfinite(max_abs).all():  # NaN propagates through max, as inf does
        finite = np.isfinite(values)
        if unheld is not None:
            unheld(~(finite & np.isfinite(x)), "range")
        x = np.where(finite, np.clip(x, -FLOAT32_MAX, FLOAT32_MAX), np.float32(0))
        not_a_number = ~finite
        tiles, max_abs = _tiles(x, block)
    if unheld is not None and values.dtype.itemsize > 4 and not max_abs.all():
        flushed = _flushed(values, x, max_abs == 0, block)
        if flushed.any():
            unheld(flushed, "tiny")
    safe = np.where(max_abs > 0, max_abs, np.float32(1.0))
    with np.errstate(over="ignore", divide="ignore"):  # blocks the formula fails: `off`
        # torch computes `448.0 / t` as `t.reciprocal() * 448.0`, one rounding more than a
        # division: the same two steps give the same scales, hence the same bytes
        scales = (np.float32(FP8_MAX) * (np.float32(1.0) / safe)).astype(np.float32)
        inverse = (np.float32(1.0) / scales).astype(np.float32)
        # where the formula fails: an infinite scale, or a scale_inv that dequantizes 448 to inf
        off = ~np.isfinite(scales) | ~np.isfinite(np.float32(FP8_MAX) * inverse)
    scales = np.where((max_abs > 0) & ~off, scales, np.float32(1.0)).astype(np.float32)
    inverse = np.where(max_abs > 0, inverse, np.float32(1.0)).astype(np.float32)
    scaled = tiles * scales[..., :, None, :, None]
    if off.any():
        wanted = max_abs.astype(np.float64) / FP8_MAX
        chosen = np.clip(wanted, SMALLEST_INVERSE, LARGEST_INVERSE).astype(np.float32)
        inverse = np.where(off, chosen, inverse)
        exact = tiles.astype(np.float64) / inverse.astype(np.float64)[..., :, None, :, None]
        scaled = np.where(off[..., :, None, :, None], exact, scaled)
    quantized = np.clip(scaled, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn)
    rows, cols = x.shape[-2:]
    quantized = quantized.reshape(*x.shape[:-2], -1, quantized.shape[-2] * quantized.shape[-1])
    quantized = np.ascontiguousarray(quantized[..., :rows, :cols])
    if not_a_number is not None:
        quantized[not_a_number] = np.nan
    return quantized, inverse


def _flushed(
    values: np.ndarray, x: np.ndarray, zero_blocks: np.ndarray, block: tuple[int, int]
) -> np.ndarray:
    """Where `values` is nonzero but its float32 `x` is zero, in blocks that are all zero in
    `x` (every value of such a block is lost; elsewhere the scale keeps the block's range).
    NaN and inf are left out: they were said as out of range."""
    rows, cols = x.shape[-2:]
    spread = np.repeat(np.repeat(zero_blocks, block[0], axis=-2), block[1], axis=-1)
    return spread[..., :rows, :cols] & (x == 0) & (values != 0) & np.isfinite(values)


def _tiles(x: np.ndarray, block: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """`x` as ``(..., block rows, block[0], block cols, block[1])`` (zero-padded: zeros change
    no block's largest magnitude) and each block's largest magnitude."""
    *lead, rows, cols = x.shape
    row_blocks, col_blocks = -(-rows // block[0]), -(-cols // block[1])
    padded_rows, padded_cols = row_blocks * block[0], col_blocks * block[1]
    if (padded_rows, padded_cols) != (rows, cols):
        padded = np.zeros((*lead, padded_rows, padded_cols), np.float32)
        padded[..., :rows, :cols] = x
        x = padded
    tiles = x.reshape(*lead, row_blocks, block[0], col_blocks, block[1])
    return tiles, np.abs(tiles).max(axis=(-3, -1))


def _positions(axis: Any) -> Any:
    return np.arange(axis.start, axis.stop, axis.step) if isinstance(axis, range) else axis
