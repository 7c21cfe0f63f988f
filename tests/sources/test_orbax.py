"""Orbax checkpoints written by stock orbax-checkpoint, read back through suture."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

import suture
from suture._iostats import count_bytes_read
from tests.orbax_writers import (
    as_sharded_jax,
    pytree_writer,
    sample_arrays,
    sample_values,
    save_manager,
    save_standard,
    save_v1,
)

WRITERS = [
    save_standard,
    pytree_writer(use_ocdbt=True, use_zarr3=True),
    pytree_writer(use_ocdbt=True, use_zarr3=False),
    pytree_writer(use_ocdbt=False, use_zarr3=True),
    pytree_writer(use_ocdbt=False, use_zarr3=False),
    save_v1,
]


def assert_same_arrays(ckpt: suture.Checkpoint, expected: dict) -> None:
    flat = suture.flatten(expected)
    assert sorted(ckpt.paths()) == sorted(flat)
    for path, value in flat.items():
        leaf = ckpt[path]
        assert isinstance(leaf, suture.LazyArray), path
        read = leaf.read()
        expected_array = np.asarray(value)
        assert leaf.shape == expected_array.shape, path
        assert leaf.dtype == expected_array.dtype, path
        assert read.dtype == expected_array.dtype, path
        np.testing.assert_array_equal(read, expected_array, err_msg=path)


@pytest.mark.parametrize("write", WRITERS, ids=lambda w: w.__name__)
def test_every_layout_reads_back_value_exact(tmp_path: Path, write) -> None:
    tree = sample_arrays()
    write(tmp_path / "ckpt", tree)
    ckpt = suture.open(tmp_path / "ckpt")
    assert ckpt.format == "orbax"
    assert_same_arrays(ckpt, tree)
    assert isinstance(ckpt.tree["layers"], list)
    assert ckpt.nbytes == sum(np.asarray(v).nbytes for v in suture.flatten(tree).values())


@pytest.mark.parametrize("write", WRITERS[1:], ids=lambda w: w.__name__)
def test_sharded_jax_arrays_read_back(tmp_path: Path, write) -> None:
    tree = sample_arrays(seed=1)
    write(tmp_path / "ckpt", as_sharded_jax(tree))
    assert_same_arrays(suture.open(tmp_path / "ckpt"), tree)
    assert suture.open(tmp_path / "ckpt")["step"].stored_as == "jax.Array"


@pytest.mark.parametrize("write", WRITERS[1:], ids=lambda w: w.__name__)
def test_non_array_leaves_keep_their_values(tmp_path: Path, write) -> None:
    write(tmp_path / "ckpt", {"w": np.ones(2, np.float32), **sample_values()})
    ckpt = suture.open(tmp_path / "ckpt")
    assert ckpt["name"] == "my-model"
    assert ckpt["nothing"] is None
    # Python numbers are stored by Orbax as 0-d arrays; they stay lazy, marked as scalars.
    assert ckpt["count"].stored_as == "scalar" and ckpt["count"].item() == 7
    assert ckpt["rate"].item() == 0.25
    assert ckpt.paths() == sorted(ckpt.paths()) or set(ckpt.paths()) == {
        "w",
        "name",
        "nothing",
        "count",
        "rate",
    }


def test_checkpoint_manager_opens_newest_step_or_the_one_asked(tmp_path: Path) -> None:
    tree = sample_arrays()
    save_manager(tmp_path / "run", tree, steps=(1, 3, 5))
    newest = suture.open(tmp_path / "run")
    assert newest.step == 5 and newest["step"].item() == 5
    first = suture.open(tmp_path / "run", step=1)
    assert first.step == 1 and first["step"].item() == 1
    assert_same_arrays(first, dict(tree, step=np.asarray(1, np.int32)))
    # A step folder itself opens too, and knows its step.
    assert suture.open(tmp_path / "run" / "3").step == 3


def test_missing_step_lists_the_steps_found(tmp_path: Path) -> None:
    save_manager(tmp_path / "run", sample_arrays(), steps=(1, 2))
    with pytest.raises(suture.SurgeryError, match=r"has no step 7\. Steps found: 1, 2"):
        suture.open(tmp_path / "run", step=7)


def test_manager_with_named_items_opens_each_item_as_a_subtree(tmp_path: Path) -> None:
    params = {"w": np.arange(4, dtype=np.float32)}
    extra = {"ema": np.ones(3, np.float32)}
    with ocp.CheckpointManager(tmp_path / "run") as manager:
        manager.save(
            2,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params), extra=ocp.args.StandardSave(extra)
            ),
        )
        manager.wait_until_finished()
    ckpt = suture.open(tmp_path / "run")
    np.testing.assert_array_equal(ckpt["params/w"].read(), params["w"])
    np.testing.assert_array_equal(ckpt["extra/ema"].read(), extra["ema"])


def test_custom_metadata_is_available(tmp_path: Path) -> None:
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(
        tmp_path / "ckpt", {"w": np.ones(2)}, custom_metadata={"model": "mlp", "version": 3}
    )
    checkpointer.wait_until_finished()
    assert suture.open(tmp_path / "ckpt").custom_metadata == {"model": "mlp", "version": 3}


def test_slicing_a_row_reads_at_most_two_chunks(tmp_path: Path) -> None:
    big = np.random.default_rng(0).standard_normal((32, 1024, 1024), dtype=np.float32)
    chunk_bytes = 1024 * 1024 * 4  # one row of axis 0
    save_args = {"x": ocp.SaveArgs(chunk_byte_size=chunk_bytes, shard_axes=(0,))}
    ocp.PyTreeCheckpointer().save(tmp_path / "ckpt", {"x": big}, save_args=save_args)
    x = suture.open(tmp_path / "ckpt")["x"]
    x[0].read()  # the checkpoint's OCDBT index is read once per checkpoint
    with count_bytes_read() as counter:
        row = x[3].read()
    np.testing.assert_array_equal(row, big[3])
    assert 0 < counter.bytes <= 2 * chunk_bytes, counter.bytes
    with count_bytes_read() as counter:
        corner = x[5:7, :2, :2].read()
    np.testing.assert_array_equal(corner, big[5:7, :2, :2])
    assert counter.bytes <= 2 * chunk_bytes


@pytest.mark.parametrize("use_ocdbt", [True, False])
def test_opening_reads_no_array_data(tmp_path: Path, use_ocdbt: bool) -> None:
    rng = np.random.default_rng(0)
    tree = {f"layer{i}": rng.standard_normal((256, 256), dtype=np.float32) for i in range(8)}
    pytree_writer(use_ocdbt=use_ocdbt, use_zarr3=True)(tmp_path / "ckpt", tree)
    smallest_array_on_disk = 200_000  # random float32 barely compress: ~256 KiB each
    with count_bytes_read() as counter:
        ckpt = suture.open(tmp_path / "ckpt")
        ckpt.abstract()
        _ = [leaf.shape for leaf in ckpt.arrays().values()]
    if use_ocdbt:
        # Only the OCDBT manifest and B-tree (the index of keys) plus the small zarr.json files.
        assert counter.bytes < smallest_array_on_disk / 4, counter.bytes
    else:
        assert counter.bytes == 0  # zarr metadata comes from plain files; nothing via TensorStore
    with count_bytes_read() as counter:
        ckpt["layer3"].read()
    assert counter.bytes > smallest_array_on_disk


def test_abstract_gives_shape_dtype_structs(tmp_path: Path) -> None:
    tree = sample_arrays()
    save_standard(tmp_path / "ckpt", tree)
    abstract = suture.open(tmp_path / "ckpt").abstract()
    kernel = abstract["params"]["dense"]["kernel"]
    assert isinstance(kernel, jax.ShapeDtypeStruct)
    assert kernel.shape == (4, 6) and kernel.dtype == np.float32
    assert abstract["params"]["dense"]["bias"].dtype == np.dtype("bfloat16")


def test_lookup_errors_suggest_close_paths(tmp_path: Path) -> None:
    save_standard(tmp_path / "ckpt", sample_arrays())
    ckpt = suture.open(tmp_path / "ckpt")
    with pytest.raises(
        suture.SurgeryError,
        match=r"no leaf 'params/dense/kernal'.*Did you mean 'params/dense/kernel'",
    ):
        ckpt["params/dense/kernal"]
    assert "params/dense" in ckpt and "params/nope" not in ckpt
    assert set(suture.flatten(ckpt["params/dense"])) == {"kernel", "bias"}


def test_bad_path_is_a_surgery_error(tmp_path: Path) -> None:
    with pytest.raises(suture.CheckpointNotFoundError, match="No such file or folder: .*nowhere"):
        suture.open(tmp_path / "nowhere")


def test_empty_folder_is_a_surgery_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(suture.NotACheckpointError, match="is an empty folder, not a checkpoint"):
        suture.open(tmp_path / "empty")


def test_folder_that_is_not_a_checkpoint_names_what_it_found(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "readme.txt").write_text("hello")
    (folder / "data.csv").write_text("1,2")
    with pytest.raises(
        suture.NotACheckpointError, match=r"is not a checkpoint: found data.csv, readme.txt"
    ):
        suture.open(folder)


def test_unfinished_orbax_save_is_refused(tmp_path: Path) -> None:
    save_standard(tmp_path / "done", sample_arrays())
    unfinished = tmp_path / "ckpt.orbax-checkpoint-tmp-1700000000"
    shutil.copytree(tmp_path / "done", unfinished)
    (unfinished / "commit_success.txt").unlink(missing_ok=True)
    with pytest.raises(suture.UnfinishedCheckpointError, match="unfinished Orbax save"):
        suture.open(unfinished)


def test_manager_root_with_only_unfinished_steps_is_refused(tmp_path: Path) -> None:
    save_standard(tmp_path / "done", sample_arrays())
    root = tmp_path / "run"
    root.mkdir()
    shutil.copytree(tmp_path / "done", root / "3.orbax-checkpoint-tmp-17")
    with pytest.raises(
        suture.UnfinishedCheckpointError, match=r"only unfinished Orbax saves \(3.orbax"
    ):
        suture.open(root)


def test_manager_skips_an_unfinished_newest_step(tmp_path: Path) -> None:
    save_manager(tmp_path / "run", sample_arrays(), steps=(1, 2))
    shutil.copytree(tmp_path / "run" / "2", tmp_path / "run" / "9.orbax-checkpoint-tmp-17")
    assert suture.open(tmp_path / "run").step == 2


def test_commit_without_timestamp_is_unfinished(tmp_path: Path) -> None:
    save_standard(tmp_path / "ckpt", sample_arrays())
    metadata_file = tmp_path / "ckpt" / "_CHECKPOINT_METADATA"
    recorded = json.loads(metadata_file.read_text())
    recorded["commit_timestamp_nsecs"] = None
    metadata_file.write_text(json.dumps(recorded))
    with pytest.raises(suture.UnfinishedCheckpointError, match="records a start but no commit"):
        suture.open(tmp_path / "ckpt")


def test_damaged_metadata_is_a_surgery_error(tmp_path: Path) -> None:
    save_standard(tmp_path / "ckpt", sample_arrays())
    (tmp_path / "ckpt" / "_METADATA").write_text("{not json")
    with pytest.raises(suture.CorruptCheckpointError, match=r"Cannot parse .*_METADATA.* as JSON"):
        suture.open(tmp_path / "ckpt")


def test_array_listed_but_missing_is_a_surgery_error(tmp_path: Path) -> None:
    pytree_writer(use_ocdbt=False, use_zarr3=False)(
        tmp_path / "ckpt", {"a": np.ones(2), "b": np.ones(3)}
    )
    shutil.rmtree(tmp_path / "ckpt" / "b")
    with pytest.raises(suture.CorruptCheckpointError, match=r"Leaf 'b': _METADATA lists an array"):
        suture.open(tmp_path / "ckpt")


def test_a_file_in_no_known_format(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"\x00" * 16)
    with pytest.raises(
        suture.NotACheckpointError, match="is a file in no format suture knows.*pass format="
    ):
        suture.open(tmp_path / "weights.bin")


def test_opening_does_not_import_jax_or_orbax(tmp_path: Path) -> None:
    import subprocess
    import sys

    save_standard(tmp_path / "ckpt", sample_arrays())
    code = (
        "import sys, suture; c = suture.open(sys.argv[1]); c['params/dense/kernel'].read(); "
        "print(sorted(m for m in ('jax', 'orbax', 'flax') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "[]"
