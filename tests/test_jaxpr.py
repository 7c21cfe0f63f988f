"""suture._lazy.jaxpr: jnp code on LazyArrays becomes lazy nodes that read the least.

`lazy_eval` walks the jaxpr that ``jax.make_jaxpr`` records of a function, with LazyArrays
(tensors of a real safetensors file) as its inputs. Each result must equal jax's on the same
data; structural primitives must stay views (a row of the result reads a row of the file),
elementwise ones, products and reductions computed blocks of rows from rows of their inputs,
and other primitives read their inputs whole. Bytes are measured with `count_bytes_read`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

import suture
from suture._iostats import count_bytes_read
from suture._lazy.compute import BroadcastNode, ComputeNode, MapNode
from suture._lazy.graph import Node
from suture._lazy.jaxpr import lazy_eval

RNG = np.random.default_rng(0)
W = RNG.standard_normal((8, 6), dtype=np.float32)
V = RNG.standard_normal((8, 6), dtype=np.float32)
ROW = 6 * 4  # bytes of one row of W or V


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    path = tmp_path_factory.mktemp("jaxpr") / "model.safetensors"
    save_file({"w": W, "v": V}, str(path))
    ckpt = suture.open(path)
    return ckpt["w"], ckpt["v"]


def lazily(fn: Callable[..., Any], *arrays: Any) -> list[Any]:
    """`fn` traced by jax and rebuilt on `arrays` (what suture does with jnp code)."""
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]
    return lazy_eval(jax.make_jaxpr(fn)(*specs), list(arrays))


def nodes(node: Node) -> Iterator[Node]:
    pending = [node]
    while pending:
        current = pending.pop()
        yield current
        pending.extend(current.inputs())


def computed(result: Any) -> list[str]:
    """The names of the computing nodes behind `result` (empty: views of the sources only)."""
    return [type(n).__name__ for n in nodes(result.node) if isinstance(n, (ComputeNode, MapNode))]


# name: (function, rows of the file read for result row 2 of the result)
VIEWS: dict[str, tuple[Callable[..., Any], int]] = {
    "reshape": (lambda w, v: jnp.reshape(w, (8, 2, 3)), 1),
    "transpose": (lambda w, v: jnp.transpose(w)[:, 2:3], 1),
    "slice": (lambda w, v: w[1:7:2], 1),
    "rev": (lambda w, v: jnp.flip(w, axis=0), 1),
    "expand_dims": (lambda w, v: jnp.expand_dims(w, 1), 1),
    "concatenate": (lambda w, v: jnp.concatenate([w, v], axis=1), 2),
    "stack": (lambda w, v: jnp.stack([w, v], axis=1), 2),
    "split": (lambda w, v: jnp.split(w, 2, axis=1)[1], 1),
    "astype": (lambda w, v: w.astype(jnp.bfloat16), 1),
    "take": (lambda w, v: jnp.take(w, jnp.array([5, 0, 2, 7]), axis=0), 1),
    "index-array": (lambda w, v: w[jnp.array([3, 3, 1])], 1),
}

# name: (function, rows read for result row 2: a row is read once per use in the function)
COMPUTED: dict[str, tuple[Callable[..., Any], int]] = {
    "tanh": (lambda w, v: jnp.tanh(w), 1),
    "add-mul": (lambda w, v: w * 2.0 + v, 2),
    "where": (lambda w, v: jnp.where(w > 0, w, v), 3),
    "gelu": (lambda w, v: jax.nn.gelu(w), 3),
    "softmax": (lambda w, v: jax.nn.softmax(w, axis=-1), 4),
    "row-sum": (lambda w, v: jnp.sum(w * v, axis=-1), 2),
    "max": (lambda w, v: jnp.max(w, axis=1), 1),
    "matmul": (lambda w, v: w @ v.T, 1 + 8),  # a row of w, all of v
    "einsum-batch": (lambda w, v: jnp.einsum("ij,ij->i", w, v), 2),
    "broadcast-bias": (lambda w, v: w + v[0], 2),  # row 2 of w, row 0 of v
}

WHOLE: dict[str, Callable[..., Any]] = {
    "cumsum-rows": lambda w, v: jnp.cumsum(w, axis=0),
    "sort-rows": lambda w, v: jnp.sort(w, axis=0),
    "column-mean": lambda w, v: jnp.mean(w, axis=0)[None].repeat(8, 0),
}


def expected_of(fn: Callable[..., Any]) -> np.ndarray:
    return np.asarray(fn(jnp.asarray(W), jnp.asarray(V)))


def check_values(result: Any, expected: np.ndarray) -> None:
    assert isinstance(result, suture.LazyArray)
    assert (result.shape, result.dtype) == (expected.shape, expected.dtype)
    np.testing.assert_allclose(
        np.asarray(result.read(), np.float32), expected.astype(np.float32), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize(
    "name",
    [
        *VIEWS,
        "squeeze",
        "integer-index",  # a slice, then a squeeze
    ],
)
def test_structural_primitives_stay_views(inputs: tuple[Any, Any], name: str) -> None:
    fn, rows = {
        **VIEWS,
        "squeeze": (lambda w, v: jnp.squeeze(w[:, None]), 1),
        "integer-index": (lambda w, v: jnp.stack([w[4], v[1]], axis=1), 2),
    }[name]
    (result,) = lazily(fn, *inputs)
    check_values(result, expected_of(fn))
    assert computed(result) == []
    with count_bytes_read() as counted:
        row = result[2].read()
    np.testing.assert_array_equal(
        np.asarray(row, np.float32), expected_of(fn)[2].astype(np.float32)
    )
    assert counted.bytes == rows * ROW


@pytest.mark.parametrize("name", list(COMPUTED))
def test_computing_primitives_read_the_rows_a_block_needs(
    inputs: tuple[Any, Any], name: str
) -> None:
    fn, rows = COMPUTED[name]
    (result,) = lazily(fn, *inputs)
    check_values(result, expected_of(fn))
    assert "ComputeNode" in computed(result)
    with count_bytes_read() as counted:
        row = result[2].read()
    np.testing.assert_allclose(row, expected_of(fn)[2], rtol=1e-6, atol=1e-6)
    # whole rows only, and no more than one per use (never the whole of w or v)
    assert counted.bytes % ROW == 0 and ROW <= counted.bytes <= rows * ROW


@pytest.mark.parametrize("name", list(WHOLE))
def test_other_primitives_read_their_inputs_whole(inputs: tuple[Any, Any], name: str) -> None:
    fn = WHOLE[name]
    (result,) = lazily(fn, *inputs)
    check_values(result, expected_of(fn))
    with count_bytes_read() as counted:
        row = result[2].read()
    np.testing.assert_allclose(row, expected_of(fn)[2], rtol=1e-6, atol=1e-6)
    assert counted.bytes == W.nbytes


def test_a_gather_of_lazy_indices_is_computed_whole(inputs: tuple[Any, Any]) -> None:
    """Indices that are themselves read from the file cannot be a view: the gather reads
    its operand and its indices whole when read (and still equals jax)."""
    w, v = inputs

    def gather(values: Any, picks: Any) -> Any:
        return jnp.take(values, (jnp.abs(picks[:, 0]) * 3).astype(jnp.int32) % 8, axis=0)

    (result,) = lazily(gather, w, v)
    check_values(result, expected_of(gather))
    assert "ComputeNode" in computed(result)
    with count_bytes_read() as counted:
        result[0].read()
    assert counted.bytes >= W.nbytes + V.nbytes  # all of both (v's column: all of its rows)


def test_a_gather_of_several_axes_is_computed_whole_and_exact(inputs: tuple[Any, Any]) -> None:
    def pick(w: Any, v: Any) -> Any:
        return w[jnp.array([1, 5, 5]), jnp.array([0, 2, 4])]

    (result,) = lazily(pick, *inputs)
    check_values(result, expected_of(pick))
    with count_bytes_read() as counted:
        result.read()
    assert counted.bytes == W.nbytes


def test_building_reads_nothing(inputs: tuple[Any, Any]) -> None:
    everything = [fn for fn, _ in (*VIEWS.values(), *COMPUTED.values())] + list(WHOLE.values())
    with count_bytes_read() as counted:
        for fn in everything:
            lazily(fn, *inputs)
    assert counted.bytes == 0


def test_constants_are_evaluated_at_once_and_outputs_keep_their_order(
    inputs: tuple[Any, Any],
) -> None:
    def several(w: Any, v: Any) -> Any:
        return jnp.arange(4) * 2, w + 1, jnp.zeros((2, 2), jnp.bfloat16), v.T

    with count_bytes_read() as counted:
        ramp, shifted, zeros, transposed = lazily(several, *inputs)
    assert counted.bytes == 0
    assert isinstance(ramp, np.ndarray) and ramp.tolist() == [0, 2, 4, 6]
    assert isinstance(zeros, np.ndarray) and zeros.dtype == jnp.bfloat16 and not zeros.any()
    check_values(shifted, W + 1)
    check_values(transposed, V.T)


def test_a_jitted_function_is_walked_inside(inputs: tuple[Any, Any]) -> None:
    inner = jax.jit(lambda w: jnp.tanh(w)[:, ::2])
    (result,) = lazily(lambda w, v: inner(w) + v[:, ::2], *inputs)
    check_values(result, np.tanh(W)[:, ::2] + V[:, ::2])
    with count_bytes_read() as counted:
        result[3].read()
    assert counted.bytes == 2 * ROW


def test_a_broadcast_is_a_broadcast_node(inputs: tuple[Any, Any]) -> None:
    w, _ = inputs
    (result,) = lazily(lambda w: jnp.broadcast_to(w[0], (5, 6)), w)
    assert isinstance(result.node, BroadcastNode)
    check_values(result, np.broadcast_to(W[0], (5, 6)))
    with count_bytes_read() as counted:
        result.read()
    assert counted.bytes == ROW
