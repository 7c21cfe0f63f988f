"""Metadata that once read wrong or crashed: a missing Orbax chunk read as zeros, entries of
`_METADATA` that replaced one another, JSON nested past the parser, shapes whose sizes
overflow beside a 0, a pipe named like a shard, and a folder of two indexes.

Each is now a `SurgeryError` naming the file and what is wrong (or, for two indexes, the
index Hugging Face's tools read); where stock Orbax reads the same checkpoint, it fails too.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file
from typer.testing import CliRunner

import suture
from suture.cli import app


def orbax_checkpoint(path: Path, tree: dict, zarr3: bool = True) -> Path:
    ocp.PyTreeCheckpointer(use_ocdbt=False, use_zarr3=zarr3).save(path, tree)
    return path


@pytest.mark.parametrize("zarr3", [False, True])
def test_a_missing_orbax_chunk_is_an_error_as_in_orbax_not_zeros(tmp_path: Path, zarr3) -> None:
    path = orbax_checkpoint(tmp_path / "ckpt", {"w": np.ones((64, 32), np.float32)}, zarr3)
    (path / ("w/c/0/0" if zarr3 else "w/0.0")).unlink()
    with pytest.raises(ValueError, match="NOT_FOUND"):  # stock Orbax refuses it too
        ocp.PyTreeCheckpointer().restore(path)
    with pytest.raises(suture.CorruptCheckpointError, match=r"Leaf 'w' .* is missing"):
        suture.open(path)["w"].read()
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["convert", str(path), str(out)])
    assert result.exit_code == 2 and "is missing" in result.output
    assert not out.exists()


def test_an_enlarged_zarr_shape_does_not_read_as_zeros(tmp_path: Path) -> None:
    path = orbax_checkpoint(tmp_path / "ckpt", {"w": np.ones((64, 32), np.float32)}, zarr3=False)
    described = json.loads((path / "w/.zarray").read_text())
    described["shape"] = [1 << 20, 32]
    (path / "w/.zarray").write_text(json.dumps(described))
    lazy = suture.open(path)["w"]
    assert lazy[:64].read().tolist() == np.ones((64, 32)).tolist()  # the stored chunk reads
    with pytest.raises(suture.CorruptCheckpointError, match="is missing"):
        lazy[1000:1004].read()


def test_a_checkpoint_that_stores_no_fill_chunks_still_reads_them_as_fill(tmp_path: Path) -> None:
    """Orbax before `store_array_data_equal_to_fill_value` skipped chunks equal to the fill
    value; both Orbax and suture read those as the fill value, as they were written."""
    path = orbax_checkpoint(tmp_path / "ckpt", {"w": np.zeros((64, 32), np.float32)}, zarr3=False)
    metadata = json.loads((path / "_METADATA").read_text())
    metadata.pop("store_array_data_equal_to_fill_value", None)
    (path / "_METADATA").write_text(json.dumps(metadata))
    for chunk in (path / "w").glob("[0-9]*"):
        chunk.unlink()
    assert ocp.PyTreeCheckpointer().restore(path)["w"].sum() == 0
    assert suture.open(path)["w"].read().tolist() == np.zeros((64, 32)).tolist()


def _edited_metadata(tmp_path: Path, edit) -> Path:
    tree = {"params": {"w": np.ones((4, 2), np.float32), "b": np.arange(2, dtype=np.float32)}}
    path = orbax_checkpoint(tmp_path / "ckpt", tree)
    metadata = json.loads((path / "_METADATA").read_text())
    edit(metadata["tree_metadata"])
    (path / "_METADATA").write_text(json.dumps(metadata))
    return path


NONE_AT_PARAMS = {
    "key_metadata": [{"key": "params", "key_type": 2}],
    "value_metadata": {"value_type": "None"},
}


@pytest.mark.parametrize("first", [True, False])
def test_a_leaf_and_a_subtree_at_one_key_are_refused_in_either_order(tmp_path, first) -> None:
    def edit(entries: dict) -> None:
        kept = dict(entries)
        entries.clear()
        if first:
            entries["x"] = NONE_AT_PARAMS
        entries.update(kept)
        entries["x"] = NONE_AT_PARAMS

    path = _edited_metadata(tmp_path, edit)
    with pytest.raises(
        suture.CorruptCheckpointError, match="a leaf and a subtree at one key, 'params'"
    ):
        suture.open(path)


def test_a_leaf_listed_twice_is_refused(tmp_path: Path) -> None:
    def edit(entries: dict) -> None:
        again = json.loads(json.dumps(entries["('params', 'b')"]))
        again["value_metadata"]["value_type"] = "None"
        entries["again"] = again

    path = _edited_metadata(tmp_path, edit)
    with pytest.raises(suture.CorruptCheckpointError, match="lists the leaf 'params/b' twice"):
        suture.load(path)


DEEP = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def test_json_nested_past_the_parser_is_refused_in_every_metadata_file(tmp_path: Path) -> None:
    shard = tmp_path / "m.safetensors"
    shard.write_bytes(struct.pack("<Q", len(DEEP)) + DEEP)
    with pytest.raises(suture.CorruptCheckpointError, match="nested more deeply"):
        suture.open(shard)
    result = CliRunner().invoke(app, ["inspect", str(shard)])
    assert result.exit_code == 2 and "nested more deeply" in result.output

    folder = tmp_path / "hf"
    folder.mkdir()
    save_file({"a": np.ones(2, np.float32)}, folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_bytes(DEEP)
    with pytest.raises(suture.CorruptCheckpointError, match="nested more deeply"):
        suture.open(folder)

    path = orbax_checkpoint(tmp_path / "ckpt", {"w": np.ones(2, np.float32)})
    (path / "_METADATA").write_bytes(DEEP)
    with pytest.raises(suture.CorruptCheckpointError, match="nested more deeply"):
        suture.open(path)


def test_sizes_that_overflow_beside_a_zero_are_refused_at_the_open(tmp_path: Path) -> None:
    header = json.dumps(
        {"a": {"dtype": "F32", "shape": [1 << 40, 1 << 40, 0], "data_offsets": [0, 0]}}
    ).encode()
    shard = tmp_path / "m.safetensors"
    shard.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(suture.CorruptCheckpointError, match=r"multiplying to more than 2\*\*62"):
        suture.open(shard)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_pipe_named_like_a_shard_in_a_folder_is_refused_unopened(tmp_path: Path) -> None:
    save_file({"a": np.ones(2, np.float32)}, tmp_path / "model-1.safetensors")
    os.mkfifo(tmp_path / "model-2.safetensors")
    with pytest.raises(suture.NotACheckpointError, match="'.*model-2.safetensors' is named like"):
        suture.open(tmp_path)  # before: waited forever on the pipe


def _indexed(folder: Path, index: str, tensor: str) -> None:
    shard = f"{tensor}.safetensors"
    save_file({tensor: np.ones(2, np.float32)}, folder / shard)
    (folder / index).write_text(json.dumps({"weight_map": {tensor: shard}}))


def test_of_two_indexes_the_one_hugging_face_reads_is_read(tmp_path: Path) -> None:
    _indexed(tmp_path, "consolidated.safetensors.index.json", "tok")  # sorts first
    _indexed(tmp_path, "model.safetensors.index.json", "embed")
    assert suture.open(tmp_path).paths() == ["embed"]


def test_two_indexes_neither_hugging_faces_are_refused_as_ambiguous(tmp_path: Path) -> None:
    _indexed(tmp_path, "a.safetensors.index.json", "tok")
    _indexed(tmp_path, "b.safetensors.index.json", "embed")
    with pytest.raises(suture.NotACheckpointError, match="holds 2 indexes .* ambiguous"):
        suture.open(tmp_path)
    assert suture.open(tmp_path / "b.safetensors.index.json").paths() == ["embed"]


def test_a_hugging_face_folder_beside_a_subfolder_named_like_a_step_opens(tmp_path) -> None:
    save_file({"a.w": np.ones(2, np.float32)}, tmp_path / "model.safetensors")
    (tmp_path / "run_2").mkdir()
    (tmp_path / "run_2" / "notes.txt").write_text("not a checkpoint")
    assert suture.open(tmp_path).paths() == ["a/w"]  # it was refused as a manager root


def test_a_manager_root_beside_a_safetensors_file_still_opens_its_newest_step(tmp_path) -> None:
    manager = ocp.CheckpointManager(tmp_path)
    manager.save(3, args=ocp.args.StandardSave({"w": np.full(2, 3.0, np.float32)}))
    manager.wait_until_finished()
    save_file({"exported": np.ones(2, np.float32)}, tmp_path / "model.safetensors")
    assert suture.open(tmp_path).paths() == ["w"]


def test_a_name_with_a_slash_is_said_to_become_levels(tmp_path: Path) -> None:
    """A '/' in a tensor name is a tree level: a copy once renamed 'vision/encoder.weight' to
    'vision.encoder.weight' without a word; it is said, and separator='/' keeps it whole."""
    tensors = {
        "lm_head.weight": np.ones(2, np.float32),
        "vision/encoder.weight": np.ones(2, np.float32),
    }
    save_file(tensors, tmp_path / "m.safetensors")
    with pytest.warns(
        suture.SutureWarning,
        match=r"'vision/encoder.weight' .* written back as 'vision.encoder.weight'",
    ):
        assert suture.open(tmp_path / "m.safetensors").paths() == [
            "lm_head/weight",
            "vision/encoder/weight",
        ]
    whole = suture.open(tmp_path / "m.safetensors", separator="/")
    suture.save(
        whole.tree,
        tmp_path / "copy.safetensors",
        format="safetensors",
        separator="/",
        progress=False,
    )
    with safe_open(tmp_path / "copy.safetensors", "np") as copy:
        assert sorted(copy.keys()) == sorted(tensors)


def test_a_link_to_nothing_named_like_a_shard_is_said_to_be_one(tmp_path: Path) -> None:
    save_file({"a": np.ones(2, np.float32)}, tmp_path / "model-1.safetensors")
    (tmp_path / "model-2.safetensors").symlink_to(tmp_path / "gone.safetensors")
    with pytest.raises(
        suture.NotACheckpointError, match=r"model-2.safetensors' .* a link to nothing"
    ):
        suture.open(tmp_path)
