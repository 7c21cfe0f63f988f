"""`suture reshard`, `convert --mesh/--sharding` and `inspect --chunks`, through CliRunner."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from typer.testing import CliRunner

import suture
from suture.cli import app
from tests.test_cli_help_panels import panels_of
from tests.test_mesh_writes import written_chunk

runner = CliRunner()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    tree = {"a": {"w": np.arange(512 * 64, dtype=np.float32).reshape(512, 64)}, "step": 3}
    suture.save(tree, tmp_path / "src", progress=False, metadata={"run": "r1"})
    (tmp_path / "rules.yaml").write_text("leaves:\n  '.*/w': [fsdp, null]\n")
    return tmp_path / "src"


def test_reshard_rewrites_the_chunks_for_the_mesh_and_keeps_the_rest(source: Path):
    rules, out = source.parent / "rules.yaml", source.parent / "out"
    assert written_chunk(source, "a.w") == (512, 64)  # the default: one chunk
    done = runner.invoke(
        app,
        ["reshard", str(source), str(out), "--mesh", "fsdp=8", "--sharding", str(rules),
         "--max-memory", "1MiB", "--chunk-bytes", "16KiB", "--no-progress"],
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    assert written_chunk(out, "a.w") == (64, 64)  # one fsdp shard of 16 KiB per chunk
    restored = ocp.StandardCheckpointer().restore(out)
    np.testing.assert_array_equal(restored["a"]["w"], suture.open(source)["a/w"].read())
    assert restored["step"] == 3
    assert suture.open(out).custom_metadata == {"run": "r1"}


def test_inspect_chunks_says_what_a_device_reads_for_its_shard(source: Path):
    rules = str(source.parent / "rules.yaml")
    before = runner.invoke(app, ["inspect", str(source), "--chunks", "--mesh", "fsdp=8",
                                 "--sharding", rules])  # fmt: skip
    assert before.exit_code == 0, before.output
    assert "(512, 64)  (1, 1)" in before.output
    assert "reads 128.0 KiB for the 16.0 KiB of its shards (8.00x)" in before.output
    out = source.parent / "out"
    done = runner.invoke(app, ["convert", str(source), str(out), "--mesh", "fsdp=8",
                               "--sharding", rules, "--no-progress"])  # fmt: skip
    assert done.exit_code == 0, done.output
    after = runner.invoke(app, ["inspect", str(out), "--chunks", "--mesh", "fsdp=8",
                                "--sharding", rules])  # fmt: skip
    assert "(64, 64)  (8, 1)" in after.output
    assert "(1.00x)" in after.output


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--mesh", "fsdp=8"], "--mesh and --sharding go together"),
        (["--sharding", "RULES"], "add --mesh fsdp=8,tensor=2"),
        (["--mesh", "fsdp:8", "--sharding", "RULES"], "is not NAME=SIZE"),
    ],
)
def test_reshard_refuses_half_a_target(source: Path, arguments: list[str], message: str):
    arguments = [a.replace("RULES", str(source.parent / "rules.yaml")) for a in arguments]
    done = runner.invoke(app, ["reshard", str(source), str(source.parent / "o"), *arguments])
    assert done.exit_code == 2
    assert message in done.output
    assert "--recipe" not in done.output  # reshard has no such option to offer
    assert not (source.parent / "o").exists()


def test_reshard_takes_orbax_only(tmp_path: Path):
    from safetensors.numpy import save_file

    save_file({"w": np.ones((8, 2), np.float32)}, str(tmp_path / "w.safetensors"))
    (tmp_path / "r.yaml").write_text("leaves: {w: [fsdp]}\n")
    done = runner.invoke(app, ["reshard", str(tmp_path / "w.safetensors"), str(tmp_path / "o"),
                               "--mesh", "fsdp=2", "--sharding", str(tmp_path / "r.yaml")])  # fmt: skip
    assert done.exit_code == 2
    assert "reshard rewrites Orbax checkpoints" in done.output


def test_convert_lists_mesh_and_sharding_in_the_output_panel():
    done = runner.invoke(app, ["convert", "--help"], env={"COLUMNS": "120"}, terminal_width=120)
    panels = panels_of(done.output)
    assert "--mesh" in panels["Output"] and "--sharding" in panels["Output"]


def test_convert_given_a_mesh_alone_offers_a_builtin_recipe(source: Path):
    done = runner.invoke(
        app, ["convert", str(source), str(source.parent / "o"), "--mesh", "fsdp=8"]
    )
    assert done.exit_code == 2
    assert "--mesh and --sharding go together" in done.output
    assert "--recipe FAMILY:maxtext" in done.output  # convert takes one: with it the mesh will do
    assert not (source.parent / "o").exists()
