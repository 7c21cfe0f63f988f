"""jnp, jax.nn and numpy code on LazyArrays: same values as jax, lazy, and honest in plans."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors.numpy import save_file

import suture
from suture._lazy.reads import bytes_read
from tests.orbax_writers import save_standard

RNG = np.random.default_rng(0)
W = RNG.standard_normal((8, 6), dtype=np.float32)
V = RNG.standard_normal((8, 6), dtype=np.float32)

# The functions surgery code uses, each as a user writes it in a transform function.
FUNCTIONS = {
    "stack": lambda w, v: jnp.stack([w, v]),
    "concatenate": lambda w, v: jnp.concatenate([w, v], axis=1),
    "split": lambda w, v: jnp.split(w, 2, axis=1)[1],
    "reshape": lambda w, v: jnp.reshape(w, (4, 12)),
    "transpose": lambda w, v: jnp.transpose(w),
    "swapaxes": lambda w, v: jnp.swapaxes(w[None], 0, 2),
    "einsum": lambda w, v: jnp.einsum("ij,kj->ik", w, v),
    "matmul": lambda w, v: jnp.matmul(w, v.T),
    "matmul_operator": lambda w, v: w @ v.T,
    "mean": lambda w, v: jnp.mean(w, axis=0),
    "sum": lambda w, v: jnp.sum(w * v, axis=-1),
    "where": lambda w, v: jnp.where(w > 0, w, 0),
    "pad": lambda w, v: jnp.pad(w, ((0, 2), (0, 0))),
    "take": lambda w, v: jnp.take(w, jnp.array([5, 0, 2]), axis=0),
    "astype": lambda w, v: w.astype(jnp.bfloat16),
    "tanh": lambda w, v: jnp.tanh(w),
    "exp": lambda w, v: jnp.exp(w - v),
    "gelu": lambda w, v: jax.nn.gelu(w),
    "relu": lambda w, v: jax.nn.relu(w),
    "silu": lambda w, v: jax.nn.silu(w),
    "softmax": lambda w, v: jax.nn.softmax(w, axis=-1),
}


@pytest.fixture(scope="module")
def ckpt_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("jnp") / "ckpt"
    save_standard(path, {"w": W, "v": V, "unused": np.ones(4, np.float32)})
    return path


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_jnp_functions_in_a_transform_equal_jax_and_stay_lazy(ckpt_path: Path, name: str) -> None:
    function = FUNCTIONS[name]

    def surgery(tree):
        return {"out": function(tree["w"], tree["v"])}

    expected = np.asarray(function(jnp.asarray(W), jnp.asarray(V)))
    lazy = suture.transform(surgery, ckpt_path)["out"]
    assert isinstance(lazy, suture.LazyArray)  # built without reading
    assert (lazy.shape, lazy.dtype) == (expected.shape, expected.dtype)
    np.testing.assert_allclose(
        np.asarray(lazy).astype(np.float32), expected.astype(np.float32), rtol=1e-6, atol=1e-6
    )
    loaded = suture.load_and_transform(surgery, ckpt_path)["out"]
    np.testing.assert_allclose(loaded.astype(np.float32), expected.astype(np.float32), atol=1e-6)
    plan = suture.plan(surgery, ckpt_path)
    (row,) = plan.outputs
    assert (row.shape, row.dtype) == (list(expected.shape), expected.dtype.name)
    assert plan.bytes_to_read > 0 and not plan.notes
    assert "w" in row.sources and "w" not in plan.dropped


def test_the_issue_example_tanh_of_an_in_memory_tree() -> None:
    result = suture.load_and_transform(lambda t: {"x": jnp.tanh(t["w"])}, {"w": np.ones(3)})
    np.testing.assert_allclose(result["x"], np.tanh(np.ones(3)), rtol=1e-6)


def test_comparisons_and_where_without_jax_stay_lazy() -> None:
    w = suture.LazyArray.from_array(W, path="w")
    masked = np.where(w > 0, w, 0)
    assert isinstance(masked, suture.LazyArray)
    np.testing.assert_array_equal(masked.read(), np.where(W > 0, W, 0))
    assert ((w >= 0) & (w <= 1)).read().tolist() == ((W >= 0) & (W <= 1)).tolist()
    assert (~(w < 0)).read().tolist() == (~(W < 0)).tolist()
    zeros = suture.LazyArray.from_array(np.array([0.0, 1.0, 0.0]))
    assert np.where(zeros == 0, 5.0, zeros).read().tolist() == [5.0, 1.0, 5.0]
    assert (zeros != 0).read().tolist() == [False, True, False]
    assert {w: 1}[w] == 1  # still hashable by identity


def test_multi_value_fn_and_value_fn_with_jnp_match_orbax(tmp_path: Path) -> None:
    """The same transformations through stock Orbax (on restored arrays) and suture."""
    path = tmp_path / "ckpt"
    save_standard(path, {"a": W, "b": V})
    transforms = {
        "merged": suture.Transform(
            multi_value_fn=lambda key, tree: jnp.tanh(tree["a"]) @ tree["b"].T
        ),
        "b": suture.Transform(value_fn=lambda b: jax.nn.relu(b).mean(axis=0)),
    }
    new_tree = {"merged": ..., "b": ...}
    got = suture.load_and_transform(transforms, path, target=new_tree)
    restored = ocp.StandardCheckpointer().restore(path)
    stock = {
        "merged": ocp.Transform(multi_value_fn=transforms["merged"].multi_value_fn),
        "b": ocp.Transform(value_fn=transforms["b"].value_fn),
    }
    expected = ocp.apply_transformations(restored, stock, new_tree)
    for key in new_tree:
        np.testing.assert_allclose(np.asarray(got[key]), np.asarray(expected[key]), rtol=1e-5)
    plan = suture.plan(transforms, path, target=new_tree)
    assert {row.path: row.operations[0] for row in plan.outputs} == {
        "b": "div",
        "merged": "matmul",
    }


def test_a_function_that_reads_eagerly_is_counted_and_not_dropped(ckpt_path: Path) -> None:
    def surgery(tree):
        scale = float(np.asarray(tree["v"]).max())  # a concrete value: needs a read
        return {"w": tree["w"] * scale}

    plan = suture.plan(surgery, ckpt_path)
    assert plan.dropped == ["unused"]  # 'v' was read by the function, so it is not dropped
    assert plan.bytes_to_read == W.nbytes + V.nbytes
    assert any("reads v when it is called" in note for note in plan.notes)
    got = suture.load_and_transform(surgery, ckpt_path)["w"]
    np.testing.assert_allclose(got, W * V.max())


def test_suture_stack_inside_a_traced_function(ckpt_path: Path) -> None:
    def surgery(tree):
        return {"x": jnp.tanh(suture.stack([tree["w"], tree["v"]]))}

    got = suture.transform(surgery, ckpt_path)["x"]
    assert isinstance(got, suture.LazyArray)
    np.testing.assert_allclose(got.read(), np.tanh(np.stack([W, V])), rtol=1e-6)


def test_matmul_einsum_and_np_matmul_are_lazy_products() -> None:
    a = suture.LazyArray.from_array(W, path="a")
    b = suture.LazyArray.from_array(V.T.copy(), path="b")
    for product in (
        a @ b,
        np.matmul(a, b),
        np.einsum("ij,jk->ik", a, b),
        suture.einsum("ij,jk", a, b),
    ):
        assert isinstance(product, suture.LazyArray) and product.shape == (8, 8)
        np.testing.assert_allclose(product.read(), W @ V.T, rtol=1e-5)
        # A block of output rows reads those rows of `a` and all of `b`.
        assert bytes_read(product.node, (range(2, 4), range(8))) == 2 * 6 * 4 + V.nbytes
    batched = suture.LazyArray.from_array(np.stack([W, W]))
    np.testing.assert_allclose((batched @ b).read(), np.stack([W, W]) @ V.T, rtol=1e-5)
    np.testing.assert_allclose((a @ b[:, 0]).read(), W @ V.T[:, 0], rtol=1e-5)
    with pytest.raises(suture.SurgeryError, match=r"Cannot multiply shapes \(8, 6\) @ \(8, 6\)"):
        a @ a
    with pytest.raises(suture.SurgeryError, match="label 'j' has length 6 in one operand and 8"):
        suture.einsum("ij,jk->ik", a, a)
    with pytest.raises(ValueError):  # numpy refuses the same shapes
        W @ W


def test_lora_merge_streams_by_row_blocks_under_a_budget_smaller_than_the_leaf(
    tmp_path: Path,
) -> None:
    w = RNG.standard_normal((2048, 1024), dtype=np.float32)  # 8 MiB
    a = RNG.standard_normal((2048, 4), dtype=np.float32)
    b = RNG.standard_normal((4, 1024), dtype=np.float32)
    save_file({"w": w}, tmp_path / "base.safetensors")
    save_file({"a": a, "b": b}, tmp_path / "lora.safetensors")

    def merge(base, lora):
        return {"w": base["w"] + 0.5 * (lora["a"] @ lora["b"])}

    plan = suture.plan(merge, tmp_path / "base.safetensors", tmp_path / "lora.safetensors")
    assert plan.outputs[0].sources == ["w", "a", "b"] and plan.bytes_to_read == (
        w.nbytes + a.nbytes + b.nbytes
    )
    merged = suture.transform(merge, tmp_path / "base.safetensors", tmp_path / "lora.safetensors")
    budget = 2 * 1024 * 1024  # a quarter of the leaf
    tracemalloc.start()  # numpy's allocations (every block) are traced
    try:
        suture.save(merged, tmp_path / "out", format="safetensors", max_memory=budget)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= budget
    out = suture.open(tmp_path / "out")["w"].read()
    np.testing.assert_allclose(out, w + 0.5 * (a @ b), rtol=1e-5, atol=1e-5)


def test_take_and_integer_array_indexing_read_only_the_taken_rows() -> None:
    source = {"w": W}  # in memory: reads count elements (an Orbax source decodes whole chunks)

    def surgery(tree):
        return {
            "rows": jnp.take(tree["w"], jnp.array([5, 0, 2]), axis=0),
            "last": tree["w"][jnp.array([-1])],
            "outside": jnp.take(tree["w"], jnp.array([9]), axis=0),  # jax fills with NaN
        }

    plan = suture.plan(surgery, source)
    rows = {output.path: output for output in plan.outputs}
    assert rows["rows"].operations == ["slice"] and rows["rows"].bytes_to_read == 3 * 6 * 4
    assert rows["last"].bytes_to_read == 6 * 4
    assert rows["outside"].operations == ["gather (reads inputs whole)"]
    got = suture.load_and_transform(surgery, source)
    expected = surgery({"w": jnp.asarray(W)})
    for key in rows:
        np.testing.assert_array_equal(got[key], np.asarray(expected[key]))


def test_64_bit_leaves_pass_through_a_traced_function_unchanged() -> None:
    source = {"a": np.ones(3, np.float64), "b": np.arange(3, dtype=np.int64)}

    def surgery(tree):
        return {"a": jnp.tanh(tree["a"]), "b": tree["b"]}

    plan = suture.plan(surgery, source)
    dtypes = {output.path: output.dtype for output in plan.outputs}
    assert dtypes == {"a": "float32", "b": "int64"}  # jnp.tanh gives float32, as in jax
    assert any("computes float64 -> float32" in note for note in plan.notes)
    assert np.asarray(jnp.tanh(source["a"])).dtype == np.float32
