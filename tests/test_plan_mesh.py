"""`suture plan --mesh`: the bytes each process of a load onto a mesh reads against what its
shards need, set beside what a real 2-process `jax.distributed` restore by stock Orbax (4 CPU
devices each, 8 in all) reads, counted by TensorStore: at least the chunks the plan names
(TensorStore may fetch a chunk that several of a process's shards share more than once)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

import suture
from suture.cli.app import app
from tests.test_mesh_restore import OVERHEAD, restore_in_two_processes

MESH = {"fsdp": 4, "tensor": 2}
LEAVES = {
    "w": ((512, 256), ["fsdp", "tensor"]),
    "v": ((256, 512), ["fsdp", None]),  # replicated along tensor
    "r": ((64, 256), []),  # replicated
}
RULES = "leaves:\n  w: [fsdp, tensor]\n  v: [fsdp, null]\n  r: []\n"
RECIPE = "rules:\n  - rename: {pattern: '^w$', to: w}\n"


def planned(tmp_path: Path, checkpoint: Path) -> list[dict]:
    done = CliRunner().invoke(
        app,
        ["plan", str(tmp_path / "recipe.yaml"), str(checkpoint), "--mesh", "fsdp=4,tensor=2",
         "--sharding", str(tmp_path / "rules.yaml"), "--processes", "2", "--json"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    return json.loads(done.output)["mesh_reads"]


def test_the_plan_of_a_load_on_a_mesh_says_what_each_process_reads(tmp_path: Path):
    rng = np.random.default_rng(0)
    # random bits: chunks that zstd cannot shrink, so bytes read from files are chunk bytes
    values = {
        name: rng.integers(0, 1 << 32, shape, dtype=np.uint32).view(np.float32)
        for name, (shape, _) in LEAVES.items()
    }
    np.savez(tmp_path / "values.npz", **values)
    (tmp_path / "rules.yaml").write_text(RULES)
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    target = suture.TargetSharding(MESH, tmp_path / "rules.yaml")
    for name, sharding in (("default", None), ("for_mesh", target)):
        suture.save(
            values, tmp_path / name, progress=False, chunk_bytes="1MiB", target_sharding=sharding
        )
    plans = {name: planned(tmp_path, tmp_path / name) for name in ("for_mesh", "default")}
    for name, plan in plans.items():
        assert [p["devices"] for p in plan] == [[0, 1, 2, 3], [4, 5, 6, 7]], name
    # each process: half of w and v, all of r; from the default layout, whole arrays
    half = (512 * 256 + 256 * 512) * 2 + 64 * 256 * 4
    assert [p["needed_bytes"] for p in plans["default"]] == [half, half]
    assert [p["read_bytes"] for p in plans["for_mesh"]] == [half, half]
    assert [p["read_bytes"] for p in plans["default"]] == [2 * half - 64 * 256 * 4] * 2
    assert plans["default"][0]["arrays"]["w"] == {"needed_bytes": 262144, "read_bytes": 524288}
    layout = {
        "checkpoints": [str(tmp_path / "for_mesh"), str(tmp_path / "default")],
        "mesh": MESH,
        "leaves": {name: [list(shape), spec] for name, (shape, spec) in LEAVES.items()},
    }
    for report in restore_in_two_processes(layout):
        process = report["process"]
        for name, real in zip(("for_mesh", "default"), report["checkpoints"], strict=True):
            plan = plans[name][process]
            assert real["needed"] == plan["needed_bytes"], (name, report)
            # the chunks it must read at least; from the layout for the mesh, just those
            assert plan["read_bytes"] <= real["read"], (name, report, plan)
            if name == "for_mesh":
                assert real["read"] <= plan["read_bytes"] + OVERHEAD, (name, report, plan)


def test_the_plan_names_the_arrays_read_beyond_their_shards(tmp_path: Path):
    values = {"w": np.zeros((512, 256), np.float32)}
    suture.save(values, tmp_path / "ckpt", progress=False)
    (tmp_path / "rules.yaml").write_text("leaves:\n  w: [fsdp, null]\n")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    done = CliRunner().invoke(
        app,
        ["plan", str(tmp_path / "recipe.yaml"), str(tmp_path / "ckpt"), "--mesh", "fsdp=8",
         "--sharding", str(tmp_path / "rules.yaml"), "--processes", "8"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert "0        0        64.0 KiB  512.0 KiB  8.00x" in done.output
    assert "w: reads 4.0 MiB for 512.0 KiB (8.00x)" in done.output
    assert "suture reshard" in done.output
    refused = CliRunner().invoke(
        app,
        ["plan", str(tmp_path / "recipe.yaml"), str(tmp_path / "ckpt"), "--mesh", "fsdp=8",
         "--sharding", str(tmp_path / "rules.yaml"), "--processes", "3"],
    )  # fmt: skip
    assert refused.exit_code == 2
    assert "3 processes cannot share the 8 devices" in refused.output


def test_each_devices_shard_is_the_one_jax_gives_it():
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from suture._save.mesh_reads import device_shard

    sizes = {"data": 2, "fsdp": 2, "tensor": 2}
    mesh = jax.make_mesh(tuple(sizes.values()), tuple(sizes))
    cases = [
        ((16, 8), (("fsdp", "data"), "tensor")),  # an axis over two mesh axes, major first
        ((8, 4, 12), (None, "tensor", ("data", "fsdp"))),
        ((16,), ("fsdp",)),  # replicated along data and tensor
    ]
    for shape, spec in cases:
        found = NamedSharding(mesh, P(*spec)).devices_indices_map(shape)
        for number, device in enumerate(mesh.devices.flat):  # row-major, as the plan counts
            expected = tuple(
                range(*index.indices(length))
                for index, length in zip(found[device], shape, strict=True)
            )
            assert device_shard(shape, spec, sizes, number) == expected, (shape, spec, number)


def test_a_mesh_axis_that_does_not_divide_a_leaf_is_refused_as_jax_refuses_the_load(tmp_path):
    from safetensors.numpy import save_file

    save_file({"w": np.zeros((10, 4), np.float32)}, str(tmp_path / "m.safetensors"))
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    (tmp_path / "rules.yaml").write_text("leaves:\n  w: [fsdp, null]\n")
    refused = CliRunner().invoke(
        app,
        ["plan", str(tmp_path / "recipe.yaml"), str(tmp_path / "m.safetensors"),
         "--mesh", "fsdp=4", "--sharding", str(tmp_path / "rules.yaml")],
    )  # fmt: skip
    assert refused.exit_code == 2, refused.output
    assert "'w'" in refused.output and "10" in refused.output and "4 ways" in refused.output
