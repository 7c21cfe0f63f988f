"""A plan's bytes to read are the bytes the load reads, for every kind of graph node.

Each node type answers what a read of a selection needs of its inputs in one place
(`Node.input_selections`); the plan, the memory budget and the read itself all follow it.
Each case below plans a small surgery over a safetensors file and over an Orbax checkpoint,
then loads it, and compares the plan's `bytes_to_read` with the bytes actually read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

import suture
from suture._lazy.combine import fit_shape
from suture._lazy.compute import BroadcastNode, ComputeNode, MapNode
from suture._lazy.graph import MemorySource
from suture._lazy.joins import ConcatNode, PadNode, StackNode
from suture._lazy.reads import bytes_read
from suture._lazy.selection import full
from suture._lazy.views import CastNode, IndexNode, ReshapeNode, TransposeNode

from .orbax_writers import save_standard

ROWS, COLUMNS = 256, 256  # 256 KiB of float32 per array: the format's overhead is small


def _arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    # random, as weights are: Orbax's compression saves under 10% of them
    return {name: rng.standard_normal((ROWS, COLUMNS), np.float32) for name in ("a", "b", "w")}


@pytest.fixture(params=["safetensors", "orbax"])
def stored(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    arrays = _arrays()
    if request.param == "safetensors":
        path = tmp_path / "model.safetensors"
        save_file(arrays, str(path))
    else:
        path = tmp_path / "ckpt"
        save_standard(path, arrays)
    return path, arrays


def _planned_and_read(path: Path, surgery: Callable[[Any], Any]) -> tuple[int, int, Any]:
    """The plan's bytes to read, the bytes the load read, and what it loaded."""
    planned = suture.plan(surgery, path)
    assert planned.ok, planned.problems
    ckpt = suture.open(path)
    with suture.count_bytes_read() as counted:
        loaded = suture.load(suture.transform(surgery, ckpt))
    return planned.bytes_to_read, counted.bytes, loaded


def _check(path: Path, surgery: Callable[[Any], Any], expected: dict[str, np.ndarray]) -> int:
    planned, read, loaded = _planned_and_read(path, surgery)
    assert read == pytest.approx(planned, rel=0.1), (planned, read)
    for name, value in expected.items():
        np.testing.assert_allclose(
            np.asarray(loaded[name]).astype(np.float64),
            np.asarray(value).astype(np.float64),
            rtol=1e-2 if np.asarray(loaded[name]).dtype.itemsize < 4 else 1e-5,
            atol=1e-4,
        )
    return planned


def test_slice(stored: tuple[Path, dict]) -> None:
    path, x = stored
    _check(path, lambda t: {"s": t["a"][8:24]}, {"s": x["a"][8:24]})


def test_slice_of_columns(stored: tuple[Path, dict]) -> None:
    path, x = stored
    _check(path, lambda t: {"s": t["a"][:32, 4:8]}, {"s": x["a"][:32, 4:8]})


def test_transpose(stored: tuple[Path, dict]) -> None:
    path, x = stored
    _check(path, lambda t: {"t": t["a"].T[:4]}, {"t": x["a"].T[:4]})


def test_reshape(stored: tuple[Path, dict]) -> None:
    path, x = stored

    def surgery(t: Any) -> dict:
        return {"r": t["a"].reshape(ROWS, 16, 16)[8:24]}

    _check(path, surgery, {"r": x["a"].reshape(ROWS, 16, 16)[8:24]})


def test_stack(stored: tuple[Path, dict]) -> None:
    path, x = stored

    def surgery(t: Any) -> dict:
        return {"s": suture.stack([t["a"], t["b"]])[1, :16]}

    _check(path, surgery, {"s": x["b"][:16]})


def test_concat_of_a_few_rows_reads_only_them(stored: tuple[Path, dict]) -> None:
    """The case that once planned both members whole (128 KiB) for a 4 KiB read."""
    path, x = stored

    def surgery(t: Any) -> dict:
        return {"c": suture.concatenate([t["a"], t["b"]])[:16]}

    planned = _check(path, surgery, {"c": x["a"][:16]})
    if path.suffix == ".safetensors":
        assert planned == 16 * COLUMNS * 4


def test_a_stack_of_parts_of_one_source_reads_every_part(stored: tuple[Path, dict]) -> None:
    """Each member reads its own rows of the one source: the plan counts them all, not only
    the largest (the experts of a fused tensor, each stacked on its own)."""
    path, x = stored

    def surgery(t: Any) -> dict:
        return {"s": suture.stack([t["a"][16 * i : 16 * i + 16].T for i in range(8)])}

    expected = np.stack([x["a"][16 * i : 16 * i + 16].T for i in range(8)])
    planned = _check(path, surgery, {"s": expected})
    if path.suffix == ".safetensors":
        assert planned == 8 * 16 * COLUMNS * 4


def test_one_source_in_two_places_of_a_leaf_is_read_twice(stored: tuple[Path, dict]) -> None:
    """Each place reads it: the plan counts both reads (it counted one, half the read)."""
    path, x = stored

    def surgery(t: Any) -> dict:
        return {"c": suture.concatenate([t["a"][:16], t["a"][:16]])}

    planned = _check(path, surgery, {"c": np.concatenate([x["a"][:16], x["a"][:16]])})
    if path.suffix == ".safetensors":
        assert planned == 2 * 16 * COLUMNS * 4


def test_concat_across_members(stored: tuple[Path, dict]) -> None:
    path, x = stored
    both = np.concatenate([x["a"], x["b"]], axis=1)

    def surgery(t: Any) -> dict:
        return {"c": suture.concatenate([t["a"], t["b"]], axis=1)[8:24, 250:260]}

    _check(path, surgery, {"c": both[8:24, 250:260]})


def test_cast(stored: tuple[Path, dict]) -> None:
    path, x = stored

    def surgery(t: Any) -> dict:
        return {"c": t["a"].astype("bfloat16")[8:24]}

    _check(path, surgery, {"c": x["a"][8:24]})


def test_truncate(stored: tuple[Path, dict]) -> None:
    path, x = stored

    def surgery(t: Any) -> dict:
        return {"a": fit_shape(t["a"], (16, COLUMNS))}

    planned = _check(path, surgery, {"a": x["a"][:16]})
    with suture.count_bytes_read() as counted:
        loaded = suture.load(
            path, {"a": np.zeros((16, COLUMNS), np.float32)}, partial=True, pad_truncate=True
        )
    np.testing.assert_array_equal(loaded["a"], x["a"][:16])
    assert counted.bytes == pytest.approx(planned, rel=0.1)


def test_pad_and_truncate(stored: tuple[Path, dict]) -> None:
    """Padded rows read nothing: the plan counts only the stored part."""
    path, x = stored
    shape = (2 * ROWS, 16)
    expected = np.zeros(shape, np.float32)
    expected[:ROWS] = x["a"][:, :16]
    planned = _check(
        path, lambda t: {"a": fit_shape(t["a"], shape)[ROWS - 8 :]}, {"a": expected[ROWS - 8 :]}
    )
    with suture.count_bytes_read() as counted:
        loaded = suture.load(
            path, {"a": np.zeros(shape, np.float32)}, partial=True, pad_truncate=True
        )
    np.testing.assert_array_equal(loaded["a"], expected)
    whole = suture.plan(lambda t: {"a": fit_shape(t["a"], shape)}, path).bytes_to_read
    assert counted.bytes == pytest.approx(whole, rel=0.1)
    assert planned <= whole


def test_elementwise_map(stored: tuple[Path, dict]) -> None:
    path, x = stored

    def surgery(t: Any) -> dict:
        return {"m": suture.map(lambda v: -v, t["a"], elementwise=True)[8:24]}

    _check(path, surgery, {"m": -x["a"][8:24]})


def test_map_of_whole_arrays(stored: tuple[Path, dict]) -> None:
    path, x = stored

    def surgery(t: Any) -> dict:
        return {"m": suture.map(lambda v: v[::-1], t["a"])[:16]}

    _check(path, surgery, {"m": x["a"][::-1][:16]})


def test_elementwise_compute(stored: tuple[Path, dict]) -> None:
    path, x = stored

    def surgery(tree: Any) -> dict:
        return {"twice": (tree["a"] * 2)[8:24], "root": np.sqrt(np.abs(tree["b"]))[:16]}

    _check(path, surgery, {"twice": x["a"][8:24] * 2, "root": np.sqrt(np.abs(x["b"][:16]))})


def test_matmul(stored: tuple[Path, dict]) -> None:
    path, x = stored

    def surgery(t: Any) -> dict:
        return {"p": (t["a"] @ t["w"])[:8]}

    _check(path, surgery, {"p": (x["a"] @ x["w"])[:8]})


def test_einsum(stored: tuple[Path, dict]) -> None:
    path, x = stored

    def surgery(t: Any) -> dict:
        return {"e": suture.einsum("ij,kj->ik", t["a"], t["w"])[:8]}

    _check(path, surgery, {"e": np.einsum("ij,kj->ik", x["a"], x["w"])[:8]})


def test_jnp_function(stored: tuple[Path, dict]) -> None:
    path, x = stored

    def surgery(tree: Any) -> dict:
        return {"j": (jnp.tanh(tree["a"]) + tree["b"])[8:24]}

    _check(path, surgery, {"j": np.tanh(x["a"][8:24]) + x["b"][8:24]})


def test_jnp_gather(stored: tuple[Path, dict]) -> None:
    path, x = stored
    rows = np.array([3, 40, 41, 200])

    def surgery(tree: Any) -> dict:
        return {
            "rows": jnp.take(tree["a"], jnp.asarray(rows), axis=0),
            "columns": jnp.take(tree["b"][:16], jnp.asarray([0, 7]), axis=1),
        }

    _check(path, surgery, {"rows": x["a"][rows], "columns": x["b"][:16][:, [0, 7]]})


# --- the per-node method itself ------------------------------------------------------------


def _memory(shape: tuple[int, ...], value: float = 0.0) -> MemorySource:
    return MemorySource(np.full(shape, value, np.float32))


def test_index_node_selects_its_base() -> None:
    base = _memory((8, 4))
    view = IndexNode(base, (range(2, 8, 2), range(4)), (), (), (3, 4))
    ((member, part),) = view.input_selections((range(1, 3), range(0, 2)))
    assert member is base and part == (range(4, 8, 2), range(0, 2))


def test_transpose_and_cast_pass_the_selection_down() -> None:
    base = _memory((8, 4))
    ((member, part),) = TransposeNode(base, (1, 0)).input_selections((range(1), range(3, 5)))
    assert member is base and part == (range(3, 5), range(1))
    cast = CastNode(base, np.dtype("float16"))
    assert cast.input_selections((range(2), range(4))) == [(base, (range(2), range(4)))]


def test_reshape_reads_kept_leading_axes_only() -> None:
    base = _memory((8, 4))
    ((_, part),) = ReshapeNode(base, (8, 2, 2)).input_selections((range(3, 4), range(1), range(2)))
    assert part == (range(3, 4), range(4))


def test_stack_reads_only_the_members_it_selects() -> None:
    members = [_memory((4,), i) for i in range(3)]
    stacked = StackNode(members, 0, np.dtype(np.float32))
    chosen = stacked.input_selections((np.array([2, 2, 0]), range(1, 3)))
    assert [(members.index(m), part) for m, part in chosen] == [
        (0, (range(1, 3),)),
        (2, (range(1, 3),)),
    ]


def test_concat_reads_only_the_members_it_selects() -> None:
    a, b, c = _memory((4, 2), 1), _memory((4, 2), 2), _memory((4, 2), 3)
    joined = ConcatNode([a, b, c], 0, np.dtype(np.float32))
    chosen = joined.input_selections((range(3, 6), range(2)))
    assert [(m, part) for m, part in chosen] == [
        (a, (range(3, 4), range(2))),
        (b, (range(0, 2), range(2))),
    ]
    assert joined.input_selections((np.array([], np.int64), range(2))) == []
    # a gather visiting a member twice reads it once, in the gather's order
    gathered = np.array([9, 0, 8, 1])
    chosen = joined.input_selections((gathered, range(2)))
    assert [m for m, _ in chosen] == [a, c]
    assert list(chosen[1][1][0]) == [1, 0]
    expected = np.concatenate([np.full((4, 2), v, np.float32) for v in (1, 2, 3)])[gathered]
    np.testing.assert_array_equal(joined.read((gathered, range(2))), expected)
    assert bytes_read(joined, (range(3, 6), range(2))) == 6 * 4


def test_pad_reads_nothing_outside_its_base() -> None:
    base = _memory((4, 2), 1)
    padded = PadNode(base, (8, 4))
    assert padded.input_selections((range(5, 8), range(4))) == []
    ((_, part),) = padded.input_selections((range(2, 6), range(1, 4)))
    assert part == (range(2, 4), range(1, 2))
    assert bytes_read(padded, full(padded.shape)) == 4 * 2 * 4
    assert padded.read((range(2, 6), range(1, 4))).tolist() == [[1, 0, 0]] * 2 + [[0, 0, 0]] * 2


def test_map_reads_selected_elements_only_when_elementwise() -> None:
    base = _memory((8, 4))
    selection = (range(2), range(4))
    elementwise = MapNode(np.negative, [base], (8, 4), base.dtype, True, "negative")
    assert elementwise.input_selections(selection) == [(base, selection)]
    whole = MapNode(np.flip, [base], (8, 4), base.dtype, False, "flip")
    assert whole.input_selections(selection) == [(base, full((8, 4)))]
    assert whole.computes_whole and not elementwise.computes_whole


def test_compute_and_broadcast_follow_their_axes() -> None:
    a, b = _memory((3, 2)), _memory((2, 4))
    product = ComputeNode(np.matmul, [a, b], [(0, None), (None, 1)], (3, 4), a.dtype, "matmul")
    chosen = product.input_selections((range(1, 2), range(2)))
    assert chosen == [(a, (range(1, 2), range(2))), (b, (range(2), range(2)))]
    row = _memory((1, 4))
    broadcast = BroadcastNode(row, (5, 4), (0, 1))
    assert broadcast.input_selections((range(2, 4), range(1, 3))) == [
        (row, (range(1), range(1, 3)))
    ]


def test_descriptions_are_the_plans_operation_names() -> None:
    a = _memory((4, 2))
    assert CastNode(a, np.dtype("float16")).describe() == "cast float16"
    assert StackNode([a, a], 1, np.dtype("float64")).describe() == "stack 2 on axis 1 as float64"
    assert ConcatNode([a, a], 0, a.dtype).describe() == "concat 2 on axis 0"
    assert PadNode(a, (5, 2)).describe() == "pad"
    assert TransposeNode(a, (1, 0)).describe() == "transpose"


def test_memory_of_a_concat_is_one_member_part_at_a_time() -> None:
    a, b = _memory((64, 16)), _memory((64, 16))
    joined = ConcatNode([a, b], 0, np.dtype(np.float32))
    selection = (range(60, 68), range(16))
    # the result (8 rows), and the larger member part read into it (4 rows)
    assert joined.held_while_reading(selection) == 8 * 16 * 4 + 4 * 16 * 4
