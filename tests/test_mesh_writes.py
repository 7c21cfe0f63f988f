"""Saves for a target mesh: each array's chunks tile its shards there, and stock Orbax
restores the result onto that mesh and onto another one (8 CPU devices, conftest)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import suture
from suture._sharding import (
    ShardingRules,
    largest_divisor,
    logical_to_mesh_axes,
    parse_mesh,
    shard_lengths,
    tiling_chunk,
)


def written_chunk(folder: Path, name: str) -> tuple[int, ...]:
    """The chunk shape TensorStore recorded for array `name` of an Orbax checkpoint."""
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "ocdbt", "base": f"file://{folder}", "path": name},
    }
    grid = ts.open(spec).result().spec().to_json()["metadata"]["chunk_grid"]
    return tuple(grid["configuration"]["chunk_shape"])


def assert_tiles(shape, chunk, mesh: dict[str, int], spec) -> None:
    """No chunk crosses a shard's edge: every edge along an axis is a multiple of the chunk."""
    shard = shard_lengths(shape, spec, mesh)
    for axis, length in enumerate(shape):
        edges = range(shard[axis], length, shard[axis])
        assert all(edge % chunk[axis] == 0 for edge in edges), (axis, shape, chunk, shard)


def restore(folder: Path, tree: dict, mesh_shape: tuple, names: tuple, specs: dict) -> dict:
    mesh = jax.make_mesh(mesh_shape, names, devices=jax.devices()[: int(np.prod(mesh_shape))])
    target = {
        path: jax.ShapeDtypeStruct(
            value.shape, value.dtype, sharding=NamedSharding(mesh, specs[path])
        )
        for path, value in tree.items()
    }
    return ocp.StandardCheckpointer().restore(folder, target)


# (mesh, rules, arrays, chunk_bytes, the mesh restored on besides: shape, names, specs)
CASES = {
    "1-D": (
        "fsdp=8",
        {"w": ["fsdp", None], "e": [None, "fsdp"]},
        {"w": (64, 48), "e": (6, 64)},
        1024,  # an fsdp shard of w is 1536 bytes: two chunks each
        ((2, 4), ("x", "y"), {"w": P("y", "x"), "e": P(None, "x")}),
    ),
    "2-D": (
        "fsdp=4,tensor=2",
        {"w": ["fsdp", "tensor"], "b": ["tensor"]},
        {"w": (32, 64), "b": (64,)},
        512,
        ((8,), ("x",), {"w": P(None, "x"), "b": P()}),
    ),
    "replicated axis": (
        "fsdp=4,tensor=2",
        {"w": ["fsdp", None], "r": []},
        {"w": (40, 12), "r": (16, 8)},
        384,  # the default chunks here are 8 rows, across the 10-row shards
        ((2, 4), ("a", "b"), {"w": P(("a", "b")), "r": P("b")}),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_chunks_tile_the_shards_and_orbax_restores_on_both_meshes(tmp_path: Path, case: str):
    mesh_text, table, shapes, chunk_bytes, (other_shape, other_names, other_specs) = CASES[case]
    rng = np.random.default_rng(0)
    tree = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    target = suture.TargetSharding(mesh_text, table)
    folder = tmp_path / "ckpt"
    suture.save(tree, folder, progress=False, chunk_bytes=chunk_bytes, target_sharding=target)

    mesh = parse_mesh(mesh_text)
    for name, value in tree.items():
        chunk = written_chunk(folder, name)
        assert np.prod(chunk) * 4 <= chunk_bytes
        assert_tiles(value.shape, chunk, mesh, table[name])
    sharded = written_chunk(folder, next(iter(table)))
    shard = shard_lengths(shapes[next(iter(table))], table[next(iter(table))], mesh)
    assert sharded != shard or np.prod(shard) * 4 <= chunk_bytes  # cut where over the budget

    specs = {name: P(*table[name]) for name in tree}
    on_mesh = restore(folder, tree, tuple(mesh.values()), tuple(mesh), specs)
    elsewhere = restore(folder, tree, other_shape, other_names, other_specs)
    for name, value in tree.items():
        assert on_mesh[name].sharding.spec == specs[name]
        np.testing.assert_array_equal(np.asarray(on_mesh[name]), value)
        np.testing.assert_array_equal(np.asarray(elsewhere[name]), value)


def test_an_uneven_last_shard_is_tiled_and_restores(tmp_path: Path):
    """60 rows over 8: shards of 8 rows, the last of 4 (jax refuses that split, so the
    restores are onto meshes that divide: 4 shards of 15 rows, and replicated)."""
    tree = {"w": np.arange(60 * 16, dtype=np.float32).reshape(60, 16)}
    target = suture.TargetSharding("fsdp=8", {"w": ["fsdp"]})
    suture.save(tree, tmp_path / "ckpt", progress=False, chunk_bytes=512, target_sharding=target)
    chunk = written_chunk(tmp_path / "ckpt", "w")
    assert chunk == (8, 16)  # the default here: 6 rows, across the shards' edges
    assert_tiles((60, 16), chunk, {"fsdp": 8}, ["fsdp"])
    for mesh_shape, spec in (((4,), P("x")), ((8,), P())):
        restored = restore(tmp_path / "ckpt", tree, mesh_shape, ("x",), {"w": spec})
        np.testing.assert_array_equal(np.asarray(restored["w"]), tree["w"])


def test_logical_axis_rules_as_maxtext_writes_them(tmp_path: Path):
    """MaxText's rules (mesh axes it lacks have size 1) and a stacked leaf: one layer per chunk."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "logical_axis_rules:\n"
        "  - [embed, [fsdp, sequence]]\n"
        "  - [mlp, [tensor, expert]]\n"
        "  - [layers, stage]\n"
        "leaves:\n"
        "  'params/.*/wi/kernel': [embed, layers, mlp]\n"
    )
    layers = [np.full((16, 32), index, np.float32) for index in range(3)]
    tree = {"params": {"decoder": {"wi": {"kernel": suture.stack(layers, axis=1)}}}}
    target = suture.TargetSharding({"fsdp": 4, "tensor": 2}, rules)
    suture.save(tree, tmp_path / "ckpt", progress=False, target_sharding=target)
    chunk = written_chunk(tmp_path / "ckpt", "params.decoder.wi.kernel")
    assert chunk == (4, 1, 16)
    spec = P(("fsdp", "sequence"), "stage", ("tensor", "expert"))
    mesh = jax.make_mesh((4, 1, 1, 2, 1), ("fsdp", "sequence", "stage", "tensor", "expert"))
    target_tree = {
        "params": {
            "decoder": {
                "wi": {
                    "kernel": jax.ShapeDtypeStruct(
                        (16, 3, 32), np.float32, sharding=NamedSharding(mesh, spec)
                    )
                }
            }
        }
    }
    restored = ocp.StandardCheckpointer().restore(tmp_path / "ckpt", target_tree)
    np.testing.assert_array_equal(
        np.asarray(restored["params"]["decoder"]["wi"]["kernel"]), np.stack(layers, axis=1)
    )


def test_logical_rules_follow_flax():
    flax_spmd = pytest.importorskip("flax.linen.spmd")
    rules = [
        ("batch", "X"),
        ("features", "X"),
        ("heads", "Y"),
        ("batch", "Z"),
        ("embed", ("fsdp", "sequence")),
        ("mlp", ("tensor", "Y")),
        ("vocab", None),
        ("mlp", "W"),
    ]
    for names in [
        ("batch", "length", "heads", "features"),
        ("embed", "mlp"),
        ("mlp", "heads"),
        ("heads", "mlp"),
        ("vocab", "embed"),
        (None, "features", "batch"),
    ]:
        expected = tuple(flax_spmd.logical_to_mesh_axes(names, rules))
        assert logical_to_mesh_axes(names, rules) == expected, names


def test_jax_shardings_as_the_target(tmp_path: Path):
    mesh = jax.make_mesh((2, 4), ("x", "y"))
    tree = {"a": {"w": np.ones((8, 64), np.float32)}, "n": 3}
    shardings = {"a": {"w": NamedSharding(mesh, P("x", "y"))}, "n": None}
    suture.save(tree, tmp_path / "ckpt", progress=False, target_sharding=shardings)
    assert written_chunk(tmp_path / "ckpt", "a.w") == (4, 16)
    with pytest.raises(suture.ArgumentError, match=r"'a/w' of shape \(6, 64\)"):
        suture.save(
            {"a": {"w": np.ones((6, 64), np.float32)}},
            tmp_path / "other",
            progress=False,
            target_sharding={"a/w": NamedSharding(mesh, P("y"))},
        )


def test_reshard_streams_an_orbax_checkpoint_within_the_budget(tmp_path: Path):
    tree = {"w": np.arange(256 * 64, dtype=np.float32).reshape(256, 64), "step": 7}
    suture.save(tree, tmp_path / "src", progress=False, chunk_bytes="16KiB")
    assert written_chunk(tmp_path / "src", "w") == (64, 64)
    target = suture.TargetSharding("fsdp=8", {"w": ["fsdp", None]})
    result = suture.save(
        tmp_path / "src", tmp_path / "out", progress=False, max_memory="48KiB",
        target_sharding=target,
    )  # fmt: skip
    assert written_chunk(tmp_path / "out", "w") == (32, 64)
    assert 0 < result.peak_in_flight <= 48 << 10  # the array alone is 64 KiB
    restored = ocp.StandardCheckpointer().restore(tmp_path / "out")
    np.testing.assert_array_equal(restored["w"], tree["w"])
    assert restored["step"] == 7


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"leaves": {"w": ["fsdp", None, None]}}, r"'w' has 2 axes, but pattern 'w'"),
        ({"leaves": {"w": ["fsdq"]}}, r"mesh axis 'fsdq', which the mesh fsdp=4"),
        ({"leaves": {"w": ["fsdp", "fsdp"]}}, r"mesh axis 'fsdp' shards two of its axes"),
        ({"leaves": {"x/.*": ["fsdp"]}}, r"match none of the checkpoint's 1 arrays"),
        ({"leaves": {"w": "fsdp"}}, r"the spec 'fsdp' is not a list"),
        ({"leaves": ["w"]}, r"has no 'leaves' table"),
    ],
)
def test_bad_rules_are_refused_before_anything_is_written(tmp_path: Path, rules, message):
    with pytest.raises(suture.ArgumentError, match=message):
        suture.save(
            {"w": np.ones((8, 4), np.float32)},
            tmp_path / "ckpt",
            progress=False,
            target_sharding=suture.TargetSharding("fsdp=4", rules),
        )
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [("fsdp", "is not NAME=SIZE"), ("fsdp=0", "sizes are whole numbers"), ("a=2,a=2", "twice")],
)
def test_bad_meshes_are_refused(text: str, message: str):
    with pytest.raises(suture.ArgumentError, match=message):
        parse_mesh(text)


def test_safetensors_has_no_chunks_to_lay_out(tmp_path: Path):
    with pytest.raises(suture.ArgumentError, match="safetensors has none"):
        suture.save(
            {"w": np.ones(4, np.float32)},
            tmp_path / "w.safetensors",
            format="safetensors",
            target_sharding=suture.TargetSharding("fsdp=2", {"w": ["fsdp"]}),
        )


def test_rules_files_in_json_and_yaml(tmp_path: Path):
    (tmp_path / "r.json").write_text(json.dumps({".*/kernel": [None, ["fsdp", "tensor"]]}))
    rules = ShardingRules.load(tmp_path / "r.json")
    assert rules.spec_for("a/kernel", 3) == (None, ("fsdp", "tensor"), None)
    assert rules.spec_for("a/bias", 1) is None
    (tmp_path / "r.yaml").write_text("leaves: [1, 2]\n")
    with pytest.raises(suture.ArgumentError, match="no 'leaves' table"):
        ShardingRules.load(tmp_path / "r.yaml")


def test_chunk_arithmetic():
    assert shard_lengths((10, 7), ("fsdp", None), {"fsdp": 4}) == (3, 7)
    assert shard_lengths((16, 8), (("a", "b"),), {"a": 2, "b": 4}) == (2, 8)
    assert tiling_chunk((12, 100), 2, 1000) == (4, 100)
    assert tiling_chunk((3, 12, 100), 2, 1 << 20, ones=(0,)) == (1, 12, 100)
    assert tiling_chunk((4, 1000), 4, 1000) == (1, 250)  # a row cut along its own axis
    # a prime length: 1 where the axis is sharded, what fits where it is whole
    assert tiling_chunk((2, 1009), 4, 1000) == (1, 1)
    assert tiling_chunk((2, 1009), 4, 1000, unsharded=(1,)) == (1, 250)
    assert [largest_divisor(n, 6) for n in (12, 7, 1, 36)] == [6, 1, 1, 6]
