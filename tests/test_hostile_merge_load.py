"""Merges of leaves that differ in kind, and loads that jax or a target cannot honour.

Each case used to give a silent wrong value (model 0's unmerged values, an imaginary part
dropped, an empty leaf, NaN rows, int64 2**40 + 5 as int32 5) or jax's raw error; now it
is exact or a `suture.SurgeryError` that names the leaf.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import suture
from suture._lazy.combine import fit_shape

# suture.merge


def test_a_leaf_float_in_one_model_and_integer_in_another_is_refused(tmp_path: Path) -> None:
    suture.save({"w": np.array([1.0, 2.0], np.float32)}, tmp_path / "a")
    suture.save({"w": np.array([3, 4], np.int32)}, tmp_path / "b")
    merged = None
    with pytest.raises(suture.MergeError, match=r"Leaf 'w' is floating-point in some models") as e:
        merged = suture.merge([tmp_path / "a", tmp_path / "b"], "linear")
    assert merged is None
    assert "model 0: float32, model 1: int32" in str(e.value) and "take" in str(e.value)
    # the same through a base: a float merge whose base holds the leaf as integers
    suture.save({"w": np.array([0, 0], np.int32)}, tmp_path / "base")
    suture.save({"w": np.array([3.0, 4.0], np.float32)}, tmp_path / "c")
    with pytest.raises(suture.MergeError, match=r"the base: int32"):
        suture.merge([tmp_path / "a", tmp_path / "c"], "task_arithmetic", base=tmp_path / "base")


def test_integer_leaves_of_different_shapes_are_refused(tmp_path: Path) -> None:
    models = [{"step": np.array(3, np.int32)}, {"step": np.array([5, 6], np.int32)}]
    with pytest.raises(
        suture.ShapeMismatchError, match=r"Leaf 'step' .*model 0: \(\), model 1: \(2,\)"
    ):
        suture.merge(models, "linear")
    # equal shapes: still taken from the first model (or the base), as documented
    same = [{"step": np.array(3, np.int32)}, {"step": np.array(5, np.int32)}]
    assert suture.load(suture.merge(same, "linear"))["step"] == 3
    base = {"step": np.array(1, np.int32)}
    assert suture.load(suture.merge(same, "task_arithmetic", base=base))["step"] == 1


def test_complex_leaves_are_refused_not_stripped_of_their_imaginary_part() -> None:
    models = [
        {"c": np.array([1 + 1j], np.complex64), "w": np.ones(2, np.float32)},
        {"c": np.array([1 + 3j], np.complex64), "w": np.zeros(2, np.float32)},
    ]
    with pytest.raises(suture.MergeError, match=r"Leaf 'c' is complex .*imaginary part"):
        suture.merge(models, "linear")
    # taken whole from one model, it stays exact
    taken = suture.load(suture.merge(models, "linear", per_leaf={"c": {"take": 1}}))
    np.testing.assert_array_equal(taken["c"], np.array([1 + 3j], np.complex64))
    np.testing.assert_array_equal(taken["w"], np.full(2, 0.5, np.float32))


def test_values_that_are_not_arrays_come_from_the_base_and_must_be_alike() -> None:
    models = [
        {"name": "a", "w": np.ones(2, np.float32)},
        {"name": "b", "w": np.ones(2, np.float32)},
    ]
    base = {"name": "base", "w": np.zeros(2, np.float32)}
    assert suture.load(suture.merge(models, "task_arithmetic", base=base))["name"] == "base"
    assert suture.load(suture.merge(models, "linear"))["name"] == "a"
    mixed = [{"n": np.array([1.0], np.float32)}, {"n": "one"}]
    with pytest.raises(suture.MergeError, match=r"Leaf 'n' is an array in some models and not"):
        suture.merge(mixed, "linear")


# suture.load(..., pad_truncate=...)


def test_a_target_shape_with_a_negative_size_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "w.npz", w=np.arange(12, dtype=np.float32).reshape(3, 4))
    target = {"w": jax.ShapeDtypeStruct((-1, 4), jnp.float32)}
    for pad_truncate in (True, False):
        with pytest.raises(suture.ShapeMismatchError, match=r"Leaf 'w': .*\(-1, 4\).*negative"):
            suture.load(tmp_path / "w.npz", target, pad_truncate=pad_truncate)
    lazy = suture.open(tmp_path / "w.npz")["w"]
    with pytest.raises(suture.ShapeMismatchError, match=r"Leaf 'w' .*\(2, -4\).*negative"):
        fit_shape(lazy, (2, -4))


def test_mean_padding_of_a_leaf_with_no_rows_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "e.npz", e=np.zeros((0, 4), np.float32), f=np.zeros((3, 0), np.float32))
    target = {"e": jax.ShapeDtypeStruct((2, 4), jnp.float32)}
    with pytest.raises(suture.ShapeMismatchError, match=r"Leaf 'e' has no rows along axis 0"):
        suture.load(tmp_path / "e.npz", target, partial=True, pad_truncate="mean")
    zeros = suture.load(tmp_path / "e.npz", target, partial=True, pad_truncate=True)
    np.testing.assert_array_equal(zeros["e"], np.zeros((2, 4), np.float32))
    # rows of no elements: the new rows hold nothing, so there is nothing to average
    empty = {"f": jax.ShapeDtypeStruct((5, 0), jnp.float32)}
    grown = suture.load(tmp_path / "e.npz", empty, partial=True, pad_truncate="mean")
    assert grown["f"].shape == (5, 0)


# 64-bit leaves while jax's 64-bit mode is off


@pytest.fixture
def wide(tmp_path: Path) -> Path:
    assert not jax.config.jax_enable_x64
    path = tmp_path / "wide.npz"
    np.savez(
        path,
        big=np.array([2**40 + 5, -3], np.int64),
        fine=np.array([1 + 2**-40], np.float64),
        small=np.arange(4, dtype=np.int64),
        skipme=np.zeros(2),
    )
    return path


def test_placeholders_keep_64_bit_leaves_as_stored(wide: Path) -> None:
    out = suture.load(wide, suture.placeholders(wide, skip="skipme"))
    assert out["skipme"] is Ellipsis
    assert isinstance(out["big"], np.ndarray) and out["big"].dtype == np.int64
    assert out["big"].tolist() == [2**40 + 5, -3]
    assert out["fine"].dtype == np.float64 and out["fine"][0] == 1 + 2**-40


def test_jax_targets_of_64_bit_leaves_are_exact_or_refused(wide: Path) -> None:
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    sharded = NamedSharding(mesh, P("x"))
    asked = {"big": jax.ShapeDtypeStruct((2,), jnp.int64, sharding=sharded)}
    with pytest.raises(suture.UnsupportedError, match=r"Leaf 'big' is int64.*1099511627781 to 5"):
        suture.load(wide, asked, partial=True)
    # floats round as jax and Orbax round them; one past float32's range is refused
    assert suture.load(wide, {"fine": jax.Array}, partial=True)["fine"].dtype == jnp.float32
    np.savez(wide.parent / "huge.npz", huge=np.array([1e300, 1.0]))
    with pytest.raises(suture.SurgeryError, match=r"jax_enable_x64"):
        suture.load(wide.parent / "huge.npz", {"huge": jax.Array})
    with pytest.raises(suture.UnsupportedError, match=r"Leaf 'big'"):
        suture.load(wide, as_jax=True)
    # values jax holds exactly load as jax and Orbax load them: in 32 bits
    small = {"small": jax.ShapeDtypeStruct((4,), jnp.int64, sharding=sharded)}
    loaded = suture.load(wide, small, partial=True)["small"]
    assert loaded.dtype == jnp.int32 and loaded.sharding == sharded
    np.testing.assert_array_equal(loaded, np.arange(4))
    # and the numpy target keeps them all; with 64-bit mode on, jax holds them
    assert suture.load(wide, {"big": np.ndarray}, partial=True)["big"].tolist() == [2**40 + 5, -3]
    jax.config.update("jax_enable_x64", True)
    try:
        out = suture.load(wide, {"big": jax.Array, "fine": jax.Array}, partial=True)
        assert out["big"].dtype == jnp.int64 and out["big"].tolist() == [2**40 + 5, -3]
        assert out["fine"].dtype == jnp.float64 and float(out["fine"][0]) == 1 + 2**-40
    finally:
        jax.config.update("jax_enable_x64", False)


# shardings


def test_a_sharding_that_does_not_divide_an_axis_names_the_leaf(tmp_path: Path) -> None:
    np.savez(tmp_path / "layer.npz", layer=np.ones((8, 12), np.float32))
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    assert mesh.shape["x"] == 8  # tests/conftest.py gives 8 CPU devices
    split = NamedSharding(mesh, P(None, "x"))
    target = {"layer": jax.ShapeDtypeStruct((8, 12), jnp.float32, sharding=split)}
    with pytest.raises(
        suture.ShapeMismatchError,
        match=r"Leaf 'layer' of shape \(8, 12\).*axis 1 \(size 12\) would be split 8 ways over "
        r"mesh axis 'x'",
    ):
        suture.load(tmp_path / "layer.npz", target)
    by_rows = NamedSharding(mesh, P("x"))
    target = {"layer": jax.ShapeDtypeStruct((8, 12), jnp.float32, sharding=by_rows)}
    assert suture.load(tmp_path / "layer.npz", target)["layer"].sharding == by_rows
