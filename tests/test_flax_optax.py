"""suture.nnx, suture.linen and suture.optax with real Flax models and Optax optimizers."""

from __future__ import annotations

import gc
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx
from flax.training import train_state

import suture
from suture import rules
from tests.orbax_writers import save_standard


class TwoLayerMLP(nnx.Module):
    def __init__(self, dim: int, rngs: nnx.Rngs) -> None:
        self.linear1 = nnx.Linear(dim, dim, rngs=rngs)
        self.linear2 = nnx.Linear(dim, dim, rngs=rngs)

    def __call__(self, x):
        return self.linear2(self.linear1(x))


class ModifiedTwoLayerMLP(nnx.Module):
    def __init__(self, dim: int, rngs: nnx.Rngs) -> None:
        self.layer1 = nnx.Linear(dim, dim, rngs=rngs)  # was linear1
        self.layer2 = nnx.Linear(dim, dim, rngs=rngs)  # was linear2

    def __call__(self, x):
        return self.layer2(self.layer1(x))


class LoRAMLP(nnx.Module):
    def __init__(self, dim: int, rngs: nnx.Rngs) -> None:
        self.linear1 = nnx.LoRALinear(dim, dim, lora_rank=2, rngs=rngs)
        self.linear2 = nnx.Linear(dim, dim, rngs=rngs)

    def __call__(self, x):
        return self.linear2(self.linear1(x))


@pytest.fixture
def saved_mlp(tmp_path: Path) -> tuple[TwoLayerMLP, Path]:
    model = TwoLayerMLP(4, rngs=nnx.Rngs(0))
    ocp.PyTreeCheckpointer().save(tmp_path / "nnx_state", nnx.state(model))
    return model, tmp_path / "nnx_state"


def test_renamed_modules_give_the_same_outputs(saved_mlp) -> None:
    """Seed 001: linear1/2 became layer1/2 in the new model code."""
    old, path = saved_mlp
    restored = suture.nnx.load_into(
        lambda: ModifiedTwoLayerMLP(4, rngs=nnx.Rngs(1)),
        path,
        [rules.rename(r"linear(\d)", r"layer\1")],
    )
    assert isinstance(restored, ModifiedTwoLayerMLP)
    x = jnp.ones((3, 4))
    np.testing.assert_allclose(restored(x), old(x), rtol=1e-6)


def test_abstract_model_and_live_model_targets(saved_mlp) -> None:
    old, path = saved_mlp
    abstract = nnx.eval_shape(lambda: TwoLayerMLP(4, rngs=nnx.Rngs(5)))
    x = jnp.ones((2, 4))
    np.testing.assert_allclose(suture.nnx.load_into(abstract, path)(x), old(x), rtol=1e-6)
    live = TwoLayerMLP(4, rngs=nnx.Rngs(9))
    np.testing.assert_allclose(suture.nnx.load_into(live, path)(x), old(x), rtol=1e-6)


def test_raw_value_checkpoints_and_plain_param_dicts(tmp_path: Path, saved_mlp) -> None:
    old, _ = saved_mlp
    pure = nnx.to_pure_dict(nnx.state(old))
    raw_value = jax.tree.map(lambda leaf: {"raw_value": np.asarray(leaf)}, pure)
    save_standard(tmp_path / "raw", raw_value)
    save_standard(tmp_path / "plain", jax.tree.map(np.asarray, pure))
    x = jnp.ones((2, 4))
    for path in (tmp_path / "raw", tmp_path / "plain"):
        loaded = suture.nnx.load_into(lambda: TwoLayerMLP(4, rngs=nnx.Rngs(3)), path)
        np.testing.assert_allclose(loaded(x), old(x), rtol=1e-6)


def test_lora_partial_init_allocates_only_the_new_arrays(saved_mlp) -> None:
    """Seed 001's memory-efficient partial init: the base weights come from the checkpoint."""
    old, path = saved_mlp
    live = jax.live_arrays()  # kept alive, so that no new array can take one of their ids
    before = {id(array) for array in live}
    lora = suture.nnx.load_into(lambda: LoRAMLP(4, rngs=nnx.Rngs(42)), path)
    gc.collect()  # live_arrays also lists unreachable arrays that are not yet collected
    created = [array for array in jax.live_arrays() if id(array) not in before]
    shapes = sorted(tuple(array.shape) for array in created)
    # the 4 loaded params and the 2 new LoRA params, each exactly once: no second copies
    assert shapes == [(2, 4), (4,), (4,), (4, 2), (4, 4), (4, 4)], shapes
    np.testing.assert_array_equal(
        np.asarray(lora.linear1.kernel[...]), np.asarray(old.linear1.kernel[...])
    )
    np.testing.assert_array_equal(
        np.asarray(lora.linear2.bias[...]), np.asarray(old.linear2.bias[...])
    )


def test_missing_leaves_of_an_abstract_model_without_factory_are_an_error(saved_mlp) -> None:
    _, path = saved_mlp
    abstract = nnx.eval_shape(lambda: LoRAMLP(4, rngs=nnx.Rngs(0)))
    with pytest.raises(
        suture.SurgeryError, match=r"(?s)needs 2 leaf path\(s\) the checkpoint lacks.*lora_a"
    ):
        suture.nnx.load_into(abstract, path)


def test_sharded_abstract_model_gets_its_shardings(saved_mlp) -> None:
    class Sharded(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("a", "b"))
            self.linear1 = nnx.Linear(4, 4, kernel_init=init, rngs=rngs)
            self.linear2 = nnx.Linear(4, 4, kernel_init=init, rngs=rngs)

        def __call__(self, x):
            return self.linear2(self.linear1(x))

    old, path = saved_mlp
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))
    with jax.set_mesh(mesh):
        model = suture.nnx.load_into(lambda: Sharded(nnx.Rngs(0)), path)
    kernel = model.linear1.kernel[...]
    assert kernel.sharding == jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("a", "b"))
    assert len(kernel.addressable_shards) == 8
    # a sharded matmul sums in another order: float32 rounding differs by about 1e-7
    np.testing.assert_allclose(model(jnp.ones((2, 4))), old(jnp.ones((2, 4))), rtol=1e-5)
    with pytest.raises(
        suture.SurgeryError, match=r"no concrete mesh with those axes is set.*jax.set_mesh"
    ):
        with jax.set_mesh(mesh):
            abstract = nnx.eval_shape(lambda: Sharded(nnx.Rngs(0)))
        suture.nnx.load_into(abstract, path)


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3))(x))
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(3)(x)


class RenamedCNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(4, (3, 3), name="features")(x))
        x = x.reshape((x.shape[0], -1))
        return nn.Dense(3, name="head")(x)


def _loss(apply_fn, params, images, labels):
    logits = apply_fn({"params": params}, images)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _step(state: train_state.TrainState, images, labels) -> train_state.TrainState:
    grads = jax.grad(lambda p: _loss(state.apply_fn, p, images, labels))(state.params)
    return state.apply_gradients(grads=grads)


def test_linen_training_resumes_after_renaming_with_the_moved_optimizer_state(
    tmp_path: Path,
) -> None:
    """A Linen CNN trained with Adam; its layers renamed; the next update is the same."""
    images = jax.random.normal(jax.random.key(0), (8, 6, 6, 1))
    labels = jnp.arange(8) % 3
    tx = optax.adam(1e-2)
    state = train_state.TrainState.create(
        apply_fn=CNN().apply, params=CNN().init(jax.random.key(1), images)["params"], tx=tx
    )
    for _ in range(3):
        state = _step(state, images, labels)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "cnn", state)
    checkpointer.wait_until_finished()

    renamed_model = RenamedCNN()
    fresh = train_state.TrainState.create(
        apply_fn=renamed_model.apply,
        params=renamed_model.init(jax.random.key(2), images)["params"],
        tx=tx,
    )
    surgery = suture.optax.follow(
        [
            rules.rename("params/Conv_0", "params/features"),
            rules.rename("params/Dense_0", "params/head"),
        ]
    )
    moved = suture.linen.load(tmp_path / "cnn", fresh, surgery)
    assert int(moved.step) == 3
    np.testing.assert_array_equal(
        moved.opt_state[0].mu["head"]["kernel"], state.opt_state[0].mu["Dense_0"]["kernel"]
    )

    expected = _step(state, images, labels)
    resumed = _step(moved, images, labels)
    np.testing.assert_allclose(
        resumed.params["features"]["kernel"], expected.params["Conv_0"]["kernel"], rtol=1e-6
    )
    np.testing.assert_allclose(
        resumed.params["head"]["bias"], expected.params["Dense_0"]["bias"], rtol=1e-6
    )
    np.testing.assert_allclose(
        resumed.opt_state[0].nu["head"]["kernel"],
        expected.opt_state[0].nu["Dense_0"]["kernel"],
        rtol=1e-6,
    )


def test_linen_frozen_dict_params_in_and_out(tmp_path: Path) -> None:
    from flax.core import FrozenDict

    model = nn.Dense(3)
    params = FrozenDict(model.init(jax.random.key(0), jnp.ones((1, 2))))
    save_standard(tmp_path / "dense", jax.tree.map(np.asarray, params.unfreeze()))
    abstract = jax.eval_shape(model.init, jax.random.key(1), jnp.ones((1, 2)))
    loaded = suture.linen.load(tmp_path / "dense", FrozenDict(abstract))
    assert isinstance(loaded, FrozenDict)
    np.testing.assert_array_equal(loaded["params"]["kernel"], params["params"]["kernel"])


def test_follow_stacks_and_casts_the_mirrors_too() -> None:
    params = {f"layer{i}": {"w": np.full(2, float(i), np.float32)} for i in range(3)}
    state = {"params": params, "opt_state": {"mu": params, "nu": params, "count": 5}}
    surgery = suture.optax.follow(
        [
            rules.stack(r"params/layer(?P<i>\d+)", into="params/layers"),
            rules.cast("params", "float16"),
        ]
    )
    moved = suture.flatten(rules.apply_rules(surgery, state))
    assert sorted(moved) == [
        "opt_state/count",
        "opt_state/mu/layers/w",
        "opt_state/nu/layers/w",
        "params/layers/w",
    ]
    assert moved["opt_state/mu/layers/w"].dtype == np.float16 and moved[
        "opt_state/mu/layers/w"
    ].shape == (3, 2)
    assert suture.optax.mirrors(list(suture.flatten(state))) == ["opt_state/mu", "opt_state/nu"]
