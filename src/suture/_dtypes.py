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
