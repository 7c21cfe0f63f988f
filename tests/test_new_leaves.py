"""New leaves in a surgery's result: JAX/Flax initializers, constants from functions, plan rows."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import suture
from suture._surgery.init import leaf_key
from tests.orbax_writers import save_standard

W = np.arange(12, dtype=np.float32).reshape(4, 3)


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    save_standard(tmp_path / "ckpt", {"w": W})
    return tmp_path / "ckpt"


def with_head(tree):
    return {
        "w": tree["w"],
        "head": {
            "kernel": jax.ShapeDtypeStruct((3, 5), jnp.float32),
            "bias": jax.ShapeDtypeStruct((5,), jnp.float32),
        },
    }


def test_jax_and_flax_initializers_get_a_key_folded_from_the_seed_and_path(ckpt: Path) -> None:
    normal, lecun = jax.nn.initializers.normal(), nnx.initializers.lecun_normal()
    init = {"head": {"kernel": lecun, "bias": normal}}
    got = suture.load_and_transform(with_head, ckpt, init=init, seed=3)
    # The stock initializers, called on the documented per-leaf key, give the same values.
    expected_kernel = lecun(leaf_key(3, "head/kernel"), (3, 5), jnp.float32)
    np.testing.assert_array_equal(got["head"]["kernel"], np.asarray(expected_kernel))
    np.testing.assert_array_equal(
        got["head"]["bias"], np.asarray(normal(leaf_key(3, "head/bias"), (5,), jnp.float32))
    )
    # Order does not matter; the seed does; a key works as a seed.
    reordered = {"head": {"bias": normal, "kernel": lecun}}
    again = suture.load_and_transform(with_head, ckpt, init=reordered, seed=3)
    np.testing.assert_array_equal(again["head"]["kernel"], got["head"]["kernel"])
    other = suture.load_and_transform(with_head, ckpt, init=init, seed=4)
    assert not np.array_equal(other["head"]["kernel"], got["head"]["kernel"])
    keyed = suture.load_and_transform(with_head, ckpt, init=init, seed=jax.random.key(3))
    np.testing.assert_array_equal(keyed["head"]["kernel"], got["head"]["kernel"])
    # The older (shape, dtype) form keeps working beside them.
    mixed = {"head": {"kernel": lecun, "bias": np.zeros}}
    zeros = suture.load_and_transform(with_head, ckpt, init=mixed)["head"]["bias"]
    assert zeros.tolist() == [0.0] * 5


def test_a_shape_dtype_struct_without_init_is_an_error_naming_the_leaf(ckpt: Path) -> None:
    with pytest.raises(suture.SurgeryError, match=r"'head/kernel'.*To create them, pass init="):
        suture.load_and_transform(with_head, ckpt)


def fused(tree):
    return {"w": tree["w"], "fusion": {"kernel": np.empty((6, 2), np.float32)}}


def test_a_constant_returned_by_a_function_is_listed_as_new(ckpt: Path) -> None:
    plan = suture.plan(fused, ckpt)
    row = next(output for output in plan.outputs if output.path == "fusion/kernel")
    assert (row.shape, row.dtype, row.value) == ([6, 2], "float32", "constant from the function")
    assert plan.constants == ["fusion/kernel"]
    assert "New, constant from the function (no source; loaded as returned): fusion/kernel" in str(
        plan
    )


def test_init_replaces_a_constant_it_names(ckpt: Path) -> None:
    init = {"fusion": {"kernel": jax.nn.initializers.ones}}
    plan = suture.plan(fused, ckpt, init=init)
    assert plan.initialized == ["fusion/kernel"] and plan.constants == []
    got = suture.load_and_transform(fused, ckpt, init=init)
    np.testing.assert_array_equal(got["fusion"]["kernel"], np.ones((6, 2), np.float32))
    from_function = suture.load_and_transform(
        fused, ckpt, init=lambda: {"fusion": {"kernel": jnp.full((6, 2), 2.0)}}
    )
    np.testing.assert_array_equal(from_function["fusion"]["kernel"], np.full((6, 2), 2.0))


def test_every_plan_row_has_a_shape_and_dtype_on_one_line(ckpt: Path) -> None:
    def surgery(tree):
        return {
            "x": jnp.stack([tree["w"]]),
            "note": "two\nlines",
            "table": np.arange(100.0).reshape(10, 10),
            "step": 3,
        }

    plan = suture.plan(surgery, ckpt)
    rows = {output.path: output for output in plan.outputs}
    assert (rows["x"].shape, rows["x"].dtype, rows["x"].sources) == ([1, 4, 3], "float32", ["w"])
    assert all(output.shape is not None and output.dtype for output in plan.outputs)
    assert plan.bytes_to_read == W.nbytes and plan.dropped == []
    table = str(plan).split("\n\n")[0].splitlines()
    assert len(table) == 2 + len(plan.outputs)  # header, rule, then one line per output
    assert "'two\\nlines'" in str(plan) and "reads 48 B" in str(plan)
