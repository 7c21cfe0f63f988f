"""suture.load against checkpoints written by stock orbax-checkpoint."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import suture
from suture._iostats import count_bytes_read
from tests.orbax_writers import pytree_writer, sample_arrays, save_standard


def training_state(seed: int = 0, width: int = 64) -> dict:
    rng = np.random.default_rng(seed)

    def params() -> dict:
        return {
            "dense": {
                "kernel": rng.standard_normal((width, width), dtype=np.float32),
                "bias": np.zeros(width, np.float32),
            },
            "head": {"kernel": rng.standard_normal((width, 8), dtype=np.float32)},
        }

    return {
        "params": params(),
        "opt_state": {"mu": params(), "nu": params()},
        "step": np.asarray(12, np.int32),
    }


@pytest.fixture
def state_path(tmp_path: Path) -> tuple[dict, Path]:
    state = training_state()
    save_standard(tmp_path / "ckpt", state)
    return state, tmp_path / "ckpt"


def assert_tree_equal(actual, expected) -> None:
    flat_actual, flat_expected = suture.flatten(actual), suture.flatten(expected)
    assert sorted(flat_actual) == sorted(flat_expected)
    for path, value in flat_expected.items():
        np.testing.assert_array_equal(
            np.asarray(flat_actual[path]), np.asarray(value), err_msg=path
        )


def test_load_everything_as_numpy(state_path) -> None:
    state, path = state_path
    loaded = suture.load(path)
    assert_tree_equal(loaded, state)
    assert isinstance(loaded["params"]["dense"]["kernel"], np.ndarray)


def test_load_everything_as_jax(state_path) -> None:
    state, path = state_path
    loaded = suture.load(suture.open(path), as_jax=True)
    assert isinstance(loaded["params"]["head"]["kernel"], jax.Array)
    assert_tree_equal(loaded, state)


def test_every_dtype_and_python_values_round_trip(tmp_path: Path) -> None:
    tree = {**sample_arrays(), "name": "m", "count": 3, "rate": 0.5, "nothing": None}
    pytree_writer(use_ocdbt=True, use_zarr3=True)(tmp_path / "ckpt", tree)
    loaded = suture.load(tmp_path / "ckpt")
    assert loaded["name"] == "m" and loaded["nothing"] is None
    assert loaded["count"] == 3 and isinstance(loaded["count"], int)
    assert loaded["rate"] == 0.5 and isinstance(loaded["rate"], float)
    assert loaded["params"]["dense"]["bias"].dtype == ml_dtypes.bfloat16
    assert_tree_equal({k: loaded[k] for k in sample_arrays()}, sample_arrays())


def test_abstract_target_casts_dtype_on_the_host(state_path) -> None:
    state, path = state_path
    ckpt = suture.open(path)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])  # saved as numpy: as Orbax,
    target = jax.tree.map(  # a ShapeDtypeStruct with no sharding would give numpy back
        lambda s: jax.ShapeDtypeStruct(s.shape, jnp.bfloat16, sharding=device),
        ckpt.abstract()["params"],
    )
    loaded = suture.load(ckpt, {"params": target}, partial=True)
    kernel = loaded["params"]["dense"]["kernel"]
    assert isinstance(kernel, jax.Array) and kernel.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(kernel), state["params"]["dense"]["kernel"].astype(ml_dtypes.bfloat16)
    )


@pytest.mark.parametrize("dtype", ["float16", "int8", "float8_e4m3fn"])
def test_numpy_targets_give_numpy_in_their_dtype(state_path, dtype) -> None:
    state, path = state_path
    target = {
        "params": {"head": {"kernel": np.zeros((64, 8), dtype=suture._dtypes.to_dtype(dtype))}}
    }
    loaded = suture.load(path, target, partial=True)
    kernel = loaded["params"]["head"]["kernel"]
    assert isinstance(kernel, np.ndarray) and kernel.dtype.name == dtype
    np.testing.assert_array_equal(kernel, state["params"]["head"]["kernel"].astype(kernel.dtype))


def test_type_markers_and_orbax_empty_array_idiom(state_path) -> None:
    state, path = state_path
    target = jax.tree.map(lambda _: np.ndarray, state)
    target["params"]["dense"]["kernel"] = np.array([])  # Orbax's "a numpy array, as stored"
    target["params"]["head"]["kernel"] = jax.Array
    loaded = suture.load(path, target)
    assert isinstance(loaded["params"]["dense"]["kernel"], np.ndarray)
    assert isinstance(loaded["params"]["head"]["kernel"], jax.Array)
    assert_tree_equal(loaded, state)


def test_python_number_target_for_a_stored_array(state_path) -> None:
    _, path = state_path
    assert suture.load(path, {"step": 0}, partial=True) == {"step": 12}


def test_placeholders_skip_leaves_and_come_back_as_ellipsis(state_path) -> None:
    state, path = state_path
    ckpt = suture.open(path)
    target = suture.placeholders(ckpt, skip="opt_state")
    loaded = suture.load(ckpt, target)
    assert loaded["opt_state"]["mu"]["dense"]["kernel"] is suture.PLACEHOLDER
    assert_tree_equal(loaded["params"], state["params"])
    assert suture.PLACEHOLDER is ...


def test_placeholders_by_regex_and_from_a_path(state_path) -> None:
    _, path = state_path
    target = suture.placeholders(path, skip=r"opt_state/(mu|nu)/head/.*")
    assert target["opt_state"]["mu"]["head"]["kernel"] is ...
    assert isinstance(target["opt_state"]["mu"]["dense"]["kernel"], jax.ShapeDtypeStruct)


def test_placeholders_that_match_nothing_are_an_error(state_path) -> None:
    _, path = state_path
    with pytest.raises(
        suture.SurgeryError, match=r"skip='opt_stat' matches no leaf.*Did you mean 'opt_state'"
    ):
        suture.placeholders(path, skip="opt_stat")


def test_skipped_leaves_are_never_read(tmp_path: Path) -> None:
    state = training_state(width=512)
    save_standard(tmp_path / "ckpt", state)
    ckpt = suture.open(tmp_path / "ckpt")
    params_bytes = sum(
        leaf.nbytes for path, leaf in ckpt.arrays().items() if path.startswith("params/")
    )
    with count_bytes_read() as params_only:
        suture.load(ckpt, suture.placeholders(ckpt, skip="opt_state"))
    with count_bytes_read() as everything:
        suture.load(suture.open(tmp_path / "ckpt"))
    # Random float32 does not compress: stored size is about the in-memory size.
    assert params_only.bytes < params_bytes * 1.1
    assert everything.bytes > params_only.bytes * 2.8  # params, mu and nu are the same size
    with count_bytes_read() as omitted:
        suture.load(
            ckpt, {"params": jax.tree.map(lambda _: np.ndarray, state["params"])}, partial=True
        )
    assert omitted.bytes < params_bytes * 1.1


def test_placeholder_on_a_subtree_says_to_put_it_on_the_leaves(state_path) -> None:
    state, path = state_path
    target = {
        "params": jax.tree.map(lambda _: np.ndarray, state["params"]),
        "opt_state": ...,
        "step": 0,
    }
    with pytest.raises(
        suture.SurgeryError,
        match=r"PLACEHOLDER \(\.\.\.\) on 'opt_state', which is a subtree.*Put it on each leaf.*suture.placeholders\(ckpt, skip='opt_state'\)",
    ):
        suture.load(path, target)


def test_leaving_out_a_subtree_needs_partial(state_path) -> None:
    state, path = state_path
    target = {"params": jax.tree.map(lambda _: np.ndarray, state["params"]), "step": 0}
    with pytest.raises(
        suture.SurgeryError,
        match=r"leaves out 6 leaf path\(s\).*'opt_state/mu/dense/bias'.*Pass partial=True",
    ):
        suture.load(path, target)
    loaded = suture.load(path, target, partial=True)
    assert set(loaded) == {"params", "step"}


def test_target_leaf_the_checkpoint_lacks_suggests_close_paths(state_path) -> None:
    state, path = state_path
    target = {"params": {"dense": {"kernal": np.ndarray}}}
    with pytest.raises(
        suture.MissingLeafError,
        match=r"no source provides: 'params/dense/kernal'.*Did you mean 'params/dense/kernel'.*pass init=",
    ):
        suture.load(path, target, partial=True)


def test_init_provides_missing_leaves_as_values_or_initializers(state_path) -> None:
    state, path = state_path
    target = {
        "params": {
            "head": {"kernel": np.ndarray},
            "lora": {
                "a": jax.ShapeDtypeStruct((64, 4), jnp.float32),
                "b": jax.ShapeDtypeStruct((4, 8), jnp.float32),
            },
        }
    }
    init = {"params": {"lora": {"a": np.ones((64, 4), np.float32), "b": jnp.zeros}}}
    loaded = suture.load(path, target, partial=True, init=init)
    np.testing.assert_array_equal(loaded["params"]["lora"]["a"], np.ones((64, 4)))
    assert isinstance(loaded["params"]["lora"]["b"], jax.Array) and loaded["params"]["lora"][
        "b"
    ].shape == (4, 8)
    np.testing.assert_array_equal(
        loaded["params"]["head"]["kernel"], state["params"]["head"]["kernel"]
    )


def test_init_function_builds_only_missing_leaves(state_path) -> None:
    _, path = state_path
    target = {
        "params": {
            "head": {"kernel": np.ndarray},
            "new": {"w": jax.ShapeDtypeStruct((64, 64), jnp.float32)},
        }
    }

    def build_model() -> dict:
        key = jax.random.key(0)
        return {
            "params": {
                "head": {"kernel": jax.random.normal(key, (64, 8))},
                "new": {"w": jnp.full((64, 64), 2.0)},
            }
        }

    loaded = suture.load(path, target, partial=True, init=build_model)
    np.testing.assert_array_equal(np.asarray(loaded["params"]["new"]["w"]), np.full((64, 64), 2.0))


def test_init_with_wrong_shape_is_an_error(state_path) -> None:
    _, path = state_path
    target = {"params": {"new": jax.ShapeDtypeStruct((3, 3), jnp.float32)}}
    with pytest.raises(
        suture.ShapeMismatchError,
        match=r"init for 'params/new' has shape \(2, 2\), but the target wants \(3, 3\)",
    ):
        suture.load(path, target, partial=True, init={"params": {"new": np.ones((2, 2))}})


def test_shape_mismatch_is_an_error_unless_pad_truncate(state_path) -> None:
    state, path = state_path
    target = {"params": {"dense": {"kernel": jax.ShapeDtypeStruct((80, 32), jnp.float32)}}}
    with pytest.raises(
        suture.ShapeMismatchError,
        match=r"Leaf 'params/dense/kernel': the target wants shape \(80, 32\), the checkpoint has \(64, 64\). Pass pad_truncate=True",
    ):
        suture.load(path, target, partial=True)
    loaded = suture.load(path, target, partial=True, pad_truncate=True)
    kernel = np.asarray(loaded["params"]["dense"]["kernel"])
    expected = np.zeros((80, 32), np.float32)
    expected[:64] = state["params"]["dense"]["kernel"][:, :32]
    np.testing.assert_array_equal(kernel, expected)


def test_pad_truncate_cannot_change_the_number_of_axes(state_path) -> None:
    _, path = state_path
    target = {"params": {"head": {"kernel": np.zeros(64 * 8, np.float32)}}}
    with pytest.raises(
        suture.ShapeMismatchError, match="the number of axes differs. Reshape it with a rule"
    ):
        suture.load(path, target, partial=True, pad_truncate=True)


def test_string_leaf_cannot_become_an_array(tmp_path: Path) -> None:
    pytree_writer(use_ocdbt=True, use_zarr3=True)(tmp_path / "ckpt", {"name": "m"})
    with pytest.raises(
        suture.SurgeryError, match=r"Leaf 'name' is stored as a str .* not an array"
    ):
        suture.load(tmp_path / "ckpt", {"name": np.zeros(3)})


def mesh() -> Mesh:
    return Mesh(np.array(jax.devices()), ("x",))


def test_eight_devices_are_available() -> None:
    assert len(jax.devices()) == 8


def test_saved_replicated_loads_sharded_eight_ways(tmp_path: Path) -> None:
    data = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    replicated = jax.device_put(data, NamedSharding(mesh(), P()))
    save_standard(tmp_path / "ckpt", {"w": replicated})
    sharding = NamedSharding(mesh(), P("x"))
    loaded = suture.load(
        tmp_path / "ckpt", {"w": jax.ShapeDtypeStruct((64, 16), jnp.float32, sharding=sharding)}
    )
    w = loaded["w"]
    assert w.sharding == sharding
    assert len(w.addressable_shards) == 8
    for shard in w.addressable_shards:
        assert shard.data.shape == (8, 16)
        np.testing.assert_array_equal(np.asarray(shard.data), data[shard.index])


def test_saved_sharded_loads_replicated_and_on_another_mesh(tmp_path: Path) -> None:
    data = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    sharded = jax.device_put(data, NamedSharding(mesh(), P("x")))
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "ckpt", {"w": sharded})
    checkpointer.wait_until_finished()
    replicated = NamedSharding(mesh(), P())
    loaded = suture.load(
        tmp_path / "ckpt", {"w": jax.ShapeDtypeStruct((64, 16), jnp.float32, sharding=replicated)}
    )
    assert loaded["w"].sharding == replicated
    np.testing.assert_array_equal(np.asarray(loaded["w"]), data)
    grid = Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
    other = NamedSharding(grid, P("b", "a"))
    on_grid = suture.load(
        tmp_path / "ckpt", {"w": jax.ShapeDtypeStruct((64, 16), jnp.bfloat16, sharding=other)}
    )["w"]
    assert on_grid.sharding == other and on_grid.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(on_grid), data.astype(ml_dtypes.bfloat16))


def test_each_device_reads_only_its_shard(tmp_path: Path) -> None:
    data = np.random.default_rng(0).standard_normal((64, 4096), dtype=np.float32)
    save_args = {"w": ocp.SaveArgs(chunk_byte_size=4096 * 4, shard_axes=(0,))}
    ocp.PyTreeCheckpointer().save(tmp_path / "ckpt", {"w": data}, save_args=save_args)
    ckpt = suture.open(tmp_path / "ckpt")
    ckpt["w"][0].read()  # the OCDBT index, once
    sharding = NamedSharding(mesh(), P("x"))
    with count_bytes_read() as sharded:
        loaded = suture.load(
            ckpt, {"w": jax.ShapeDtypeStruct(data.shape, jnp.float32, sharding=sharding)}
        )
    np.testing.assert_array_equal(np.asarray(loaded["w"]), data)
    assert sharded.bytes < data.nbytes * 1.1  # eight shards, each read once: about one copy
    replicated = NamedSharding(mesh(), P())
    with count_bytes_read() as copies:
        suture.load(ckpt, {"w": jax.ShapeDtypeStruct(data.shape, jnp.float32, sharding=replicated)})
    assert copies.bytes < data.nbytes * 1.1  # eight devices, one slice: read once, not eight times


def test_sharded_load_with_pad_truncate(tmp_path: Path) -> None:
    data = np.arange(60 * 4, dtype=np.float32).reshape(60, 4)
    save_standard(tmp_path / "ckpt", {"w": data})
    sharding = NamedSharding(mesh(), P("x"))
    loaded = suture.load(
        tmp_path / "ckpt",
        {"w": jax.ShapeDtypeStruct((64, 4), jnp.float32, sharding=sharding)},
        pad_truncate=True,
    )
    expected = np.zeros((64, 4), np.float32)
    expected[:60] = data
    np.testing.assert_array_equal(np.asarray(loaded["w"]), expected)


def test_concrete_jax_array_target_keeps_its_sharding(state_path) -> None:
    state, path = state_path
    sharding = NamedSharding(mesh(), P(None, "x"))
    like = jax.device_put(np.zeros((64, 64), np.float32), sharding)
    loaded = suture.load(path, {"params": {"dense": {"kernel": like}}}, partial=True)
    assert loaded["params"]["dense"]["kernel"].sharding == sharding
    np.testing.assert_array_equal(
        np.asarray(loaded["params"]["dense"]["kernel"]), state["params"]["dense"]["kernel"]
    )


def test_load_from_a_lazy_tree(state_path) -> None:
    state, path = state_path
    ckpt = suture.open(path)
    lazy_tree = {
        "stacked": suture.stack([ckpt["params/dense/kernel"], ckpt["opt_state/mu/dense/kernel"]])
    }
    loaded = suture.load(lazy_tree)
    np.testing.assert_array_equal(
        loaded["stacked"],
        np.stack([state["params"]["dense"]["kernel"], state["opt_state"]["mu"]["dense"]["kernel"]]),
    )


def test_target_structure_is_kept(state_path) -> None:
    from flax.core import FrozenDict

    state, path = state_path
    target = FrozenDict({"params": jax.tree.map(lambda _: np.ndarray, state["params"])})
    loaded = suture.load(path, target, partial=True)
    assert isinstance(loaded, FrozenDict)


def test_a_jax_array_that_already_fits_is_not_copied() -> None:
    array = jnp.arange(8.0)
    loaded = suture.load({"w": array}, {"w": jax.ShapeDtypeStruct((8,), jnp.float32)})
    assert loaded["w"] is array
    cast = suture.load({"w": array}, {"w": jax.ShapeDtypeStruct((8,), jnp.bfloat16)})
    assert cast["w"] is not array and cast["w"].dtype == jnp.bfloat16
