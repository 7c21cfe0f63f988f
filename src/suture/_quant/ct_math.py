"""compressed-tensors' weight quantization, on numpy arrays of whole rows.

The arithmetic of compressed-tensors 0.20's preset schemes, step for step as torch runs it
on the CPU: a weight of dtype D (bfloat16, float16, float32) is computed on in float32 and
rounded back to D after each operation, as torch does for D's arithmetic, and those
roundings are part of the stored bytes. Scales come from each group's (or row's) largest
magnitude, as compressed-tensors' ``calculate_qparams`` computes them from the min and max
that llm-compressor's min-max observer gives; the values are then quantized by its
``quantize`` and packed by its compressors.

- ``int`` (W4A16, W8A16): symmetric, ``scale = D(max|group| / D(bit_range / 2))``, a zero
  scale replaced by D's epsilon; values ``round(clamp(D(w / scale)))`` to int8, packed into
  int32 (`pack_int32`), ``value + 2**(bits - 1)`` a field of `bits` bits, element 0 lowest.
- ``fp8`` (FP8_DYNAMIC): one scale per output row, ``D(max|row| / 448)``; values
  ``float8_e4m3fn(clamp(D(w / scale) + 0, -448, 448))`` (the zero point's + 0 turns -0 to 0).
- ``nvfp4`` (NVFP4A16): a float32 global scale per tensor (shared by fused projections)
  and an FP8 E4M3 scale per 16 values; values E2M1 (`round_fp4`), two per byte, low
  nibble first, a negative value that rounds to zero kept as -0.

Example:
    >>> import numpy as np, ml_dtypes
    >>> w = np.array([[1.0, -2.0, 0.5, 4.0]], ml_dtypes.bfloat16)
    >>> q, scale = quantize_int(w, 4, 4)
    >>> q.tolist(), scale.astype(np.float32).tolist()
    ([[2, -4, 1, 7]], [[0.53515625]])
    >>> hex(pack_int32(q, 4)[0, 0])  # nibbles q + 8 = 10, 4, 9, 15, the first lowest
    '0xf94a'
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .formats import FP4_VALUES

FP8 = np.dtype(ml_dtypes.float8_e4m3fn)
FP8_MAX = 448.0
FP4_MAX = 6.0
FP4_GRID = FP4_VALUES[:8]  # the non-negative E2M1 values, ascending (codes 0-7)
NVFP4_GROUP = 16
NVFP4_SCALE_EPS = 0.125  # compressed-tensors' stand-in for a zero FP8 scale


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype torch computes `dtype`'s arithmetic in on the CPU."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _epsilon(dtype: np.dtype) -> float:
    return float(ml_dtypes.finfo(dtype).eps)


def _in(dtype: np.dtype, value: np.ndarray) -> np.ndarray:
    """`value` (computed in float32/64) rounded to `dtype`, and back to the compute dtype."""
    return value.astype(dtype).astype(compute_dtype(dtype))


def _largest(groups: np.ndarray) -> np.ndarray:
    """``max(|min(g, 0)|, |max(g, 0)|)`` over the last axis, as ``calculate_qparams``."""
    low = np.minimum(groups.min(axis=-1), 0)
    high = np.maximum(groups.max(axis=-1), 0)
    return np.maximum(np.abs(low), np.abs(high))


def _grouped(weight: np.ndarray, group: int | None) -> np.ndarray:
    """`weight` (rows, cols) in its compute dtype as (rows, groups, group): one group a
    row when `group` is None (per-channel)."""
    values = weight.astype(compute_dtype(weight.dtype))
    rows, cols = values.shape
    size = cols if group is None else group
    return values.reshape(rows, cols // size, size)


def quantize_int(weight: np.ndarray, bits: int, group: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric integer quantization: int8 values (rows, cols) and scales (rows, groups)
    in the weight's dtype."""
    dtype = weight.dtype
    groups = _grouped(weight, group)
    half = _in(dtype, np.asarray((2.0**bits - 1) / 2, compute_dtype(dtype)))
    scale = _in(dtype, _largest(groups) / half)
    scale = np.where(scale == 0, _epsilon(dtype), scale)
    scaled = _in(dtype, groups / scale[..., None])
    low, high = -(2.0 ** (bits - 1)), 2.0 ** (bits - 1) - 1
    np.clip(scaled, low, high, out=scaled)
    values = np.rint(scaled, out=scaled).astype(np.int8)  # rint: half to even, as torch.round
    return values.reshape(weight.shape), scale.astype(dtype)


def quantize_fp8_channel(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FP8 E4M3 values and one scale per row (rows, 1) in the weight's dtype."""
    dtype = weight.dtype
    groups = _grouped(weight, None)
    scale = _in(dtype, _largest(groups) / _in(dtype, np.asarray(FP8_MAX)))
    scale = np.where(scale == 0, _epsilon(dtype), scale)
    # + 0: compressed-tensors adds the (zero) zero point, which makes a -0 weight +0
    scaled = _in(dtype, groups / scale[..., None]) + 0.0
    values = np.clip(scaled, -FP8_MAX, FP8_MAX).astype(FP8)
    return values.reshape(weight.shape), scale.astype(dtype)


def nvfp4_global_scale(largest: float, dtype: np.dtype) -> np.float32:
    """The float32 global scale of a tensor whose largest magnitude is `largest`:
    ``448 * 6 / largest`` as torch evaluates it on D (a reciprocal, then a multiply, each
    rounded to D), 1.0 where that is not finite."""
    compute = compute_dtype(dtype)
    tiny = float(ml_dtypes.finfo(dtype).tiny)
    largest_d = _in(dtype, np.asarray(max(largest, tiny), compute))
    with np.errstate(divide="ignore", over="ignore"):
        reciprocal = _in(dtype, np.asarray(1, compute) / largest_d)
        scale = _in(dtype, reciprocal * compute.type(FP8_MAX * FP4_MAX))
    return np.float32(scale) if np.isfinite(scale) else np.float32(1.0)


def largest_magnitude(weight: np.ndarray) -> float:
    """``max(|min(w, 0)|, |max(w, 0)|)`` of a block of a weight (a global scale's input)."""
    if weight.size == 0:
        return 0.0
    return float(_largest(weight.astype(compute_dtype(weight.dtype)).reshape(1, -1))[0])


def round_fp4(values: np.ndarray) -> np.ndarray:
    """The nearest E2M1 value of each float32 in [-6, 6], as compressed-tensors'
    ``cast_to_fp4`` rounds (ties as its thresholds say; a negative one that rounds to 0
    is -0, a -0 or NaN input as torch's ``sign`` makes it)."""
    magnitude = np.abs(values)
    bins = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    # thresholds alternate <= and <: 0.25 (<=), 0.75 (<), 1.25 (<=), 1.75 (<), ...
    right = np.array([True, False, True, False, True, False, True])
    index = np.zeros(values.shape, np.intp)
    for bound, inclusive in zip(bins, right, strict=True):
        index += (magnitude > bound) if inclusive else (magnitude >= bound)
    with np.errstate(invalid="ignore"):
        return FP4_GRID[index] * np.sign(values).astype(np.float32)


def quantize_nvfp4(weight: np.ndarray, global_scale: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """E2M1 values as float32 (rows, cols) and FP8 E4M3 scales (rows, cols // 16)."""
    dtype = weight.dtype
    groups = _grouped(weight, NVFP4_GROUP)
    local = _in(dtype, _largest(groups) / _in(dtype, np.asarray(FP4_MAX)))
    scale = np.float32(global_scale) * local.astype(np.float32)
    scale = np.clip(scale, -FP8_MAX, FP8_MAX).astype(FP8).astype(np.float32)
    scale = np.where(scale == 0, np.float32(NVFP4_SCALE_EPS), scale)
    effective = scale / np.float32(global_scale)
    scaled = groups.astype(np.float32) / effective[..., None]
    values = round_fp4(np.clip(scaled, -FP4_MAX, FP4_MAX))
    return values.reshape(weight.shape), scale.astype(FP8)


def pack_fp4(values: np.ndarray) -> np.ndarray:
    """E2M1 values (rows, even cols) as uint8 (rows, cols // 2): sign bit 3, the index of
    the magnitude below it, element 0 in the low nibble."""
    index = np.searchsorted(FP4_GRID, np.abs(values)).astype(np.uint8)
    codes = index | (np.signbit(values).astype(np.uint8) << 3)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def pack_int32(values: np.ndarray, bits: int) -> np.ndarray:
    """int8 values (rows, cols) of `bits` (4 or 8) as int32 (rows, ceil(cols * bits / 32)):
    each ``value + 2**(bits - 1)``, element 0 in the lowest bits, little-endian words."""
    rows, cols = values.shape
    unsigned = values.view(np.uint8) + np.uint8(1 << (bits - 1))  # wraps to value + offset
    padded = -(-cols // 32) * 32
    if padded > cols:
        unsigned = np.pad(unsigned, ((0, 0), (0, padded - cols)))
    if bits == 4:
        unsigned = unsigned[:, 0::2] | (unsigned[:, 1::2] << 4)
    words = np.ascontiguousarray(unsigned).view("<i4").astype(np.int32)
    return words[:, : -(-cols * bits // 32)]
