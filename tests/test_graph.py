"""suture._lazy.graph: each node reads exactly the selected elements, and only those.

Every node type is checked against numpy on the same data, for selections drawn by
hypothesis: ``read`` gives the selected elements (shape and dtype), ``read_into`` writes
the same values into fresh, strided and differently typed outputs. Over a real safetensors
file (written with the safetensors library), `count_bytes_read` shows that a view reads the
rows it shows and no more.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

import suture
from suture._errors import ShapeMismatchError, SurgeryError
from suture._iostats import count_bytes_read
from suture._lazy.compute import MapNode
from suture._lazy.graph import MemorySource, Node, open_all, source_nodes
from suture._lazy.joins import ConcatNode, PadNode, StackNode
from suture._lazy.selection import full, outer_index, parse_index, selection_shape
from suture._lazy.views import CastNode, IndexNode, ReshapeNode, TransposeNode
from tests.orbax_writers import save_standard

FAST = settings(max_examples=60, deadline=None)
F32 = np.dtype(np.float32)


def values(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def index_node(base: Node, index: Any) -> IndexNode:
    parsed = parse_index(index, base.shape)
    return IndexNode(base, parsed.selection, parsed.dropped_axes, parsed.new_axes, parsed.shape)


A, B, C = values((6, 4, 3), 0), values((6, 4, 3), 1), values((2, 4, 3), 2)


def cases() -> dict[str, tuple[Callable[[], Node], np.ndarray]]:
    """Each node type (some in two shapes), built on in-memory sources, and numpy's result."""
    a, b, c = MemorySource(A), MemorySource(B), MemorySource(C)
    return {
        "memory": (lambda: a, A),
        "index": (lambda: index_node(a, (slice(1, None, 2), 2)), A[1::2, 2]),
        "index-new-axes": (
            lambda: index_node(a, (None, [4, 0, 4], None)),
            A[None, [4, 0, 4], None],
        ),
        "index-reversed": (
            lambda: index_node(a, (slice(None, None, -1), slice(3, 0, -2))),
            A[::-1, 3:0:-2],
        ),
        "cast": (lambda: CastNode(a, np.dtype(np.float16)), A.astype(np.float16)),
        "cast-int": (lambda: CastNode(a, np.dtype(np.int32)), A.astype(np.int32)),
        "transpose": (lambda: TransposeNode(a, (2, 0, 1)), A.transpose(2, 0, 1)),
        "reshape-kept": (lambda: ReshapeNode(a, (6, 12)), A.reshape(6, 12)),
        "reshape-split": (lambda: ReshapeNode(a, (6, 2, 2, 3)), A.reshape(6, 2, 2, 3)),
        "reshape-flat": (lambda: ReshapeNode(a, (12, 6)), A.reshape(12, 6)),
        "stack": (lambda: StackNode([a, b, a], 1, F32), np.stack([A, B, A], axis=1)),
        "stack-promoted": (
            lambda: StackNode([CastNode(a, np.dtype(np.float16)), b], 0, F32),
            np.stack([A.astype(np.float16).astype(np.float32), B]),
        ),
        "concat": (lambda: ConcatNode([a, c, b], 0, F32), np.concatenate([A, C, B])),
        "concat-inner": (lambda: ConcatNode([a, b], 2, F32), np.concatenate([A, B], axis=2)),
        "pad": (lambda: PadNode(c, (4, 5, 3)), np.pad(C, ((0, 2), (0, 1), (0, 0)))),
        "map-elementwise": (
            lambda: MapNode(np.add, [a, b], A.shape, F32, True, "add"),
            A + B,
        ),
        "map-whole": (
            lambda: MapNode(lambda x: x - x.mean(0), [a], A.shape, F32, False, "center"),
            A - A.mean(0),
        ),
    }


CASES = cases()


@st.composite
def selections(draw: st.DrawFn, shape: tuple[int, ...]) -> tuple[Any, ...]:
    chosen: list[Any] = []
    for length in shape:
        if length and draw(st.booleans()):
            picks = draw(st.lists(st.integers(0, length - 1), max_size=5))
            chosen.append(np.asarray(picks, dtype=np.int64))
        else:
            start = draw(st.none() | st.integers(-length - 1, length + 1))
            stop = draw(st.none() | st.integers(-length - 1, length + 1))
            step = draw(st.sampled_from([None, 1, 2, -1, -3]))
            chosen.append(range(length)[slice(start, stop, step)])
    return tuple(chosen)


@FAST
@given(st.sampled_from(sorted(CASES)), st.data())
def test_read_gives_exactly_the_selected_elements(name: str, data: st.DataObject) -> None:
    build, expected = CASES[name]
    node = build()
    assert node.shape == expected.shape and node.dtype == expected.dtype
    selection = data.draw(selections(node.shape))
    result = node.read(selection)
    assert result.shape == selection_shape(selection)
    assert result.dtype == node.dtype
    np.testing.assert_array_equal(result, outer_index(expected, selection))


@FAST
@given(st.sampled_from(sorted(CASES)), st.data())
def test_read_into_matches_read(name: str, data: st.DataObject) -> None:
    node = CASES[name][0]()
    selection = data.draw(selections(node.shape))
    shape = selection_shape(selection)
    expected = node.read(selection)
    fresh = np.empty(shape, node.dtype)
    node.read_into(selection, fresh)
    np.testing.assert_array_equal(fresh, expected)
    # a transposed (strided) output, and one every other row of a larger array
    reversed_axes = tuple(range(len(shape)))[::-1]
    transposed = np.empty(shape[::-1], node.dtype).transpose(reversed_axes)
    node.read_into(selection, transposed)
    np.testing.assert_array_equal(transposed, expected)
    if shape:
        larger = np.full((2 * shape[0], *shape[1:]), -7, node.dtype)
        node.read_into(selection, larger[::2])
        np.testing.assert_array_equal(larger[::2], expected)
        assert (larger[1::2] == -7).all()
    # another dtype: cast as it is written, as numpy's astype casts the read
    wider = np.empty(shape, np.float64)
    node.read_into(selection, wider)
    np.testing.assert_array_equal(wider, expected.astype(np.float64))


@pytest.mark.parametrize(
    "out",
    [
        lambda: np.full((12, 2, 2, 3), np.nan, np.float32)[::2],  # rows with gaps
        lambda: np.full((3, 2, 2, 6), np.nan, np.float32).transpose(3, 1, 2, 0),  # no view
        lambda: np.full((6, 2, 2, 6), np.nan, np.float32)[..., 1::2],  # strided innermost
        lambda: np.full((6, 2, 2, 3), np.nan, np.float64),  # another dtype
    ],
    ids=["row-gaps", "transposed", "strided-inner", "float64"],
)
def test_reshape_read_into_a_non_contiguous_output(out: Callable[[], np.ndarray]) -> None:
    node = ReshapeNode(MemorySource(A), (6, 2, 2, 3))
    target = out()
    parent = target.base if target.base is not None else target
    node.read_into(full(node.shape), target)
    np.testing.assert_array_equal(target, A.reshape(6, 2, 2, 3).astype(target.dtype))
    # nothing outside the view was written
    assert np.isnan(parent).sum() == parent.size - target.size
    rows = (range(1, 5, 3), range(2), range(2), range(3))
    part = np.full((4, 2, 2, 3), np.nan, np.float32)[::2]
    node.read_into(rows, part)
    np.testing.assert_array_equal(part, A.reshape(6, 2, 2, 3)[1:5:3])


def test_reshape_read_into_a_partial_trailing_selection() -> None:
    node = ReshapeNode(MemorySource(A), (6, 12))
    selection = (range(0, 6, 2), np.asarray([11, 0, 5]))
    out = np.empty((3, 3), np.float32)
    node.read_into(selection, out)
    np.testing.assert_array_equal(out, A.reshape(6, 12)[::2][:, [11, 0, 5]])


def test_memory_source_reads_copies_of_what_it_holds() -> None:
    held = np.arange(6, dtype=np.int16).reshape(2, 3)
    source = MemorySource(held, path="w", origin="memory")
    assert (source.shape, source.dtype, source.path, source.origin) == (
        (2, 3),
        np.dtype(np.int16),
        "w",
        "memory",
    )
    assert source.inputs() == ()
    result = source.read(full(source.shape))
    result[...] = 0  # the caller owns what it reads
    np.testing.assert_array_equal(source.read((range(1, 2), range(3))), [[3, 4, 5]])
    from_jax = MemorySource(jnp.arange(6.0).reshape(3, 2))
    assert from_jax.shape == (3, 2) and from_jax.dtype == np.float32
    np.testing.assert_array_equal(from_jax.read((np.asarray([2, 0]), range(1, 2))), [[5.0], [1.0]])
    scalar = MemorySource(np.float64(2.5))
    assert scalar.shape == () and scalar.read(()).item() == 2.5


def test_map_node_checks_what_the_function_returns() -> None:
    a = MemorySource(A)
    wrong_shape = MapNode(lambda x: x[:2], [a], A.shape, F32, True, "crop")
    with pytest.raises(ShapeMismatchError, match=r"suture.map\(crop\) returned shape \(2, 4, 3\)"):
        wrong_shape.read(full(A.shape))
    wrong_dtype = MapNode(
        lambda x: x.astype(np.complex64), [a], A.shape, np.dtype(np.int8), True, "c"
    )
    with pytest.raises(SurgeryError, match=r"returned dtype complex64, expected int8"):
        wrong_dtype.read(full(A.shape))
    narrowed = MapNode(lambda x: x.astype(np.float64), [a], A.shape, F32, True, "wide")
    assert narrowed.read(full(A.shape)).dtype == np.float32  # same kind: cast back


def test_source_nodes_are_distinct_and_in_first_use_order() -> None:
    a, b, c = MemorySource(A), MemorySource(B), MemorySource(C)
    node = ConcatNode([StackNode([b, a], 0, F32), StackNode([a, CastNode(b, F32)], 0, F32)], 0, F32)
    assert source_nodes(node) == [b, a]
    mapped = MapNode(np.add, [TransposeNode(c, (1, 0, 2)), c], (4, 2, 3), F32, False, "f")
    assert source_nodes(mapped) == [c]
    assert source_nodes(a) == [a]


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, np.ndarray], Any]:
    """Four (8, 16) float32 tensors in a real safetensors file: a row is 64 bytes."""
    path = tmp_path_factory.mktemp("graph") / "model.safetensors"
    tensors = {f"w{i}": values((8, 16), 10 + i) for i in range(4)}
    save_file(tensors, str(path))
    return tensors, suture.open(path)


ROW = 16 * 4


@pytest.mark.parametrize(
    ("build", "expected", "rows_read"),
    [
        (lambda s: s["w0"][2:5], lambda t: t["w0"][2:5], 3),
        (lambda s: s["w0"].T[:, 2:5], lambda t: t["w0"].T[:, 2:5], 3),
        (
            lambda s: s["w0"][6].astype("bfloat16").astype("float32"),
            lambda t: t["w0"][6].astype(ml_dtypes.bfloat16).astype(np.float32),
            1,
        ),
        (
            lambda s: suture.stack([s[f"w{i}"] for i in range(4)])[1:3],
            lambda t: np.stack([t[f"w{i}"] for i in range(4)])[1:3],
            16,
        ),
        (
            lambda s: suture.stack([s["w0"], s["w1"]], axis=1)[3],
            lambda t: np.stack([t["w0"], t["w1"]], axis=1)[3],
            2,
        ),
        (
            lambda s: suture.concatenate([s["w0"], s["w1"]])[6:10],
            lambda t: np.concatenate([t["w0"], t["w1"]])[6:10],
            4,
        ),
        (lambda s: s["w2"].reshape(8, 4, 4)[1:3], lambda t: t["w2"].reshape(8, 4, 4)[1:3], 2),
        (lambda s: (s["w1"] * 2 + s["w3"])[5], lambda t: (t["w1"] * 2 + t["w3"])[5], 2),
        (
            lambda s: suture.map(jnp.tanh, s["w3"], elementwise=True)[::4],
            lambda t: np.tanh(t["w3"][::4]),
            5,
        ),  # one ranged read of the span: rows 0 to 4
        (lambda s: s["w0"][:0], lambda t: t["w0"][:0], 0),
    ],
    ids=[
        "rows",
        "transposed-columns",
        "cast",
        "stack",
        "stack-axis-1",
        "concat",
        "reshape",
        "arithmetic",
        "elementwise-map",
        "nothing",
    ],
)
def test_a_view_of_a_file_reads_only_the_rows_it_shows(
    stored: tuple[dict[str, np.ndarray], Any],
    build: Callable[[Any], Any],
    expected: Callable[[dict], np.ndarray],
    rows_read: int,
) -> None:
    tensors, ckpt = stored
    view = build(ckpt)
    with count_bytes_read() as counted:
        result = view.read()
    np.testing.assert_allclose(result, expected(tensors), rtol=1e-6)
    assert counted.bytes == rows_read * ROW


def test_padding_reads_only_the_part_inside_the_source(
    stored: tuple[dict[str, np.ndarray], Any],
) -> None:
    tensors, ckpt = stored
    node = PadNode(ckpt["w1"].node, (10, 16))
    with count_bytes_read() as outside:
        zeros = node.read((range(8, 10), range(16)))
    assert outside.bytes == 0 and not zeros.any()
    with count_bytes_read() as straddling:
        part = node.read((range(7, 10), range(16)))
    assert straddling.bytes == ROW
    np.testing.assert_array_equal(part, np.pad(tensors["w1"], ((0, 2), (0, 0)))[7:10])


def test_a_map_of_whole_arrays_reads_its_input_whole(
    stored: tuple[dict[str, np.ndarray], Any],
) -> None:
    tensors, ckpt = stored
    centered = suture.map(lambda x: x - x.mean(0), ckpt["w2"])
    with count_bytes_read() as counted:
        row = centered[3].read()
    assert counted.bytes == 8 * ROW
    np.testing.assert_allclose(row, (tensors["w2"] - tensors["w2"].mean(0))[3], rtol=1e-6)


def test_open_all_opens_orbax_sources_once_reading_no_array_data(tmp_path: Path) -> None:
    tree = {f"layer{i}": values((64, 256), i) for i in range(4)}
    save_standard(tmp_path / "ckpt", tree)
    ckpt = suture.open(tmp_path / "ckpt")
    stacked = suture.stack([ckpt[f"layer{i}"] for i in range(4)])
    sources = source_nodes(stacked.node)
    assert [source.path for source in sources] == [f"layer{i}" for i in range(4)]
    with count_bytes_read() as opening:
        open_all(sources)
    assert opening.bytes < tree["layer0"].nbytes  # metadata, not data
    with count_bytes_read() as again:
        open_all(sources)
    assert again.bytes == 0  # opened once
    open_all([])
    np.testing.assert_array_equal(stacked.read(), np.stack(list(tree.values())))
    np.testing.assert_array_equal(
        stacked.node.read((range(2, 3), range(0, 64, 8), range(256)))[0], tree["layer2"][::8]
    )
