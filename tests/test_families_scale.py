"""A table's scale operation on 16-bit weights is looked up in its own results for every bit
pattern: the same bits as computing it, for every float16 and bfloat16 value."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from suture._lazy.array import as_lazy
from suture.families._ops import Scale


def computed(values: np.ndarray, op: str, factor: float) -> np.ndarray:
    wide = values.astype(np.float32)
    with np.errstate(all="ignore"):
        wide = wide * np.float32(factor) if op == "multiply" else wide / np.float32(factor)
        return wide.astype(values.dtype)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize(("op", "factor"), [("multiply", 128**-0.5), ("divide", math.sqrt(3072))])
def test_scaling_every_16_bit_value_gives_the_computed_bits(dtype, op, factor) -> None:
    every = np.arange(1 << 16, dtype=np.uint16).view(dtype).reshape(256, 256)
    scale = Scale(op, factor, "divide" if op == "multiply" else "multiply", factor)
    with np.errstate(all="ignore"):
        looked_up = scale.forward(as_lazy(every, path="q"), {}).read()
        small = scale.forward(as_lazy(every[:2], path="q"), {}).read()  # below the table's size
    assert looked_up.dtype == np.dtype(dtype)
    expected = computed(every, op, factor)
    np.testing.assert_array_equal(looked_up.view(np.uint16), expected.view(np.uint16))
    np.testing.assert_array_equal(small.view(np.uint16), expected[:2].view(np.uint16))
