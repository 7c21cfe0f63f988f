"""Streamed numbers about arrays: per-leaf statistics, and value differences between two leaves.

Both read a leaf in blocks of rows (at most `block_bytes` at a time) and fold the blocks,
so a leaf of any size is summarized in bounded memory. Statistics combine exactly across
blocks (Chan's parallel formula for the variance).

Example:
    >>> import numpy as np, suture
    >>> x = suture.LazyArray.from_array(np.array([1.0, 2.0, np.nan, 4.0]))
    >>> stats = leaf_stats(x)
    >>> (stats.minimum, stats.maximum, stats.nan_count, round(stats.mean, 4))
    (1.0, 4.0, 1, 2.3333)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._lazy.array import LazyArray

DEFAULT_BLOCK_BYTES = 64 << 20


def blocks(array: LazyArray, block_bytes: int = DEFAULT_BLOCK_BYTES) -> Iterator[np.ndarray]:
    """The array's values, a block of rows of the first axis at a time."""
    if array.ndim == 0 or array.shape[0] == 0:
        yield array.read()
        return
    row_bytes = max(1, array.nbytes // array.shape[0])
    step = max(1, block_bytes // row_bytes)
    for start in range(0, array.shape[0], step):
        yield array[start : start + step].read()


@dataclass
class LeafStats:
    """Summary of one array's values (NaNs excluded from all but `nan_count`)."""

    count: int = 0
    nan_count: int = 0
    minimum: float = math.nan
    maximum: float = math.nan
    mean: float = math.nan
    std: float = math.nan

    def to_json(self) -> dict[str, float | int | None]:
        def clean(value: float) -> float | None:
            return None if math.isnan(value) else value

        return {
            "count": self.count,
            "nan_count": self.nan_count,
            "min": clean(self.minimum),
            "max": clean(self.maximum),
            "mean": clean(self.mean),
            "std": clean(self.std),
        }


def combined(parts: list[LeafStats]) -> LeafStats:
    """The statistics of several arrays' values together (a folded subtree).

    Example:
        >>> a, b = LeafStats(2, 0, 0.0, 2.0, 1.0, 1.0), LeafStats(2, 1, 4.0, 6.0, 5.0, 1.0)
        >>> whole = combined([a, b])
        >>> (whole.count, whole.nan_count, whole.minimum, whole.maximum, whole.mean, whole.std)
        (4, 1, 0.0, 6.0, 3.0, 2.23606797749979)
    """
    counted = [part for part in parts if part.count]
    nans = sum(part.nan_count for part in parts)
    count = sum(part.count for part in counted)
    if not count:
        return LeafStats(count=0, nan_count=nans)
    mean = sum(part.mean * part.count for part in counted) / count
    m2 = sum(part.count * (part.std**2 + (part.mean - mean) ** 2) for part in counted)
    return LeafStats(
        count,
        nans,
        min(part.minimum for part in counted),
        max(part.maximum for part in counted),
        mean,
        math.sqrt(m2 / count),
    )


def leaf_stats(array: LazyArray, block_bytes: int = DEFAULT_BLOCK_BYTES) -> LeafStats:
    """Min, max, mean, std and NaN count of `array`, read block by block."""
    count, mean, m2 = 0, 0.0, 0.0
    minimum, maximum, nans = math.inf, -math.inf, 0
    for block in blocks(array, block_bytes):
        values = np.asarray(block, dtype=np.float64).reshape(-1)
        finite_mask = ~np.isnan(values)
        nans += int(values.size - finite_mask.sum())
        values = values[finite_mask]
        if values.size == 0:
            continue
        block_mean = float(values.mean())
        block_m2 = float(((values - block_mean) ** 2).sum())
        delta, total = block_mean - mean, count + values.size
        mean += delta * values.size / total
        m2 += block_m2 + delta * delta * count * values.size / total
        count = total
        minimum, maximum = min(minimum, float(values.min())), max(maximum, float(values.max()))
    if count == 0:
        return LeafStats(count=0, nan_count=nans)
    return LeafStats(count, nans, minimum, maximum, mean, math.sqrt(m2 / count))


@dataclass
class LeafDifference:
    """How two same-shaped arrays differ: the largest absolute and relative differences."""

    max_abs: float = 0.0
    max_rel: float = 0.0
    differing: int = 0  # elements outside the tolerance

    @property
    def equal(self) -> bool:
        return self.differing == 0


def leaf_difference(
    a: LazyArray,
    b: LazyArray,
    atol: float = 0.0,
    rtol: float = 0.0,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    ulp: int = 0,
) -> LeafDifference:
    """Compares `a` and `b` block by block (NaNs in the same places count as equal); an
    element is within the tolerance when it differs by at most ``atol + rtol * |b|``, or
    by at most `ulp` units in the last place of the coarser of the two dtypes."""
    result = LeafDifference()
    for left, right in zip(blocks(a, block_bytes), blocks(b, block_bytes), strict=True):
        if _same_bits(left, right):  # the common case, in one cheap pass
            continue
        x = np.asarray(left, dtype=np.float64)
        y = np.asarray(right, dtype=np.float64)
        same = (x == y) | (np.isnan(x) & np.isnan(y))  # equal infinities differ by 0, too
        with np.errstate(invalid="ignore"):
            difference = np.where(same, 0.0, np.abs(x - y))
        difference = np.where(np.isnan(difference), np.inf, difference)
        scale = np.maximum(np.abs(x), np.abs(y))
        with np.errstate(divide="ignore", invalid="ignore"):
            relative = np.where(difference == 0, 0.0, difference / scale)
        if difference.size:
            result.max_abs = max(result.max_abs, float(difference.max()))
            result.max_rel = max(result.max_rel, float(np.nan_to_num(relative, nan=np.inf).max()))
        # where b is NaN or infinite its relative allowance counts as zero, not NaN
        allowance = atol + (rtol * np.nan_to_num(np.abs(y), posinf=0.0) if rtol else 0.0)
        if ulp:
            unit = ulp_of(np.nan_to_num(scale, posinf=0.0), coarser(left.dtype, right.dtype))
            allowance = np.maximum(allowance, ulp * unit)
        result.differing += int((difference > allowance).sum())
    return result


def coarser(a: np.dtype, b: np.dtype) -> np.dtype:
    """Of two dtypes, the floating one with fewer mantissa bits (float32 for integers)."""
    floats = [d for d in (np.dtype(a), np.dtype(b)) if _finfo(d) is not None]
    if not floats:
        return np.dtype(np.float32)
    return min(floats, key=lambda d: _finfo(d).nmant)


def ulp_of(magnitude: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The unit in the last place of `dtype` at each `magnitude` (float64 values).

    Example:
        >>> ulp_of(np.array([1.0, 3.0, 0.0]), np.dtype(np.float32)).tolist()
        [1.1920928955078125e-07, 2.384185791015625e-07, 1.401298464324817e-45]
    """
    info = _finfo(dtype)
    tiny = float(info.smallest_normal)
    with np.errstate(divide="ignore"):
        exponent = np.floor(np.log2(np.maximum(magnitude, tiny)))
    return np.maximum(np.exp2(exponent) * float(info.eps), float(info.smallest_subnormal))


def _finfo(dtype: np.dtype) -> Any:
    import ml_dtypes  # installed with jax: bfloat16 and the 8-bit floats

    try:
        return ml_dtypes.finfo(dtype)
    except (TypeError, ValueError):
        return None


def _same_bits(left: np.ndarray, right: np.ndarray) -> bool:
    """Whether two blocks hold the same dtype and bytes (then they differ nowhere)."""
    if left.dtype != right.dtype or left.shape != right.shape:
        return False
    x, y = np.ascontiguousarray(left), np.ascontiguousarray(right)
    return bool(np.array_equal(x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)))
