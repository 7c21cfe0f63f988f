"""transform, load_and_transform and plan: the seed scenarios on real Orbax checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest

import suture
from suture import rules
from suture._iostats import count_bytes_read
from tests.orbax_writers import save_standard


def layered(layers: int = 4, width: int = 64, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "params": {
            **{
                f"layer{i}": {"kernel": rng.standard_normal((width, width), dtype=np.float32)}
                for i in range(layers)
            },
            "head": {"kernel": rng.standard_normal((width, 2), dtype=np.float32)},
        },
        "step": np.asarray(5, np.int32),
    }


@pytest.fixture
def layered_path(tmp_path: Path) -> tuple[dict, Path]:
    state = layered()
    save_standard(tmp_path / "ckpt", state)
    return state, tmp_path / "ckpt"


def expected_stack(state: dict) -> np.ndarray:
    return np.stack([state["params"][f"layer{i}"]["kernel"] for i in range(4)])


def test_seed_stack_layers_with_the_seeds_own_function(layered_path) -> None:
    """Seed 000's stack_layers_transform, as written there (with jnp.stack)."""
    state, path = layered_path

    def stack_layers_transform(source_tree):
        params = source_tree["params"]
        layer_keys = sorted([k for k in params if "layer" in k])
        stacked_layers = jax.numpy.stack([params[k]["kernel"] for k in layer_keys])
        new_params = {"stacked_layers": stacked_layers}
        for k in params:
            if "layer" not in k:
                new_params[k] = params[k]
        source_tree["params"] = new_params
        return source_tree

    restored = suture.load_and_transform(stack_layers_transform, path)
    np.testing.assert_array_equal(
        np.asarray(restored["params"]["stacked_layers"]), expected_stack(state)
    )
    assert restored["step"] == 5
    plan = suture.plan(stack_layers_transform, path)
    assert not plan.notes  # traced by jax and rebuilt lazily: nothing read to build it
    stacked = next(out for out in plan.outputs if out.path == "params/stacked_layers")
    assert stacked.operations == ["stack 4 on axis 0"] and stacked.shape == [4, 64, 64]
    assert stacked.bytes_to_read == expected_stack(state).nbytes


def test_stack_layers_lazily_with_suture_ops_and_with_rules(layered_path) -> None:
    state, path = layered_path

    def lazy_stack(tree):
        params = tree["params"]
        return {
            "params": {
                "layers": {
                    "kernel": suture.stack([params[f"layer{i}"]["kernel"] for i in range(4)])
                },
                "head": params["head"],
            }
        }

    with count_bytes_read() as building:
        lazy = suture.transform(lazy_stack, path)
    assert building.bytes < 64 * 1024  # metadata only
    opened = suture.open(path)
    with count_bytes_read() as rebuilding:
        suture.transform(lazy_stack, opened)
    assert rebuilding.bytes == 0  # an opened checkpoint: nothing at all
    by_rules = suture.load_and_transform(
        [rules.drop("step"), rules.stack(r"params/layer(?P<i>\d+)", into="params/layers")], path
    )
    for result in (suture.load(lazy), by_rules):
        np.testing.assert_array_equal(result["params"]["layers"]["kernel"], expected_stack(state))
        np.testing.assert_array_equal(
            result["params"]["head"]["kernel"], state["params"]["head"]["kernel"]
        )


def encoder(seed: int, width: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "params": {"dense": {"kernel": rng.standard_normal((width, width), dtype=np.float32)}},
        "step": np.asarray(seed, np.int32),
    }


def test_merge_image_and_text_models_with_a_new_fusion_layer(tmp_path: Path) -> None:
    """Seed 000's multi-model transform; the fusion layer comes from init."""
    image, text = encoder(1, 32), encoder(2, 16)
    save_standard(tmp_path / "image", image)
    save_standard(tmp_path / "text", text)

    def merge_models_transform(image_model_tree, text_model_tree):
        return {
            "params": {
                "image_encoder": image_model_tree["params"],
                "text_encoder": text_model_tree["params"],
                "fusion_layer": {
                    "kernel": jax.ShapeDtypeStruct((48, 8), jnp.float32),
                    "bias": jax.ShapeDtypeStruct((8,), jnp.float32),
                },
            },
            "step": image_model_tree["step"],
        }

    def init_full_model():
        key = jax.random.key(0)
        return {
            "params": {
                "image_encoder": {"dense": {"kernel": jnp.zeros((32, 32))}},
                "text_encoder": {"dense": {"kernel": jnp.zeros((16, 16))}},
                "fusion_layer": {"kernel": jax.random.normal(key, (48, 8)), "bias": jnp.ones(8)},
            },
            "step": jnp.zeros((), jnp.int32),
        }

    plan = suture.plan(
        merge_models_transform, tmp_path / "image", tmp_path / "text", init=init_full_model
    )
    assert plan.ok and sorted(plan.initialized) == [
        "params/fusion_layer/bias",
        "params/fusion_layer/kernel",
    ]
    assert any(str(tmp_path / "text") in entry for entry in plan.dropped)  # text's step is unused
    final = suture.load_and_transform(
        merge_models_transform, tmp_path / "image", tmp_path / "text", init=init_full_model
    )
    np.testing.assert_array_equal(
        final["params"]["image_encoder"]["dense"]["kernel"], image["params"]["dense"]["kernel"]
    )
    np.testing.assert_array_equal(
        final["params"]["text_encoder"]["dense"]["kernel"], text["params"]["dense"]["kernel"]
    )
    np.testing.assert_array_equal(final["params"]["fusion_layer"]["bias"], np.ones(8))
    np.testing.assert_allclose(
        final["params"]["fusion_layer"]["kernel"], jax.random.normal(jax.random.key(0), (48, 8))
    )
    assert final["step"] == 1


def test_init_under_jit_allocates_only_the_missing_leaves(layered_path) -> None:
    _, path = layered_path
    big = (2048, 2048)

    def init_full_model():  # the encoders would be 2 x 16 MiB if computed
        return {
            "encoder": {"a": jnp.ones(big), "b": jnp.ones(big) * 2},
            "lora": {"w": jnp.full((64, 4), 0.5)},
        }

    def attach_lora(tree):
        return {"params": tree["params"], "lora": {"w": jax.ShapeDtypeStruct((64, 4), jnp.float32)}}

    before = {id(array) for array in jax.live_arrays()}
    result = suture.transform(attach_lora, path, init=init_full_model)
    created = [array for array in jax.live_arrays() if id(array) not in before]
    assert sum(array.nbytes for array in created) <= 64 * 4 * 4
    assert [array.shape for array in created] == [(64, 4)]
    np.testing.assert_array_equal(result["lora"]["w"].read(), np.full((64, 4), 0.5))


def test_orbax_transformations_tree_with_target_like_restore(tmp_path: Path) -> None:
    """Seed 003's restore with transforms: item + transforms through PyTreeRestore."""
    state = {"a": np.arange(16), "b": np.ones(16)}
    ocp.PyTreeCheckpointer().save(tmp_path / "ckpt", state)
    item = {"c": ..., "d": np.arange(8)}
    expected = ocp.PyTreeCheckpointer().restore(
        tmp_path / "ckpt",
        args=ocp.args.PyTreeRestore(
            item=item,
            restore_args={"c": ocp.RestoreArgs(restore_type=np.ndarray)},
            transforms={"c": ocp.Transform(original_key="a")},
        ),
    )
    actual = suture.load_and_transform(
        {"c": suture.Transform(original_key="a")}, tmp_path / "ckpt", target=item
    )
    assert sorted(actual) == sorted(expected) == ["c", "d"]
    np.testing.assert_array_equal(actual["c"], expected["c"])
    np.testing.assert_array_equal(actual["d"], expected["d"])


def test_target_casts_and_partial_drops(layered_path) -> None:
    state, path = layered_path
    target = {"params": {"head": {"kernel": jax.ShapeDtypeStruct((64, 2), jnp.bfloat16)}}}
    with pytest.raises(
        suture.SurgeryError,
        match=r"result has 5 leaf path\(s\) that the target leaves out.*partial=True",
    ):
        suture.transform(None, path, target=target)
    loaded = suture.load_and_transform(None, path, target=target, partial=True)
    head = loaded["params"]["head"]["kernel"]
    assert head.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(head), state["params"]["head"]["kernel"].astype(ml_dtypes.bfloat16)
    )


def test_missing_leaves_without_init_are_listed(layered_path) -> None:
    _, path = layered_path
    target = {
        "params": {"head": {"kernel": np.ndarray, "bias": jax.ShapeDtypeStruct((2,), jnp.float32)}}
    }
    with pytest.raises(
        suture.SurgeryError, match=r"no source provides: 'params/head/bias'.*pass init="
    ):
        suture.transform(None, path, target=target, partial=True)


def test_shape_mismatch_with_the_target_is_reported(layered_path) -> None:
    _, path = layered_path
    target = {"params": {"head": {"kernel": jax.ShapeDtypeStruct((64, 3), jnp.float32)}}}
    with pytest.raises(
        suture.SurgeryError,
        match=r"Leaf 'params/head/kernel': the target wants shape \(64, 3\), the result has \(64, 2\)",
    ):
        suture.transform(None, path, target=target, partial=True)


def test_several_problems_are_all_listed(layered_path) -> None:
    _, path = layered_path
    bad = [rules.rename("nope", "x"), rules.rename("params/layer0", "params/layer1")]
    with pytest.raises(
        suture.SurgeryError,
        match=r"The surgery has 2 problems:\n  1\. rename\('nope', 'x'\).*\n  2\. rename\('params/layer0', 'params/layer1'\) would overwrite",
    ):
        suture.load_and_transform(bad, path)


def test_rule_lists_take_one_source_and_transform_must_be_known(layered_path) -> None:
    _, path = layered_path
    with pytest.raises(
        suture.SurgeryError,
        match=r"A rule list applies to one source, but 2 were given.*pass a function",
    ):
        suture.transform([rules.drop("step")], path, path)
    with pytest.raises(
        suture.SurgeryError,
        match="transform must be a list of rules, a transformations dict, a function or None; got int",
    ):
        suture.transform(3, path)
    with pytest.raises(suture.SurgeryError, match=r"transformations tree needs target="):
        suture.transform({"a": suture.Transform()}, path)


def test_plan_reads_nothing_and_reports_everything(layered_path) -> None:
    state, path = layered_path
    surgery = [
        rules.drop("step"),
        rules.stack(r"params/layer(?P<i>\d+)", into="params/layers"),
        rules.cast("params", "bfloat16"),
    ]
    with count_bytes_read() as planning:
        plan = suture.plan(surgery, path)
    assert planning.bytes < 64 * 1024  # metadata only
    opened = suture.open(path)
    with count_bytes_read() as replanning:
        assert suture.plan(surgery, opened).bytes_to_read == plan.bytes_to_read
    assert replanning.bytes == 0  # an opened checkpoint: nothing at all
    assert plan.ok and plan.problems == []
    layers = next(output for output in plan.outputs if output.path == "params/layers/kernel")
    assert layers.shape == [4, 64, 64] and layers.dtype == "bfloat16"
    assert layers.operations == [
        "stack 4 on axis 0 as bfloat16"
    ]  # the cast is folded into the stack
    assert layers.sources == [f"params/layer{i}/kernel" for i in range(4)]
    assert layers.bytes_to_read == 4 * 64 * 64 * 4
    assert plan.dropped == ["step"]
    assert plan.bytes_to_write == (4 * 64 * 64 + 64 * 2) * 2
    text = str(plan)
    assert "output" in text and "params/layers/kernel" in text and "No problems." in text
    report = json.loads(plan.to_json())
    assert report["ok"] is True and report["bytes_to_read"] == plan.bytes_to_read


def test_plan_of_a_slice_counts_the_chunks_it_decodes(layered_path, tmp_path: Path) -> None:
    _, single_chunk = layered_path  # Orbax's default: one chunk per leaf
    first_rows = lambda tree: {"first_rows": tree["params"]["layer0"]["kernel"][:8]}  # noqa: E731
    plan = suture.plan(first_rows, single_chunk)
    assert plan.outputs[0].bytes_to_read == 64 * 64 * 4  # the whole chunk is decoded
    assert len(plan.dropped) == 5
    state = layered()

    def per_row(leaf: np.ndarray) -> ocp.SaveArgs:
        if leaf.ndim == 0:
            return ocp.SaveArgs()
        return ocp.SaveArgs(chunk_byte_size=leaf.nbytes // leaf.shape[0], shard_axes=(0,))

    save_args = jax.tree.map(per_row, state)
    ocp.PyTreeCheckpointer().save(tmp_path / "rows", state, save_args=save_args)
    assert suture.plan(first_rows, tmp_path / "rows").outputs[0].bytes_to_read == 8 * 64 * 4


def test_plan_collects_problems_instead_of_raising(layered_path) -> None:
    _, path = layered_path
    plan = suture.plan([rules.rename("nope", "x"), rules.drop("step")], path)
    assert not plan.ok
    assert "rename('nope', 'x') matches no path" in plan.problems[0]
    assert "1 problem(s):" in str(plan)
    assert all(output.path != "step" for output in plan.outputs)
