"""FP4 E2M1 values packed two to a byte, times one float32 scale per group of a row.

The arithmetic of three published formats, each checked against its reference in the tests:

- DeepSeek-V4's FP4 experts: a scale per 32 values, UE8M0 (``2 ** (s - 127)``); MaxText's
  ``deepseek_dequantize.py`` (``dequantize_mxfp4``) and transformers' ``Fp8Dequantize``.
- compressed-tensors ``nvfp4-pack-quantized``: FP8 E4M3 scales per 16 values divided by the
  tensor's global scale (``s / g`` in float32, then times the value).
- ModelOpt NVFP4: FP8 E4M3 scales per 16 values times ``weight_scale_2`` (``s * s2`` in
  float32, then times the value); its nibble 8 is +0.0 where the others give -0.0.

In every one the low nibble of a byte is the first of its two values, and the value is
``float32(e2m1) * float32(scale)``, cast once to the output dtype.

Example:
    >>> packed = np.array([[0x21, 0xF8]], np.uint8)  # values 0.5, 1.0, -0.0, -6.0
    >>> dequantize_e2m1(packed, np.array([[2.0]], np.float32), 4).tolist()
    [[1.0, 2.0, -0.0, -12.0]]
    >>> dequantize_e2m1(packed, np.array([[2.0]], np.float32), 4, E2M1_POSITIVE_ZERO)[0, 2]
    np.float32(0.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .formats import FP4_VALUES

E2M1 = FP4_VALUES  # nibble -> value; nibble 8 is -0.0
E2M1_POSITIVE_ZERO = FP4_VALUES.copy()
E2M1_POSITIVE_ZERO[8] = 0.0  # ModelOpt's table: ``e2m1_values[8] = 0``


def _pair_table(table: np.ndarray) -> np.ndarray:
    """For each byte, its two float32 values (the low nibble's first) as one uint64."""
    codes = np.arange(256)
    pairs = np.stack([table[codes & 0x0F], table[codes >> 4]], axis=-1).astype(np.float32)
    return np.ascontiguousarray(pairs).view(np.uint64).reshape(-1)


_PAIRS = {id(E2M1): _pair_table(E2M1), id(E2M1_POSITIVE_ZERO): _pair_table(E2M1_POSITIVE_ZERO)}


def unpack_e2m1(packed: np.ndarray, table: np.ndarray = E2M1) -> np.ndarray:
    """``(..., n)`` bytes -> ``(..., 2 n)`` float32 values, low nibble first."""
    pairs = _PAIRS.get(id(table))
    if pairs is None:
        pairs = _pair_table(table)
    # one 8-byte gather a byte; the index widened first (faster than numpy widening it)
    values = np.take(pairs, packed.view(np.uint8).astype(np.intp), mode="clip")
    return values.view(np.float32).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def dequantize_e2m1(
    packed: np.ndarray,
    scales: np.ndarray,
    group: int,
    table: np.ndarray = E2M1,
    dtype: Any = np.float32,
) -> np.ndarray:
    """``(..., rows, n)`` packed bytes and ``(..., rows, 2 n / group)`` float32 scales ->
    `dtype` ``(..., rows, 2 n)``: each value times its group's scale, in float32."""
    values = unpack_e2m1(packed, table)
    shape = values.shape
    grouped = values.reshape(*shape[:-1], shape[-1] // group, group)
    with np.errstate(over="ignore", invalid="ignore"):  # scales are checked by the node
        grouped *= scales[..., None]
        return grouped.reshape(shape).astype(dtype, copy=False)
