"""Names and paths a write cannot honour end in `Error:` and exit 2, before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import suture
from suture.sinks.names import MAX_ORBAX_NAME_BYTES


def _cli(*arguments: str | bytes, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable.encode(), b"-m", b"suture"]
    command += [a if isinstance(a, bytes) else a.encode() for a in arguments]
    return subprocess.run(command, cwd=cwd, capture_output=True, timeout=120)


def _refused(result: subprocess.CompletedProcess, message: str) -> None:
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == 2, stderr
    assert stderr.startswith("Error: ") and "Traceback" not in stderr, stderr
    assert message in stderr, stderr


def test_output_into_a_missing_folder(tmp_path: Path) -> None:
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "m.safetensors")
    missing = str(tmp_path / "missing" / "dir" / "out")
    _refused(_cli("convert", "m.safetensors", missing, cwd=tmp_path), "does not exist. Create it")


def test_non_utf8_paths_read_and_write(tmp_path: Path) -> None:
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "m.safetensors")
    _refused(_cli("convert", "m.safetensors", b"out\xff", cwd=tmp_path), "is not a UTF-8 path")
    suture.save({"w": np.ones(2, np.float32)}, tmp_path / "ckpt", progress=False)
    os.rename(tmp_path / "ckpt", os.path.join(os.fsencode(tmp_path), b"ckpt\xff"))
    _refused(_cli("inspect", b"ckpt\xff", cwd=tmp_path), "is not a UTF-8 path")
    # safetensors goes through the file system's bytes: a non-UTF-8 name reads and writes.
    os.rename(tmp_path / "m.safetensors", os.path.join(os.fsencode(tmp_path), b"m\xff.safetensors"))
    result = _cli("convert", b"m\xff.safetensors", b"o\xff.safetensors", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (
        load_file(os.fsdecode(os.path.join(os.fsencode(tmp_path), b"o\xff.safetensors")))["w"].sum()
        == 2
    )


@pytest.mark.parametrize("output", ["orbax", "safetensors"])
def test_an_empty_tensor_name_is_refused_on_write(tmp_path: Path, output: str) -> None:
    """Item 7: a tensor named '' used to convert with exit 0 into an unreadable Orbax output."""
    save_file({"": np.ones(2, np.float32), "w": np.ones(2, np.float32)}, tmp_path / "m.safetensors")
    destination = "out" if output == "orbax" else "out.safetensors"
    result = _cli("convert", "m.safetensors", destination, cwd=tmp_path)
    _refused(result, "is empty: a reader could not address it")
    assert not (tmp_path / destination).exists()


def test_reserved_and_undecodable_safetensors_names_are_refused(tmp_path: Path) -> None:
    for name, message in [
        ("__metadata__", "is reserved by safetensors"),
        ("w\udcff", "is not valid Unicode"),
    ]:
        with pytest.raises(suture.SurgeryError, match=message):
            suture.save(
                {name: np.ones(2, np.float32)},
                tmp_path / "o.safetensors",
                format="safetensors",
                separator="/",
                progress=False,
            )
    assert not (tmp_path / "o.safetensors").exists()


def test_a_name_too_long_for_an_orbax_key(tmp_path: Path) -> None:
    """Over 65,535 characters used to crash TensorStore's open with a traceback."""
    long_name = "x" * 70_000
    save_file({long_name: np.ones(2, np.float32)}, tmp_path / "m.safetensors")
    _refused(_cli("convert", "m.safetensors", "out", cwd=tmp_path), "an Orbax (OCDBT) key holds")
    assert MAX_ORBAX_NAME_BYTES < 65_535
    result = _cli("convert", "m.safetensors", "out.safetensors", cwd=tmp_path)
    assert result.returncode == 0  # safetensors holds it, and reads it back
    assert list(load_file(tmp_path / "out.safetensors")) == [long_name]


def test_two_leaves_with_one_orbax_name_are_refused(tmp_path: Path) -> None:
    tree = {"a.b": np.ones(2, np.float32), "a": {"b": np.zeros(2, np.float32)}}
    with pytest.raises(suture.SurgeryError, match=r"would both be stored as 'a\.b'"):
        suture.save(tree, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_safetensors_names_that_collide_as_tree_paths_are_refused(tmp_path: Path) -> None:
    """'a.b' and 'a/b' used to become one leaf, silently dropping a tensor."""
    save_file(
        {"a.b": np.ones(2, np.float32), "a/b": np.zeros(2, np.float32)}, tmp_path / "m.safetensors"
    )
    with pytest.raises(suture.SurgeryError, match=r"both become the tree path 'a/b'"):
        suture.open(tmp_path / "m.safetensors")
    assert len(suture.open(tmp_path / "m.safetensors", separator="/").arrays()) == 2


def _safetensors_with_header(path: Path, header: dict, data: bytes = b"") -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + data)


def test_safetensors_overflowing_shape_and_deep_names(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    _safetensors_with_header(
        path, {"w": {"dtype": "F32", "shape": [0, 2**70], "data_offsets": [0, 0]}}
    )
    _refused(_cli("inspect", "m.safetensors", cwd=tmp_path), "more than 2**62 bytes")
    save_file({".".join(["a"] * 1500): np.ones(2, np.float32)}, path)
    _refused(_cli("inspect", "m.safetensors", cwd=tmp_path), "nested 1500 levels deep")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda layout: layout.update(weight_map={"w": "model.safetensors.index.json"}),
            "must be a plain file name ending in .safetensors",
        ),
        (
            lambda layout: layout.update(weight_map={"w": "../escape.safetensors"}),
            "must be a plain file name",
        ),
        (lambda layout: layout.update(separator=5), "has separator = 5"),
        (lambda layout: layout.update(metadata={"a": 1}), "has metadata = {'a': 1}"),
        (
            lambda layout: layout.update(side_files=[["x"]]),
            "lists side files that are not file names",
        ),
    ],
)
def test_hostile_recorded_safetensors_layout(tmp_path: Path, edit, message: str) -> None:
    """Orbax custom metadata is input too: a shard named like the index once corrupted it."""
    folder = tmp_path / "hf"
    folder.mkdir()
    save_file(
        {"w": np.ones(2, np.float32), "v": np.ones(2, np.float32)}, folder / "model-1.safetensors"
    )
    (folder / "model.safetensors.index.json").write_text(
        json.dumps(
            {"metadata": {}, "weight_map": {"w": "model-1.safetensors", "v": "model-1.safetensors"}}
        )
    )
    suture.convert(folder, tmp_path / "ckpt", progress=False)
    recorded = tmp_path / "ckpt" / "_CHECKPOINT_METADATA"
    metadata = json.loads(recorded.read_text())
    edit(metadata["custom_metadata"]["suture.safetensors_layout"])
    recorded.write_text(json.dumps(metadata))
    _refused(_cli("convert", "ckpt", "back", "--format", "safetensors", cwd=tmp_path), message)
    assert not (tmp_path / "back").exists()


def test_overwrite_never_leaves_the_destination_missing(tmp_path: Path, monkeypatch) -> None:
    """Item 12: the old result used to be renamed away before the new one moved in."""
    destination = tmp_path / "out"
    suture.save({"w": np.zeros(2, np.float32)}, destination, progress=False)
    missing_at: list[str] = []
    real_rename, real_replace = os.rename, os.replace

    def watching(operation):
        def run(source, target, *args, **kwargs):
            if not destination.exists():
                missing_at.append(f"{operation.__name__}({source}, {target})")
            return operation(source, target, *args, **kwargs)

        return run

    monkeypatch.setattr(os, "rename", watching(real_rename))
    monkeypatch.setattr(os, "replace", watching(real_replace))
    for value in (1, 2):  # folder over folder, twice
        suture.save(
            {"w": np.full(2, value, np.float32)}, destination, overwrite=True, progress=False
        )
        assert not missing_at, missing_at
        assert destination.exists() and suture.open(destination)["w"].read()[0] == value
    single = tmp_path / "m.safetensors"
    for value in (1, 2):  # file over file
        suture.save(
            {"w": np.full(2, value, np.float32)},
            single,
            format="safetensors",
            overwrite=True,
            progress=False,
        )
        assert not missing_at, missing_at
    assert load_file(single)["w"][0] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors", "out"]


def test_overwrite_without_an_atomic_exchange_still_replaces(tmp_path: Path, monkeypatch) -> None:
    from suture._location import publish

    monkeypatch.setattr(publish, "_exchange", lambda first, second: False)
    destination = tmp_path / "out"
    suture.save({"w": np.zeros(2, np.float32)}, destination, progress=False)
    suture.save({"w": np.ones(2, np.float32)}, destination, overwrite=True, progress=False)
    assert suture.open(destination)["w"].read().tolist() == [1, 1]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_overwrite_refuses_what_is_not_a_checkpoint(tmp_path: Path, kind: str) -> None:
    destination = tmp_path / "precious"
    if kind == "folder":
        destination.mkdir()
        (destination / "thesis.tex").write_text("years of work")
    else:
        destination.write_text("years of work")
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "m.safetensors")
    result = _cli("convert", "m.safetensors", "precious", "--overwrite", cwd=tmp_path)
    _refused(result, "--overwrite replaces only a checkpoint, and")
    assert "is not one that suture recognizes" in result.stderr.decode()
    kept = destination / "thesis.tex" if kind == "folder" else destination
    assert kept.read_text() == "years of work"


@pytest.mark.parametrize("dtype", ["float8_e4m3", "float6_e3m2fn", "uint4"])
def test_a_dtype_orbax_cannot_store_is_refused_naming_the_leaf(tmp_path: Path, dtype: str) -> None:
    """ml_dtypes has more dtypes than TensorStore's zarr3 driver stores: a raw ValueError
    traceback from TensorStore, before."""
    suture.save({"w": np.arange(8, dtype=np.float32)}, tmp_path / "src", progress=False)
    result = _cli("convert", "src", "out", "--dtype", dtype, cwd=tmp_path)
    _refused(result, f"Leaf 'w' has dtype {dtype}, which TensorStore's zarr3 driver")
    assert b"--format safetensors" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    written = _cli("convert", "src", "out", "--dtype", "float8_e4m3fn", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
