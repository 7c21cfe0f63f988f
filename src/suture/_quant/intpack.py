"""Integers of 1 to 8 bits packed densely in int32 words, as compressed-tensors packs them.

compressed-tensors 0.20 (``pack_to_int32``) stores value ``i`` of a row at bit ``i * b`` of
the row's words read as one little-endian bit string, as ``q + 2 ** (b - 1)``; a row of
``n`` values takes ``ceil(n * b / 32)`` words. (Before 0.20 each word held ``32 // b``
whole values; for 1, 2, 4 and 8 bits that is the same layout, for 3, 5, 6 and 7 it is not.)
Zero points are packed the same way along their first axis (the rows).

Example:
    >>> words = np.array([[0x76543210, 0xFEDCBA98]], np.uint32).view(np.int32)
    >>> unpack_codes(words, 4, 16).tolist()
    [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]]
    >>> unpack_codes(np.array([[0b111_110_101]], np.int32), 3, 3).tolist()
    [[5, 6, 7]]
"""

from __future__ import annotations

import numpy as np


def packed_words(count: int, bits: int) -> int:
    """Words that hold `count` values of `bits` bits."""
    return -(-count * bits // 32)


def unpack_codes(words: np.ndarray, bits: int, count: int, skip: int = 0) -> np.ndarray:
    """`count` stored (unsigned) codes of each row of `words` ``(..., W)``, the first at
    bit `skip`, as uint8 ``(..., count)``."""
    raw = np.ascontiguousarray(words).astype("<i4", copy=False).view(np.uint8)
    if bits == 8 and skip % 8 == 0:
        return raw[..., skip // 8 : skip // 8 + count]
    if bits == 4 and skip % 4 == 0:
        pairs = np.stack([raw & 0x0F, raw >> 4], axis=-1)
        pairs = pairs.reshape(*raw.shape[:-1], raw.shape[-1] * 2)
        return pairs[..., skip // 4 : skip // 4 + count]
    stream = np.unpackbits(raw, axis=-1, bitorder="little")[..., skip : skip + count * bits]
    stream = stream.reshape(*raw.shape[:-1], count, bits)
    widened = np.zeros((*stream.shape[:-1], 8), np.uint8)
    widened[..., :bits] = stream
    return np.packbits(widened, axis=-1, bitorder="little")[..., 0]


def unpack_signed(words: np.ndarray, bits: int, count: int, skip: int = 0) -> np.ndarray:
    """The values ``code - 2 ** (bits - 1)``, as int16 ``(..., count)``."""
    return unpack_codes(words, bits, count, skip).astype(np.int16) - (1 << (bits - 1))


def unpack_values(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The values ``q`` (codes less ``2 ** (bits - 1)``) of each row, as float32 ``(...,
    count)``: exact, they are small integers."""
    values = unpack_codes(words, bits, count).astype(np.float32)
    values -= np.float32(1 << (bits - 1))
    return values


def dequantize_groups(
    values: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    group: int,
) -> np.ndarray:
    """``float32(q - z) * scale`` of each group of `group` values of the last axis, as
    compressed-tensors computes it (``x_q.to(s.dtype) - z``, times ``s``) with float32
    scales; `values` (``q``, float32) ``(..., rows, cols)``, `scales` and `zero_points`
    ``(..., rows, cols / group)``."""
    *lead, cols = values.shape
    grouped = np.ascontiguousarray(values).reshape(*lead, cols // group, group)
    if zero_points is not None:
        grouped -= zero_points.astype(np.float32)[..., None]
    with np.errstate(over="ignore", invalid="ignore"):  # scales are checked by the node
        grouped *= scales[..., None]
    return grouped.reshape(values.shape)
