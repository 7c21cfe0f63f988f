"""suture._lazy.compute: computed nodes read the parts of their inputs that an output needs.

`ComputeNode` (products, elementwise functions, reductions, cumulative sums) and
`BroadcastNode` are checked against numpy for selections drawn by hypothesis. Over a real
safetensors file, `count_bytes_read` shows which part of each input a read takes: a
followed axis is read as selected, a contracted or reduced one whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

import suture
from suture._errors import ShapeMismatchError
from suture._iostats import count_bytes_read
from suture._lazy.compute import BroadcastNode, ComputeNode
from suture._lazy.graph import MemorySource, Node
from suture._lazy.selection import full, outer_index, selection_shape

FAST = settings(max_examples=60, deadline=None)
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
RNG = np.random.default_rng(0)
A = RNG.standard_normal((6, 4)).astype(np.float32)
B = RNG.standard_normal((4, 5)).astype(np.float32)
BATCH = RNG.standard_normal((3, 6, 4)).astype(np.float32)
ROW = RNG.standard_normal((1, 4)).astype(np.float32)


def cases() -> dict[str, tuple[Callable[[], Node], np.ndarray]]:
    a, b, batch, row = (MemorySource(x) for x in (A, B, BATCH, ROW))
    return {
        "matmul": (
            lambda: ComputeNode(np.matmul, [a, b], [(0, None), (None, 1)], (6, 5), F32, "matmul"),
            A @ B,
        ),
        "batched-einsum": (
            lambda: ComputeNode(
                lambda x, y: np.einsum("bij,jk->bik", x, y),
                [batch, b],
                [(0, 1, None), (None, 2)],
                (3, 6, 5),
                F32,
                "einsum",
            ),
            np.einsum("bij,jk->bik", BATCH, B),
        ),
        "add-broadcast-row": (  # row has length 1 on axis 0: read whole, broadcast by numpy
            lambda: ComputeNode(np.add, [a, row], [(0, 1), (0, 1)], (6, 4), F32, "add"),
            A + ROW,
        ),
        "sum-axis-1": (
            lambda: ComputeNode(lambda x: x.sum(1), [batch], [(0, None, 1)], (3, 4), F32, "sum"),
            BATCH.sum(1),
        ),
        "cumsum-axis-0": (  # output axis 0 follows no input: computed whole, then selected
            lambda: ComputeNode(lambda x: np.cumsum(x, 0), [a], [(None, 1)], (6, 4), F32, "cumsum"),
            np.cumsum(A, 0),
        ),
        "float64-result-cast": (
            lambda: ComputeNode(
                lambda x: x.astype(np.float64) * 3, [a], [(0, 1)], (6, 4), F32, "triple"
            ),
            (A.astype(np.float64) * 3).astype(np.float32),
        ),
        "broadcast": (
            lambda: BroadcastNode(row, (3, 2, 4), (1, 2)),
            np.broadcast_to(ROW, (3, 2, 4)),
        ),
        "broadcast-new-inner-axis": (
            lambda: BroadcastNode(a, (6, 3, 4), (0, 2)),
            np.broadcast_to(A[:, None, :], (6, 3, 4)),
        ),
    }


CASES = cases()


@st.composite
def selections(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[Any, ...]:
    chosen: list[Any] = []
    for length in shape:
        if draw(st.booleans()):
            picks = draw(st.lists(st.integers(0, length - 1), max_size=5))
            chosen.append(np.asarray(picks, dtype=np.int64))
        else:
            start = draw(st.none() | st.integers(-length, length))
            step = draw(st.sampled_from([None, 1, 2, -1]))
            chosen.append(range(length)[slice(start, None, step)])
    return tuple(chosen)


@FAST
@given(st.sampled_from(sorted(CASES)), st.data())
def test_read_equals_numpy_on_the_selection(name: str, data: st.DataObject) -> None:
    build, expected = CASES[name]
    node = build()
    assert node.shape == expected.shape and node.dtype == expected.dtype
    selection = data.draw(selections(node.shape))
    result = node.read(selection)
    assert result.shape == selection_shape(selection) and result.dtype == node.dtype
    np.testing.assert_allclose(result, outer_index(expected, selection), rtol=1e-5, atol=1e-6)
    out = np.empty(selection_shape(selection), np.float64)
    node.read_into(selection, out)
    np.testing.assert_allclose(out, result, rtol=1e-6)


def test_a_function_that_returns_the_wrong_shape_is_named() -> None:
    a = MemorySource(A)
    node = ComputeNode(lambda x: x[:, :2], [a], [(0, 1)], (6, 4), F32, "crop")
    with pytest.raises(
        ShapeMismatchError, match=r"crop returned shape \(2, 2\) for a read that expects \(2, 4\)"
    ):
        node.read((range(2), range(4)))
    with pytest.raises(ShapeMismatchError, match=r"crop returned shape \(6, 2\)"):
        node.read(full(node.shape))


def test_the_docstring_product_reads_a_row() -> None:
    a = MemorySource(np.arange(6.0).reshape(3, 2))
    b = MemorySource(np.ones((2, 4)))
    product = ComputeNode(np.matmul, [a, b], [(0, None), (None, 1)], (3, 4), F64, "matmul")
    assert product.inputs() == (a, b)
    assert product.read((range(1, 2), range(4))).tolist() == [[5.0] * 4]


def test_working_bytes_counts_followed_inputs_by_the_share_of_the_output() -> None:
    a, b = MemorySource(A), MemorySource(B)
    product = ComputeNode(np.matmul, [a, b], [(0, None), (None, 1)], (6, 5), F32, "matmul")
    whole = A.nbytes + B.nbytes + 6 * 5 * 4
    assert product.working_bytes(6 * 5 * 4) == whole
    # a third of the rows: a third of `a` (its rows follow the output's), all of `b`
    assert product.working_bytes(2 * 5 * 4) == 2 * 5 * 4 + A.nbytes // 3 + B.nbytes
    # a sum over rows: the output's rows are the input's columns, a share of them
    total = ComputeNode(lambda x: x.sum(0), [a], [(None, 0)], (4,), F32, "sum")
    assert total.working_bytes(8) == 8 + A.nbytes // 2
    # a cumulative sum along rows: no input axis follows the output's rows, input whole
    running = ComputeNode(lambda x: np.cumsum(x, 0), [a], [(None, 1)], (6, 4), F32, "cumsum")
    assert running.working_bytes(2 * 4 * 4) == 2 * 4 * 4 + A.nbytes


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("compute") / "model.safetensors"
    save_file({"a": A, "b": B, "batch": BATCH, "row": ROW}, str(path))
    return suture.open(path)


def test_a_block_of_product_rows_reads_those_rows_and_all_of_the_other_input(ckpt: Any) -> None:
    a, b = ckpt["a"].node, ckpt["b"].node
    product = ComputeNode(np.matmul, [a, b], [(0, None), (None, 1)], (6, 5), F32, "matmul")
    with count_bytes_read() as counted:
        rows = product.read((range(2, 4), range(5)))
    np.testing.assert_allclose(rows, (A @ B)[2:4], rtol=1e-5)
    assert counted.bytes == 2 * 4 * 4 + B.nbytes
    with count_bytes_read() as columns:
        product.read((range(6), range(1, 2)))
    assert columns.bytes == A.nbytes + B.nbytes  # b's column spans all of its rows


def test_a_reduction_reads_the_selected_batch_whole_along_the_reduced_axis(ckpt: Any) -> None:
    batch = ckpt["batch"].node
    total = ComputeNode(lambda x: x.sum(1), [batch], [(0, None, 1)], (3, 4), F32, "sum")
    with count_bytes_read() as counted:
        middle = total.read((range(1, 2), range(4)))
    np.testing.assert_allclose(middle, BATCH.sum(1)[1:2], rtol=1e-5)
    assert counted.bytes == BATCH[1].nbytes


def test_a_broadcast_reads_its_base_once(ckpt: Any) -> None:
    node = BroadcastNode(ckpt["row"].node, (1000, 3, 4), (1, 2))
    with count_bytes_read() as counted:
        values = node.read(full(node.shape))
    assert counted.bytes == ROW.nbytes
    np.testing.assert_array_equal(values, np.broadcast_to(ROW, (1000, 3, 4)))
    inner = BroadcastNode(ckpt["a"].node, (6, 50, 4), (0, 2))
    with count_bytes_read() as rows:
        part = inner.read((range(3, 5), range(50), range(4)))
    assert rows.bytes == 2 * 4 * 4  # the selected rows of the base, once
    np.testing.assert_array_equal(part, np.broadcast_to(A[3:5, None], (2, 50, 4)))
