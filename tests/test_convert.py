"""suture convert and recipe files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

import suture
from suture._surgery.recipes import load_recipe
from suture.cli import app
from tests.orbax_writers import save_standard
from tests.sources.test_formats import hf_folder

runner = CliRunner()


def read_folder(folder: Path) -> tuple[dict, dict, dict]:
    """(tensors by name, index json, metadata by shard) of a safetensors folder."""
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    tensors, metadata = {}, {}
    for filename in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(folder / filename))
        with safe_open(folder / filename, framework="np") as opened:
            metadata[filename] = opened.metadata()
    return tensors, index, metadata


def test_hf_folder_to_orbax_and_back_is_identical(tmp_path: Path) -> None:
    original = hf_folder(tmp_path / "hf", shards=3)
    to_orbax = runner.invoke(
        app, ["convert", str(tmp_path / "hf"), str(tmp_path / "orbax"), "--no-progress"]
    )
    assert to_orbax.exit_code == 0, to_orbax.output
    assert "Wrote" in to_orbax.output and "(orbax)" in to_orbax.output
    restored = ocp.StandardCheckpointer().restore(tmp_path / "orbax")  # stock Orbax reads it
    np.testing.assert_array_equal(
        restored["model"]["layers"]["2"]["mlp"]["up_proj"]["weight"],
        original["model.layers.2.mlp.up_proj.weight"],
    )
    assert (tmp_path / "orbax" / "config.json").read_text() == (
        tmp_path / "hf" / "config.json"
    ).read_text()

    back = runner.invoke(
        app,
        [
            "convert",
            str(tmp_path / "orbax"),
            str(tmp_path / "back"),
            "--format",
            "safetensors",
            "--no-progress",
        ],
    )
    assert back.exit_code == 0, back.output
    tensors, index, metadata = read_folder(tmp_path / "back")
    source_tensors, source_index, source_metadata = read_folder(tmp_path / "hf")
    assert sorted(tensors) == sorted(source_tensors)
    for name, value in source_tensors.items():
        assert tensors[name].dtype == value.dtype
        assert tensors[name].tobytes() == value.tobytes(), name  # bit-identical
    assert index == source_index  # same shards, same weight_map, same total_size
    assert metadata == source_metadata
    assert (tmp_path / "back" / "config.json").exists()


def test_safetensors_to_safetensors_keeps_the_shards(tmp_path: Path) -> None:
    hf_folder(tmp_path / "hf", shards=3)
    suture.convert(tmp_path / "hf", tmp_path / "copy", format="safetensors", progress=False)
    assert read_folder(tmp_path / "copy")[1] == read_folder(tmp_path / "hf")[1]


def test_convert_with_dtype_and_a_real_process(tmp_path: Path) -> None:
    save_standard(
        tmp_path / "ckpt", {"w": np.arange(6, dtype=np.float32), "step": np.asarray(3, np.int32)}
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "suture",
            "convert",
            str(tmp_path / "ckpt"),
            str(tmp_path / "out.safetensors"),
            "--dtype",
            "bfloat16",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    loaded = load_file(tmp_path / "out.safetensors")
    assert loaded["w"].dtype == ml_dtypes.bfloat16 and loaded["step"].dtype == np.int32


def test_convert_with_a_yaml_recipe(tmp_path: Path) -> None:
    save_standard(
        tmp_path / "ckpt",
        {"params": {"linear1": {"w": np.ones(2, np.float32)}}, "opt_state": {"mu": np.ones(2)}},
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "rules:\n  - drop: opt_state\n  - rename: {pattern: 'params/linear(\\d)', to: 'params/layer\\1'}\n"
    )
    result = runner.invoke(
        app,
        [
            "convert",
            str(tmp_path / "ckpt"),
            str(tmp_path / "out"),
            "--rules",
            str(recipe),
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert suture.open(tmp_path / "out").paths() == ["params/layer1/w"]


def test_pytorch_needs_allow_pickle_on_the_command_line(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    torch.save({"layer.weight": torch.ones(2, 2)}, tmp_path / "model.bin")
    refused = runner.invoke(
        app, ["convert", str(tmp_path / "model.bin"), str(tmp_path / "out.safetensors")]
    )
    assert refused.exit_code == 2 and "unpickling can run code" in refused.stderr
    allowed = runner.invoke(
        app,
        [
            "convert",
            str(tmp_path / "model.bin"),
            str(tmp_path / "out.safetensors"),
            "--allow-pickle",
            "--no-progress",
        ],
    )
    assert allowed.exit_code == 0, allowed.output
    np.testing.assert_array_equal(
        load_file(tmp_path / "out.safetensors")["layer.weight"], np.ones((2, 2), np.float32)
    )


def test_python_and_toml_recipes(tmp_path: Path) -> None:
    python_recipe = tmp_path / "recipe.py"
    python_recipe.write_text(
        "from suture import rules\nRULES = [rules.drop('opt_state'), rules.cast('params', 'float16')]\n"
    )
    assert [repr(rule) for rule in load_recipe(python_recipe).transform] == [
        "drop('opt_state')",
        "cast('params', 'float16')",
    ]
    toml_recipe = tmp_path / "recipe.toml"
    toml_recipe.write_text(
        '[[rules]]\nrule = "stack"\npattern = "layer(\\\\d+)"\ninto = "layers"\n'
    )
    assert repr(load_recipe(toml_recipe).transform[0]) == "stack('layer(\\\\d+)', into='layers')"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "rules:\n  - drop: opt\n  - renam: {pattern: a, to: b}\n",
            r"line 3: unknown rule 'renam'\. Known rules: rename, drop",
        ),
        (
            "rules:\n  - rename: {pattern: a, too: b}\n",
            r"line 2: rename: unknown field 'too'\. Fields of rename: pattern, to, optional",
        ),
        ("rules: []\n", r"holds no rules"),
        ("rules:\n  - drop: a\n    keep: b\n", r"line 2: a rule is one name with its arguments"),
        ("rules: [\n", r"is not valid YAML"),
        ("- !!python/object/apply:os.system ['echo hacked']\n", r"is not valid YAML"),
    ],
)
def test_bad_yaml_recipes_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    with pytest.raises(suture.SurgeryError, match=message):
        load_recipe(recipe)


def test_recipe_files_that_are_not_recipes(tmp_path: Path) -> None:
    with pytest.raises(suture.SurgeryError, match="does not exist"):
        load_recipe(tmp_path / "missing.yaml")
    (tmp_path / "r.json").write_text("[]")
    with pytest.raises(suture.SurgeryError, match=r"expected a \.py, \.yaml, \.yml or \.toml file"):
        load_recipe(tmp_path / "r.json")
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(suture.SurgeryError, match=r"defines neither RULES"):
        load_recipe(tmp_path / "empty.py")
    (tmp_path / "broken.py").write_text("RULES = [\n")
    with pytest.raises(suture.SurgeryError, match=r"broken.py', line 1"):
        load_recipe(tmp_path / "broken.py")
    (tmp_path / "bad.toml").write_text("[[rules]]\npattern = 'x'\n")
    with pytest.raises(
        suture.SurgeryError, match=r"line 1: each \[\[rules\]\] table needs rule = "
    ):
        load_recipe(tmp_path / "bad.toml")


def test_convert_refuses_an_existing_destination(tmp_path: Path) -> None:
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "a.safetensors")
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "b.safetensors")
    result = runner.invoke(
        app, ["convert", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]
    )
    assert result.exit_code == 2 and "already exists. Pass overwrite=True" in result.stderr
