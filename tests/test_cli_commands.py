"""The commands that work on checkpoints' data: inspect --stats, diff, plan, apply."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from typer.testing import CliRunner

import suture
from suture.cli import app
from tests.orbax_writers import save_standard

runner = CliRunner()


@pytest.fixture
def model(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    state = {
        "params": {
            f"layer{i}": {"w": rng.standard_normal((16, 16), dtype=np.float32)} for i in range(3)
        },
        "opt_state": {"mu": {f"layer{i}": {"w": np.zeros((16, 16), np.float32)} for i in range(3)}},
        "step": np.asarray(4, np.int32),
    }
    save_standard(tmp_path / "model", state)
    return tmp_path / "model"


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(
        "rules:\n"
        "  - drop: opt_state\n"
        "  - stack: {pattern: 'params/layer(?P<i>\\d+)', into: params/layers}\n"
        "  - cast: {pattern: params, dtype: bfloat16}\n"
    )
    return path


def test_inspect_stats(tmp_path: Path) -> None:
    values = np.array([[1.0, 2.0], [np.nan, 5.0]], np.float32)
    save_standard(tmp_path / "ckpt", {"w": values, "z": np.zeros(3, np.int8)})
    result = runner.invoke(app, ["inspect", str(tmp_path / "ckpt"), "--stats"])
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if line.startswith("w "))
    assert line.split()[-5:] == ["1", "5", "2.66667", "1.69967", "1"]
    report = json.loads(
        runner.invoke(app, ["inspect", str(tmp_path / "ckpt"), "--stats", "--json"]).output
    )
    stats = {leaf["path"]: leaf["stats"] for leaf in report["leaves"]}
    assert stats["w"] == {
        "count": 3,
        "nan_count": 1,
        "min": 1.0,
        "max": 5.0,
        "mean": pytest.approx(8 / 3),
        "std": pytest.approx(np.std([1, 2, 5])),
    }
    assert stats["z"]["max"] == 0.0


def test_diff_structure_and_exit_codes(tmp_path: Path, model: Path) -> None:
    same = runner.invoke(app, ["diff", str(model), str(model)])
    assert same.exit_code == 0 and "Equal." in same.output
    save_standard(
        tmp_path / "other",
        {
            "params": {"layer0": {"w": np.zeros((16, 8), np.float32)}},
            "step": np.asarray(4, np.int64),
        },
    )
    different = runner.invoke(app, ["diff", str(model), str(tmp_path / "other")])
    assert different.exit_code == 1
    assert "- params/layer1/w  (only in A)" in different.output
    assert "~ params/layer0/w  shape: (16, 16) -> (16, 8)" in different.output
    assert "~ step  dtype: int32 -> int64" in different.output
    report = json.loads(
        runner.invoke(app, ["diff", str(model), str(tmp_path / "other"), "--json"]).output
    )
    assert report["equal"] is False and "opt_state/mu/layer2/w" in report["only_a"]
    missing = runner.invoke(app, ["diff", str(model), str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and missing.stderr.startswith("Error: No such file or folder")


def test_diff_values_finds_one_element_in_100_mib(tmp_path: Path) -> None:
    big = np.random.default_rng(0).standard_normal((6400, 4096), dtype=np.float32)  # 100 MiB
    changed = big.copy()
    changed[5000, 17] += 1e-3
    suture.save({"big": big}, tmp_path / "a", progress=False)
    suture.save({"big": changed}, tmp_path / "b", progress=False)
    suture.save({"big": big}, tmp_path / "c", progress=False)
    structure_only = runner.invoke(app, ["diff", str(tmp_path / "a"), str(tmp_path / "b")])
    assert structure_only.exit_code == 0 and "add --values" in structure_only.output
    found = runner.invoke(app, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--values"])
    assert found.exit_code == 1
    assert "~ big  values: 1 elements differ" in found.output
    tolerant = runner.invoke(
        app, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--values", "--atol", "0.01"]
    )
    assert tolerant.exit_code == 0
    equal = runner.invoke(app, ["diff", str(tmp_path / "a"), str(tmp_path / "c"), "--values"])
    assert equal.exit_code == 0 and equal.output.strip() == "Equal."


def test_plan_command(model: Path, recipe: Path) -> None:
    result = runner.invoke(app, ["plan", str(recipe), str(model)])
    assert result.exit_code == 0, result.output
    assert "params/layers/w" in result.output and "stack 3 on axis 0 as bfloat16" in result.output
    assert "Dropped (never read): 3 leaves" in result.output and "No problems." in result.output
    report = json.loads(runner.invoke(app, ["plan", str(recipe), str(model), "--json"]).output)
    assert report["ok"] and report["dropped"] == [f"opt_state/mu/layer{i}/w" for i in range(3)]


def test_plan_with_problems_exits_2(model: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- rename: {pattern: nope, to: x}\n")
    result = runner.invoke(app, ["plan", str(bad), str(model)])
    assert result.exit_code == 2 and "rename('nope', 'x') matches no path" in result.output


def test_apply_dry_run_then_apply(tmp_path: Path, model: Path, recipe: Path) -> None:
    dry = runner.invoke(
        app, ["apply", str(recipe), str(model), "-o", str(tmp_path / "out"), "--dry-run"]
    )
    assert (
        dry.exit_code == 0 and "params/layers/w" in dry.output and not (tmp_path / "out").exists()
    )
    done = runner.invoke(
        app,
        [
            "apply",
            str(recipe),
            str(model),
            "-o",
            str(tmp_path / "out"),
            "--max-memory",
            "4MiB",
            "--no-progress",
        ],
    )
    assert done.exit_code == 0, done.output
    out = suture.open(tmp_path / "out")
    assert (
        out["params/layers/w"].shape == (3, 16, 16)
        and out["params/layers/w"].dtype == ml_dtypes.bfloat16
    )
    again = runner.invoke(app, ["apply", str(recipe), str(model), "-o", str(tmp_path / "out")])
    assert (
        again.exit_code == 2 and "already exists. Pass overwrite=True (--overwrite)" in again.stderr
    )


def _codecs(folder: Path, leaf: str) -> list[str]:
    """The zarr3 codecs suture wrote for `leaf`, as stock Orbax's TensorStore reads them."""
    spec = {
        "driver": "zarr3",
        "kvstore": {"driver": "ocdbt", "base": f"file://{folder}", "path": leaf},
    }
    return [
        codec["name"] for codec in ts.open(spec).result().spec().to_json()["metadata"]["codecs"]
    ]


@pytest.mark.parametrize("command", ["apply", "convert", "merge", "reshard"])
def test_every_writing_command_takes_compression_none(
    tmp_path: Path, model: Path, recipe: Path, command: str
) -> None:
    """--compression none writes chunks as they are (with a checksum) from each command that
    writes Orbax output; stock Orbax restores the same values as from the default's."""
    out = tmp_path / "out"
    if command == "apply":
        arguments = ["apply", str(recipe), str(model), "-o", str(out)]
    elif command == "convert":
        arguments = ["convert", str(model), str(out)]
    elif command == "merge":
        (tmp_path / "merge.yaml").write_text(f"method: linear\nmodels: [{model}, {model}]\n")
        arguments = ["merge", str(tmp_path / "merge.yaml"), "-o", str(out), "--format", "orbax"]
    else:
        (tmp_path / "rules.yaml").write_text("'.*': [fsdp]\n")
        arguments = ["reshard", str(model), str(out), "--mesh", "fsdp=2"]
        arguments += ["--sharding", str(tmp_path / "rules.yaml")]
    done = runner.invoke(app, [*arguments, "--compression", "none", "--no-progress"])
    assert done.exit_code == 0, done.output
    arrays = suture.open(out).arrays()
    leaf = next(path for path, array in arrays.items() if array.shape[-2:] == (16, 16))
    leaf = leaf.replace("/", ".")
    assert _codecs(out, leaf) == ["bytes", "crc32c"]
    restored = ocp.PyTreeCheckpointer().restore(out)
    expected = ocp.PyTreeCheckpointer().restore(model)
    got = dict(suture._paths.flatten(restored))
    for key, value in suture._paths.flatten(expected).items():
        if key in got and np.ndim(value) == 2:
            np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_compression_none_on_an_adapter_export_is_refused(tmp_path: Path, model: Path) -> None:
    done = runner.invoke(
        app,
        ["convert", str(model), str(tmp_path / "a"), "--adapter-only", "--compression", "none"],
    )
    assert done.exit_code == 2
    assert "An adapter-only export is a PEFT folder of safetensors" in done.output
    assert "drop compression=/--compression" in done.output
    assert not (tmp_path / "a").exists()


def test_apply_python_recipe_with_several_sources_and_dtype(tmp_path: Path) -> None:
    save_standard(tmp_path / "image", {"params": {"w": np.ones((2, 2), np.float32)}})
    save_standard(tmp_path / "text", {"params": {"w": np.full((3, 3), 2.0, np.float32)}})
    recipe = tmp_path / "merge.py"
    recipe.write_text(
        "def transform(image, text):\n    return {'image': image['params'], 'text': text['params']}\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "suture",
            "apply",
            str(recipe),
            str(tmp_path / "image"),
            str(tmp_path / "text"),
            "-o",
            str(tmp_path / "merged.safetensors"),
            "--format",
            "safetensors",
            "--dtype",
            "float16",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    merged = suture.open(tmp_path / "merged.safetensors")
    assert merged["image/w"].dtype == np.float16
    np.testing.assert_array_equal(merged["text/w"].read(), np.full((3, 3), 2.0, np.float16))


def test_sizes_accept_units_and_bad_ones_are_clear(
    tmp_path: Path, model: Path, recipe: Path
) -> None:
    result = runner.invoke(
        app, ["apply", str(recipe), str(model), "-o", str(tmp_path / "out"), "--max-memory", "lots"]
    )
    assert result.exit_code == 2 and "Cannot read 'lots' as a size" in result.stderr
