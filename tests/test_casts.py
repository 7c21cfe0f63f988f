"""`cast_into` gives exactly ``astype``'s bits (ml_dtypes' rounding) for every input."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from suture._buffers import assign
from suture._casts import cast_into

BF16 = np.dtype(ml_dtypes.bfloat16)


def _expected(values: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return values.astype(BF16).view(np.uint16)


def _cast(values: np.ndarray) -> np.ndarray:
    out = np.empty(values.shape, BF16)
    cast_into(out, values)
    return out.view(np.uint16)


def test_every_float16_value_casts_as_ml_dtypes_does():
    values = np.arange(1 << 16, dtype=np.uint16).view(np.float16)  # zeros, subnormals, inf, NaN
    np.testing.assert_array_equal(_cast(values), _expected(values))


def test_float32_edge_cases_cast_as_ml_dtypes_does():
    patterns = [
        0x00000000,
        0x80000000,
        0x00000001,
        0x807FFFFF,
        0x00800000,  # zeros, subnormals, min
        0x3F808000,
        0x3F818000,
        0x3F807FFF,
        0x3F808001,  # ties to even, below and above a tie
        0x7F7FFFFF,
        0xFF7FFFFF,
        0x7F7F8000,  # rounding up to infinity
        0x7F800000,
        0xFF800000,
        0x7F800001,
        0xFF800001,
        0x7F80FFFF,  # infinities, NaN payloads
        0x7FC00000,
        0xFFFFFFFF,
        0x7FFFFFFF,
        0x7FBFFFFF,
    ]
    values = np.array(patterns * 300, np.uint32).view(np.float32)  # past the small-array path
    np.testing.assert_array_equal(_cast(values), _expected(values))


def test_random_float32_bit_patterns_cast_as_ml_dtypes_does():
    bits = np.random.default_rng(0).integers(0, 1 << 32, size=3 * (1 << 15) + 17, dtype=np.uint32)
    values = bits.view(np.float32).reshape(-1, 1)  # several tiles and a ragged last one
    np.testing.assert_array_equal(_cast(values), _expected(values))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_typical_weights_cast_as_ml_dtypes_does(dtype):
    values = (np.random.default_rng(1).standard_normal((300, 257)) * 0.02).astype(dtype)
    np.testing.assert_array_equal(_cast(values), _expected(values))


def test_other_dtypes_and_layouts_are_plain_copies():
    values = np.arange(20000, dtype=np.float64).reshape(100, 200)
    for out, source in [
        (np.empty((100, 200), BF16), values),  # float64: no fast path
        (np.empty((200, 100), BF16).T, values.astype(np.float32)),  # a transposed target
        (np.empty((100, 200), np.float32), values.astype(np.float16)),  # not to bfloat16
    ]:
        cast_into(out, source)
        np.testing.assert_array_equal(out, source.astype(out.dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_layer_of_a_stack_casts_in_place(dtype):
    """`out` whose rows lie apart (layer 1 of a (rows, layers, columns) stack)."""
    values = (np.random.default_rng(2).standard_normal((3, 70, 33000)) * 0.02).astype(dtype)
    stack = np.zeros((70, 3, 33000), BF16)
    cast_into(stack[:, 1], values[1])
    np.testing.assert_array_equal(stack[:, 1].view(np.uint16), _expected(values[1]))
    assert not stack[:, 0].view(np.uint16).any() and not stack[:, 2].view(np.uint16).any()
    deep = np.zeros((2, 35, 3, 500), BF16)  # more than two axes, the stack's on the third
    cast_into(deep[:, :, 2], values[0, :70, :500].copy().reshape(2, 35, 500))
    np.testing.assert_array_equal(
        deep[:, :, 2].view(np.uint16), _expected(values[0, :70, :500].copy().reshape(2, 35, 500))
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16])
def test_a_transposed_read_assigns_into_a_contiguous_target(dtype):
    """`assign` turns a transposed read around (a transposed target, tiled) before casting."""
    base = (np.random.default_rng(3).standard_normal((300, 40, 70)) * 0.02).astype(dtype)
    for values in (
        base[:, 0, :].T,  # too small for the tiles: numpy's copy
        base.transpose(2, 0, 1),  # (70, 300, 40): columns first once flattened
        base[::2].transpose(1, 0, 2),  # not a transpose of anything contiguous
        np.ascontiguousarray(base.reshape(300, -1)).T,  # (2800, 300)
    ):
        out = np.empty(values.shape, BF16)
        assign(out, values)
        np.testing.assert_array_equal(out.view(np.uint16), _expected(np.ascontiguousarray(values)))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_transposed_reads_into_a_stack_cast_with_the_fast_kernels(dtype, monkeypatch):
    """The dense route's query kernels: a transposed (H*D, E) projection into layer 1 of an
    (E, layers, H, D) stack, and a row slice of a transposed matrix (its columns lie apart);
    both bit for bit ml_dtypes, neither through its element-by-element cast."""
    import suture._casts

    def refused(out, values):
        raise AssertionError(f"element by element: {out.shape} {values.strides}")

    monkeypatch.setattr(suture._casts, "cast_elementwise", refused)
    rng = np.random.default_rng(4)
    projection = (rng.standard_normal((8 * 64, 512)) * 0.02).astype(dtype)  # (H*D, E)
    stack = np.zeros((512, 3, 8, 64), BF16)
    values = projection.T.reshape(512, 8, 64)  # the read: (E, H, D), columns first
    assign(stack[:, 1], values)
    np.testing.assert_array_equal(
        stack[:, 1].view(np.uint16), _expected(np.ascontiguousarray(values))
    )
    assert not stack[:, 0].view(np.uint16).any() and not stack[:, 2].view(np.uint16).any()

    wide = (rng.standard_normal((1024, 300)) * 0.02).astype(dtype)
    rows = wide.T[100:228]  # (128, 1024): a block of rows of the transposed read
    out = np.empty(rows.shape, BF16)
    assign(out, rows)
    np.testing.assert_array_equal(out.view(np.uint16), _expected(np.ascontiguousarray(rows)))


def test_a_transposed_target_off_its_lanes_copies_all_but_its_edges_in_lanes(monkeypatch):
    """A block of rows of a transposed bfloat16 result that starts between 8-byte lanes (a
    dequantized tile's rows, say): only the rows before the first lane and after the last
    go one by one, the rest in 64-bit lanes; every value lands where it belongs."""
    import suture._buffers as buffers

    one_by_one = []
    by_squares = buffers._copy_in_squares

    def counted(out, tile):
        one_by_one.append(out.shape[0])
        by_squares(out, tile)

    monkeypatch.setattr(buffers, "_copy_in_squares", counted)
    stored = np.zeros((300, 1000), BF16)  # (columns, rows): the target is its transpose
    tile = (np.random.default_rng(5).standard_normal((800, 300)) * 0.02).astype(BF16)
    target = stored.T[3:803]  # starts 6 bytes into a lane: one row before the next one
    buffers._transpose_into(target, tile)
    np.testing.assert_array_equal(stored.T[3:803].view(np.uint16), tile.view(np.uint16))
    assert not stored.T[:3].view(np.uint16).any() and not stored.T[803:].view(np.uint16).any()
    assert sum(one_by_one) == 1 + 3  # the head before the lane, the 3 rows after the last
