"""A table's scale operation on 16-bit weights is looked up in its own results for every bit
pattern: the same bits as computing it, for every float16 and bfloat16 value, in any order
and through a strided view; and a value that overflows still says so."""

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


def scale_of(op: str, factor: float) -> Scale:
    return Scale(op, factor, "divide" if op == "multiply" else "multiply", factor)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize(("op", "factor"), [("multiply", 128**-0.5), ("divide", math.sqrt(3072))])
def test_scaling_every_16_bit_value_gives_the_computed_bits(dtype, op, factor) -> None:
    every = np.arange(1 << 16, dtype=np.uint16)
    shuffled = np.random.default_rng(0).permutation(np.concatenate([every, every]))
    values = shuffled.view(dtype).reshape(512, 256)
    scale = scale_of(op, factor)
    with np.errstate(all="ignore"):  # scaling NaN and infinities says nothing either way
        looked_up = scale.forward(as_lazy(values, path="q"), {}).read()
        strided = scale.forward(as_lazy(values[:, ::3], path="q"), {}).read()
        small = scale.forward(as_lazy(values[:2], path="q"), {}).read()  # below the table's size
    expected = computed(values, op, factor)
    assert looked_up.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(looked_up.view(np.uint16), expected.view(np.uint16))
    np.testing.assert_array_equal(strided.view(np.uint16), expected[:, ::3].view(np.uint16))
    np.testing.assert_array_equal(small.view(np.uint16), expected[:2].view(np.uint16))


def test_a_scaled_value_that_overflows_float16_still_warns_in_a_large_block() -> None:
    weights = np.full((256, 512), 0.01, np.float16)
    weights[7, 9] = 60000.0  # times sqrt(3072) is past float16's largest value
    scale = scale_of("multiply", math.sqrt(3072))
    with pytest.warns(RuntimeWarning, match="overflow"):
        scaled = scale.forward(as_lazy(weights, path="q"), {}).read()
    assert np.isinf(scaled[7, 9]) and np.isfinite(np.delete(scaled.reshape(-1), 7 * 512 + 9)).all()
    weights[7, 9] = 1000.0  # the same block without the overflow: looked up, and quiet
    np.testing.assert_array_equal(
        scale.forward(as_lazy(weights, path="q"), {}).read(),
        computed(weights, "multiply", math.sqrt(3072)),
    )
