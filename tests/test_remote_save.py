"""Writing to gs:// and s3://: save, apply, convert and merge -o, read back by stock Orbax.

A remote Orbax output is committed the way Orbax commits on GCS (``commit_success.txt``
last); a safetensors output is uploaded object by object, its index last.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

import suture
from suture._location import location_of
from suture.cli import app
from tests.remote_servers import upload

runner = CliRunner()


def model() -> dict:
    rng = np.random.default_rng(2)
    return {
        "params": {
            f"layer{i}": {"kernel": rng.standard_normal((8, 8), np.float32)} for i in range(3)
        },
        "note": "hello",
        "count": 5,
    }


def restore_with_stock_orbax(url: str) -> dict:
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(epath.Path(url))


def test_save_to_gcs_is_read_back_by_stock_orbax(gcs: str) -> None:
    url = f"{gcs}/out/model"
    result = suture.save(model(), url, progress=False, metadata={"run": "a"})
    assert result.path == url
    assert location_of(f"{url}/commit_success.txt").is_file()
    restored = restore_with_stock_orbax(url)
    np.testing.assert_array_equal(
        restored["params"]["layer1"]["kernel"], model()["params"]["layer1"]["kernel"]
    )
    assert restored["note"] == "hello" and int(restored["count"]) == 5
    assert suture.open(url).custom_metadata == {"run": "a"}


def test_existing_remote_destination_needs_overwrite(gcs: str, s3: str) -> None:
    for base in (gcs, s3):
        url = f"{base}/out/twice"
        suture.save({"w": np.zeros(3)}, url, progress=False)
        with pytest.raises(suture.SurgeryError, match=r"already exists\. Pass overwrite=True"):
            suture.save({"w": np.ones(3)}, url, progress=False)
        np.testing.assert_array_equal(suture.open(url)["w"].read(), np.zeros(3))
        suture.save({"w": np.ones(3), "extra": np.ones(2)}, url, progress=False, overwrite=True)
        replaced = suture.open(url)
        assert sorted(replaced.paths()) == ["extra", "w"]
        np.testing.assert_array_equal(replaced["w"].read(), np.ones(3))


def test_save_to_s3_orbax_and_safetensors(s3: str, tmp_path: Path) -> None:
    suture.save(model(), f"{s3}/out/orbax", progress=False)
    back = suture.load(f"{s3}/out/orbax")
    np.testing.assert_array_equal(
        back["params"]["layer2"]["kernel"], model()["params"]["layer2"]["kernel"]
    )
    arrays = {"params": model()["params"]}
    suture.save(arrays, f"{s3}/out/model.safetensors", format="safetensors", progress=False)
    local = tmp_path / "copy.safetensors"
    local.write_bytes(location_of(f"{s3}/out/model.safetensors").read_bytes())
    assert sorted(load_file(local)) == [f"params.layer{i}.kernel" for i in range(3)]
    suture.save(
        arrays, f"{s3}/out/shards", format="safetensors", max_shard_size="300B", progress=False
    )
    sharded = suture.open(f"{s3}/out/shards")
    assert len(set(sharded.layout["weight_map"].values())) == 3
    np.testing.assert_array_equal(
        sharded["params/layer0/kernel"].read(), model()["params"]["layer0"]["kernel"]
    )


def test_cli_commands_write_to_object_stores(gcs: str, s3: str, tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    save_file(
        {"model.w": np.arange(12.0, dtype=np.float32).reshape(3, 4)}, hf / "model.safetensors"
    )
    (hf / "config.json").write_text('{"hidden": 4}')
    upload(hf, f"{gcs}/cli/hf")
    converted = runner.invoke(app, ["convert", f"{gcs}/cli/hf", f"{gcs}/cli/orbax"])
    assert converted.exit_code == 0, converted.output
    assert location_of(f"{gcs}/cli/orbax/config.json").read_bytes() == b'{"hidden": 4}'
    restored = restore_with_stock_orbax(f"{gcs}/cli/orbax")
    np.testing.assert_array_equal(restored["model"]["w"], np.arange(12.0).reshape(3, 4))
    back = runner.invoke(
        app, ["convert", f"{gcs}/cli/orbax", f"{s3}/cli/hf_again", "--format", "safetensors"]
    )
    assert back.exit_code == 0, back.output
    assert suture.open(f"{s3}/cli/hf_again").paths() == ["model/w"]

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("rules:\n  - cast: {pattern: model, dtype: bfloat16}\n")
    applied = runner.invoke(app, ["apply", str(recipe), f"{gcs}/cli/orbax", "-o", f"{s3}/cli/bf16"])
    assert applied.exit_code == 0, applied.output
    assert suture.open(f"{s3}/cli/bf16")["model/w"].dtype.name == "bfloat16"

    config = tmp_path / "merge.yaml"
    config.write_text(
        f"method: linear\nmodels: [{gcs}/cli/orbax, {s3}/cli/bf16]\nweights: [0.5, 0.5]\n"
    )
    merged = runner.invoke(app, ["merge", str(config), "-o", f"{gcs}/cli/merged"])
    assert merged.exit_code == 0, merged.output
    assert restore_with_stock_orbax(f"{gcs}/cli/merged")["model"]["w"].shape == (3, 4)

    planned = runner.invoke(app, ["plan", str(recipe), f"{gcs}/cli/orbax"])
    assert planned.exit_code == 0 and "model/w" in planned.output


def test_http_is_read_only(tmp_path: Path) -> None:
    with pytest.raises(suture.SurgeryError, match=r"http:// is read-only for suture"):
        suture.save({"w": np.ones(2)}, "http://127.0.0.1:9/out", progress=False)


def _gcs_writes() -> int:
    import tensorstore as ts

    return sum(
        int(value.get("value", 0))
        for metric in ts.experimental_collect_matching_metrics("/tensorstore/kvstore/gcs/write")
        if metric.get("name") == "/tensorstore/kvstore/gcs/write"
        for value in metric.get("values", [])
    )


def test_a_save_to_a_bucket_shares_commits_among_arrays_and_chunks(gcs: str) -> None:
    # Each OCDBT commit is a data file and a manifest written one after the other: on a bucket
    # (tens of ms a request) one commit per array, and per chunk, made saves latency-bound.
    rng = np.random.default_rng(5)
    tree = {f"w{i}": rng.standard_normal((64, 256), np.float32) for i in range(24)}  # 64 KiB
    chunks = 24 * 4  # 16 KiB chunks: four per array
    before = _gcs_writes()
    suture.save(tree, f"{gcs}/shared-commits", chunk_bytes=16 << 10, progress=False)
    writes = _gcs_writes() - before
    one_commit_each = 2 * (24 + chunks)  # a commit per array created and per chunk written
    assert writes < one_commit_each / 3, writes
    restored = restore_with_stock_orbax(f"{gcs}/shared-commits")
    for name, values in tree.items():
        np.testing.assert_array_equal(restored[name], values)


def _gcs_requests() -> int:
    """Requests TensorStore made to GCS so far: reads (ranged ones too), writes, listings and
    deletes."""
    import tensorstore as ts

    kinds = {
        f"/tensorstore/kvstore/gcs/{kind}" for kind in ("read", "write", "list", "delete_range")
    }
    return sum(
        int(value.get("value", 0))
        for metric in ts.experimental_collect_matching_metrics("/tensorstore/kvstore/gcs/")
        if metric.get("name") in kinds
        for value in metric.get("values", [])
    )


def test_a_save_between_buckets_makes_few_requests_around_its_data(
    gcs: str, tmp_path: Path
) -> None:
    # At tens of ms a request, the requests before the first byte moves (finding the format,
    # refusing an unfinished source, the destination's existence, its lock) and after the last
    # (the commit, releasing the lock) are a chain of round trips: each one counts.
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "ckpt", {"w": np.ones((8, 4), np.float32)})
    upload(tmp_path / "ckpt", f"{gcs}/few-requests/ckpt")
    before = _gcs_requests()
    opened = suture.open(f"{gcs}/few-requests/ckpt")
    opening = _gcs_requests() - before
    before = _gcs_requests()
    suture.save(opened, f"{gcs}/few-requests/out", progress=False)
    saving = _gcs_requests() - before
    np.testing.assert_array_equal(restore_with_stock_orbax(f"{gcs}/few-requests/out")["w"], 1)
    # 15 and 29 before: _CHECKPOINT_METADATA probed and read twice, an existence check as a
    # probe and a listing, the lock probed before each read, read in two requests (a short
    # file refused a ranged read) and removed with two listings. Opening probes the folder's
    # name, _METADATA and _CHECKPOINT_METADATA at once: one request more than probing them
    # in turn until one is found, one round trip (two for a folder of safetensors) less.
    assert opening <= 12, opening
    assert saving <= 20, saving


def test_a_save_to_a_bucket_refused_before_writing_leaves_nothing(gcs: str, tmp_path: Path) -> None:
    # On a bucket the arrays are created while the blocks start; a save refused before its
    # blocks run (a block over the budget) waits for those creations before deleting what
    # it wrote, so that no database is left under the name for the next save to trip on.
    path = tmp_path / "model.safetensors"
    save_file({"w": np.ones((512, 1024), np.float32)}, str(path))
    w = suture.open(path)["w"]
    tree = {
        "normed": suture.map(lambda x: x / np.linalg.norm(x), w, shape=w.shape, dtype=w.dtype),
        "kept": w,
    }
    url = f"{gcs}/refused/out"
    with pytest.raises(suture.SurgeryError, match=r"'normed'.*max_memory='\d+MiB' or more"):
        suture.save(tree, url, max_memory="1MiB", progress=False)
    assert not location_of(url).exists()
    suture.save({"kept": w}, url, progress=False)  # no overwrite needed: nothing is there
    np.testing.assert_array_equal(restore_with_stock_orbax(url)["kept"], 1)
