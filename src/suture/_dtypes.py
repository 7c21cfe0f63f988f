"""dtype names <-> numpy dtypes, including the ml_dtypes family (bfloat16, float8, int4).

Example:
    >>> to_dtype("bfloat16").name
    'bfloat16'
    >>> to_dtype("<f4").name
    'float32'
    >>> to_dtype("bf16").name
    'bfloat16'
"""

from __future__ import annotations

import functools
from typing import Any

import ml_dtypes
import numpy as np

from ._errors import ArgumentError

# Short names people type (PyTorch's and mergekit's among them), for the names numpy knows.
ALIASES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "f16": "float16",
    "fp32": "float32",
    "f32": "float32",
    "fp64": "float64",
    "f64": "float64",
}


def to_dtype(spec: Any) -> np.dtype:
    """A numpy dtype from a dtype, a scalar type, or a name such as ``"bfloat16"`` or ``"<f4"``.

    Raises:
        ArgumentError: when the name is not a dtype numpy or ml_dtypes knows.
    """
    if isinstance(spec, np.dtype):
        return spec
    if isinstance(spec, str):
        spec = ALIASES.get(spec.lower(), spec)
        extended = getattr(ml_dtypes, spec, None)
        if extended is not None and isinstance(extended, type):
            return np.dtype(extended)
    try:
        return np.dtype(spec)
    except TypeError as error:
        raise ArgumentError(
            f"Unknown dtype {spec!r}: expected a numpy or ml_dtypes name such as 'float32', "
            f"'bfloat16' or 'int8' (or bf16, fp16, fp32)."
        ) from error


@functools.lru_cache(maxsize=256)
def from_zarr(name: str) -> np.dtype:
    """The numpy dtype of a zarr v2 ``dtype`` (``"<f4"``, ``"bfloat16"``) or v3 ``data_type``."""
    if name == "bool":
        return np.dtype(bool)
    return to_dtype(name.lstrip("<>|=") if name.lstrip("<>|=") in _EXTENDED_NAMES else name)


_EXTENDED_NAMES = frozenset(
    name
    for name in dir(ml_dtypes)
    if isinstance(getattr(ml_dtypes, name), type) and not name.startswith("_")
)


def _kind(dtype: np.dtype) -> str | None:
    """'b', 'i', 'u', 'f' or 'c' (ml_dtypes' bfloat16, float8 and int4 included), else None."""
    if dtype.kind in "biufc":
        return dtype.kind
    try:
        ml_dtypes.finfo(dtype)
        return "f"
    except (ValueError, TypeError):
        pass
    try:
        return "i" if ml_dtypes.iinfo(dtype).min < 0 else "u"
    except (ValueError, TypeError):
        return None


def inexact(dtype: np.dtype) -> bool:
    """Whether `dtype` is a float (ml_dtypes' included) or complex dtype."""
    return _kind(dtype) in ("f", "c")


def _real(dtype: np.dtype) -> np.dtype:
    """The dtype of a complex dtype's parts (the dtype itself otherwise)."""
    return np.empty(0, dtype).real.dtype if dtype.kind == "c" else dtype


def _range(dtype: np.dtype) -> str:
    info = ml_dtypes.iinfo(dtype)
    return f"{info.min}..{info.max}"


def cast_loss(source: Any, target: Any) -> str | None:
    """What casting `source` values to `target` can destroy, beyond a float's rounding; None
    when every value survives up to rounding.

    Precision-only narrowing of floats (float32 -> bfloat16, to the nearest representable
    value) is None: it is the usual cast of weights. Flagged are the casts that wrap,
    truncate, overflow to inf (or NaN, or saturate), drop an imaginary part, or round an
    integer: float -> int or bool, int -> a narrower or differently signed int, int -> a
    float that cannot hold every integer, float -> a float of smaller largest value
    (float32 -> float16, float16 -> float8_e5m2), float -> a float without inf, NaN,
    negative values or zero (float8_e4m3fn, float4_e2m1fn, float8_e8m0fnu), complex -> real.

    Example:
        >>> cast_loss("float32", "int8")
        'fractions are cut, and values outside -128..127, NaN and inf become other numbers'
        >>> cast_loss("float32", "bfloat16") is None
        True
        >>> cast_loss("float32", "float16")
        'values beyond ±65504 become inf'
        >>> cast_loss("float16", "float8_e5m2")
        'values beyond ±57344 become inf'
    """
    source, target = to_dtype(source), to_dtype(target)
    have, want = _kind(source), _kind(target)
    if source == target or None in (have, want) or have == "b":
        return None
    if want == "b":
        return "every nonzero value becomes True"
    if have == "c" and want != "c":
        lost = cast_loss(_real(source), target)
        return "the imaginary part is dropped" + (f", and {lost}" if lost else "")
    if want in "iu":
        return _loss_to_int(source, target, have)
    if have in "iu":
        return _loss_int_to_float(source, _real(target))
    return _loss_float_to_float(_real(source), _real(target))


def _loss_to_int(source: np.dtype, target: np.dtype, have: str) -> str | None:
    if have in "fc":
        return (
            f"fractions are cut, and values outside {_range(target)}, NaN and inf become "
            f"other numbers"
        )
    low, high = ml_dtypes.iinfo(source), ml_dtypes.iinfo(target)
    if low.min < high.min or low.max > high.max:
        return f"values outside {_range(target)} wrap around"
    return None


def _loss_int_to_float(source: np.dtype, target: np.dtype) -> str | None:
    parts = ml_dtypes.finfo(target)
    info = ml_dtypes.iinfo(source)
    largest = max(-int(info.min), int(info.max))
    lost = []
    if largest > float(parts.max):
        lost.append(f"integers beyond ±{float(parts.max):g} {_overflow(parts)}")
    if largest > 2 ** (parts.nmant + 1):
        lost.append(f"integers above 2**{parts.nmant + 1} are rounded")
    lost += _unheld(target, ("negatives", "zero") if info.min < 0 else ("zero",))
    return _joined(lost)


# float32 -> bfloat16 keeps float32's exponent range and is the documented rounding-only cast
# of weights, although float32's top 0.2% (above 3.3962e38) becomes inf.
_ROUNDING_ONLY = {("float32", "bfloat16")}


def _loss_float_to_float(source: np.dtype, target: np.dtype) -> str | None:
    """Values beyond the target's largest, and inf, NaN, negatives or zero it lacks."""
    if (source.name, target.name) in _ROUNDING_ONLY:
        return None
    parts = ml_dtypes.finfo(target)
    lost = []
    if float(ml_dtypes.finfo(source).max) > float(parts.max):
        lost.append(f"values beyond ±{float(parts.max):g} {_overflow(parts)}")
    lost += _unheld(target, _holds(source, *_PROBES))
    return _joined(lost)


_PROBES = {"inf": "inf", "nan": "nan", "negatives": "-1", "zero": "0"}
_NAMES = {"inf": "inf becomes", "nan": "NaN becomes", "negatives": "negative values become",
          "zero": "zero becomes"}  # fmt: skip


def _holds(dtype: np.dtype, *kinds: str) -> tuple[str, ...]:
    """Which of `kinds` ("inf", "nan", "negatives", "zero") `dtype` can hold."""
    return tuple(kind for kind in kinds if kind in _held(dtype))


@functools.lru_cache(maxsize=64)
def _held(dtype: np.dtype) -> frozenset[str]:
    return frozenset(kind for kind, probe in _PROBES.items() if _becomes(dtype, probe) == probe)


def _becomes(dtype: np.dtype, value: str) -> str:
    """What float32 `value` ("inf", "nan", "-1", "0") becomes in `dtype`, as text."""
    with np.errstate(over="ignore", invalid="ignore"):
        cast = float(np.asarray(float(value), np.float32).astype(dtype).astype(np.float32))
    return "nan" if np.isnan(cast) else "inf" if np.isinf(cast) else f"{cast:g}"


def _unheld(target: np.dtype, kinds: tuple[str, ...]) -> list[str]:
    """A clause for each of `kinds` (the source's inf, NaN ...) that `target` lacks."""
    clauses = []
    for kind in kinds:
        if not _holds(target, kind):
            became = _becomes(target, _PROBES[kind]).replace("nan", "NaN")
            if kind == "inf" and became != "NaN":
                became = f"±{became}"  # saturated: -inf becomes the negative largest
            clauses.append(f"{_NAMES[kind]} {became}")
    return clauses


def _joined(clauses: list[str]) -> str | None:
    if len(clauses) < 2:
        return clauses[0] if clauses else None
    return ", ".join(clauses[:-1]) + f", and {clauses[-1]}"


def _overflow(info: Any) -> str:
    """What a value too large for a float type becomes: inf, NaN (float8_e4m3fn), or its max."""
    with np.errstate(over="ignore", invalid="ignore"):
        large = np.asarray([np.finfo(np.float64).max]).astype(info.dtype)
    if np.isinf(large[0]):
        return "become inf"
    return "become NaN" if np.isnan(large[0]) else f"are clamped to ±{float(info.max):g}"


def cast_changes(values: np.ndarray, cast: np.ndarray) -> np.ndarray:
    """Where `cast` (``values`` cast as `cast_loss` describes) lost more than rounding.

    To a float (or complex) from a float: a finite value that became inf or NaN, or went
    beyond the target's largest value (clamped), and an inf or NaN that became anything
    else (NaN -> -0.0 in float4_e2m1fn, inf -> NaN in float8_e4m3fn); from complex to real,
    a nonzero imaginary part too. Otherwise (to an int or bool, or from an int) the cast
    must give the value back exactly.

    Example:
        >>> values = np.array([1.0, 300.0, 2.5], np.float32)
        >>> cast_changes(values, values.astype(np.int8)).tolist()
        [False, True, True]
        >>> values = np.array([1.0, np.nan, np.inf], np.float32)
        >>> cast_changes(values, values.astype(ml_dtypes.float8_e4m3fn)).tolist()
        [False, False, True]
    """
    have, want = _kind(values.dtype), _kind(cast.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        if have in ("f", "c") and want in ("f", "c"):
            largest = ml_dtypes.finfo(_real(cast.dtype)).max
            lost = np.zeros(values.shape, bool)
            parts = [(values.real, cast.real)]
            if want == "c":
                parts.append((values.imag, cast.imag))
            elif have == "c":
                lost |= values.imag != 0
            for value, result in parts:
                lost |= _float_changes(value, result, largest)
            return lost
        back = cast.astype(values.dtype)
        return ~((back == values) | (np.isnan(values) & np.isnan(back) if have in "fc" else False))


def _float_changes(value: np.ndarray, result: np.ndarray, largest: Any) -> np.ndarray:
    """Float `value` cast to float `result`: a finite value gone beyond `largest` (or to inf
    or NaN), or an inf or NaN that did not stay itself."""
    finite = np.isfinite(value)
    limit = np.asarray(float(largest)).astype(value.dtype)
    lost = finite & (~np.isfinite(result) | (np.abs(value) > limit))
    special = ~finite
    if special.any():  # compared in float64: ml_dtypes casts between some float8s not at all
        was, now = value[special].astype(np.float64), result[special].astype(np.float64)
        lost[special] = ~((np.isnan(was) & np.isnan(now)) | (was == now))
    return lost
