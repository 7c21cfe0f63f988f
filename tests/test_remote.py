"""Reading checkpoints from gs://, s3:// and http(s):// servers started by the tests.

Stock Orbax writes to the GCS server itself; safetensors, npz and msgpack files are
uploaded to all three servers. suture's reads are compared with the stock readers'.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from safetensors.numpy import load_file, save_file
from typer.testing import CliRunner

import suture
from suture._iostats import count_bytes_read
from suture.cli import app
from tests.remote_servers import upload

runner = CliRunner()


def tree() -> dict:
    rng = np.random.default_rng(0)
    return {
        "params": {
            "dense": {"kernel": rng.standard_normal((16, 8), np.float32), "bias": np.ones(8)},
            "embed": rng.standard_normal((32, 4)).astype(np.float32),
        },
        "step": np.asarray(3, np.int32),
    }


def test_stock_orbax_checkpoint_on_gcs(gcs: str) -> None:
    url = f"{gcs}/stock/ckpt"
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(epath.Path(url), tree())
        checkpointer.wait_until_finished()
        restored = checkpointer.restore(epath.Path(url))
    for source in (url, epath.Path(url)):
        ckpt = suture.open(source)
        assert ckpt.format == "orbax" and ckpt.location == url
        loaded = suture.load(ckpt)
        np.testing.assert_array_equal(
            loaded["params"]["dense"]["kernel"], restored["params"]["dense"]["kernel"]
        )
        assert int(loaded["step"]) == int(restored["step"])
    with count_bytes_read() as counter:
        row = suture.open(url)["params/embed"][5].read()
    np.testing.assert_array_equal(row, restored["params"]["embed"][5])
    assert counter.bytes > 0  # remote reads are counted


def test_checkpoint_manager_root_on_gcs(gcs: str) -> None:
    root = epath.Path(f"{gcs}/stock/runs")
    with ocp.CheckpointManager(root) as manager:
        for step in (1, 2):
            manager.save(step, args=ocp.args.StandardSave({"w": np.full(4, step, np.float32)}))
        manager.wait_until_finished()
    newest = suture.open(str(root))
    assert newest.step == 2 and float(newest["w"].read()[0]) == 2.0
    assert float(suture.open(str(root), step=1)["w"].read()[0]) == 1.0


def test_unfinished_gcs_checkpoint_is_refused_like_stock_orbax(gcs: str) -> None:
    url = f"{gcs}/stock/unfinished"
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(epath.Path(url), tree())
        checkpointer.wait_until_finished()
    suture._location.location_of(f"{url}/commit_success.txt").remove()
    with pytest.raises(ValueError, match="incomplete checkpoint"):
        ocp.StandardCheckpointer().restore(epath.Path(url))
    with pytest.raises(suture.UnfinishedCheckpointError, match="commit_success.txt"):
        suture.open(url)


@pytest.fixture(scope="module")
def local_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("files")
    rng = np.random.default_rng(1)
    tensors = {
        f"model.layers.{i}.weight": rng.standard_normal((8, 4), np.float32) for i in range(3)
    }
    save_file(tensors, root / "model.safetensors")
    hf = root / "hf"
    hf.mkdir()
    weight_map = {}
    for shard, names in enumerate(
        (["model.layers.0.weight"], ["model.layers.1.weight", "model.layers.2.weight"]), 1
    ):
        filename = f"model-0000{shard}-of-00002.safetensors"
        save_file({name: tensors[name] for name in names}, hf / filename)
        weight_map.update(dict.fromkeys(names, filename))
    (hf / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    np.savez(root / "arrays.npz", a=np.arange(10.0), b=np.ones((3, 3), np.int32))
    np.savez_compressed(root / "packed.npz", c=np.arange(6.0))
    from flax.serialization import to_bytes

    (root / "flax.msgpack").write_bytes(to_bytes({"w": np.arange(5.0, dtype=np.float32)}))
    return root


@pytest.fixture(scope="module", params=["gs", "s3", "http"])
def remote_files(request, local_files: Path) -> str:
    """The local files, on each of the three servers; yields the base URL."""
    if request.param == "http":
        server = request.getfixturevalue("http")
        for name in ("model.safetensors", "hf", "arrays.npz", "packed.npz", "flax.msgpack"):
            server.publish(local_files / name, f"files/{name}")
        return f"{server.url}/files"
    base = request.getfixturevalue("gcs" if request.param == "gs" else "s3") + "/files"
    upload(local_files, base)
    return base


def test_every_format_reads_like_the_stock_readers(remote_files: str, local_files: Path) -> None:
    tensors = load_file(local_files / "model.safetensors")
    single = suture.open(f"{remote_files}/model.safetensors")
    for name, values in tensors.items():
        np.testing.assert_array_equal(single[name.replace(".", "/")].read(), values)
    for source in (f"{remote_files}/hf", f"{remote_files}/hf/model.safetensors.index.json"):
        sharded = suture.open(source)
        assert sharded.layout["weight_map"]["model.layers.2.weight"].endswith("00002.safetensors")
        np.testing.assert_array_equal(
            sharded["model/layers/2/weight"].read(), tensors["model.layers.2.weight"]
        )
    with np.load(local_files / "arrays.npz") as stock_npz:  # closed: no file left to the GC
        archive = suture.open(f"{remote_files}/arrays.npz")
        np.testing.assert_array_equal(archive["b"].read(), stock_npz["b"])
        np.testing.assert_array_equal(archive["a"][2:5].read(), stock_npz["a"][2:5])
    np.testing.assert_array_equal(
        suture.open(f"{remote_files}/packed.npz")["c"].read(), np.arange(6.0)
    )
    np.testing.assert_array_equal(
        suture.open(f"{remote_files}/flax.msgpack")["w"].read(), np.arange(5.0)
    )


def test_cli_inspect_stats_and_diff_on_remote_files(remote_files: str) -> None:
    shown = runner.invoke(app, ["inspect", f"{remote_files}/model.safetensors", "--stats"])
    assert shown.exit_code == 0, shown.output
    assert "model/layers/0/weight" in shown.output
    compared = runner.invoke(
        app, ["diff", f"{remote_files}/model.safetensors", f"{remote_files}/hf"]
    )
    assert compared.exit_code == 0, compared.output


def test_unsupported_scheme_is_an_error_naming_the_supported_ones(tmp_path: Path) -> None:
    with pytest.raises(suture.SurgeryError, match=r"scheme 'ftp'.*Supported: local paths, gs://"):
        suture.open("ftp://host/ckpt")
    with pytest.raises(suture.SurgeryError, match=r"scheme 'sftp'"):
        suture.save({"w": np.ones(2)}, "sftp://host/model", progress=False)
    with pytest.raises(suture.DestinationError, match=r"hf://org/model.*does not push"):
        suture.save({"w": np.ones(2)}, "hf://org/model", progress=False)  # read-only
    shown = runner.invoke(app, ["inspect", "ftp://host/ckpt"])
    assert shown.exit_code == 2 and "Error: 'ftp://host/ckpt' uses the scheme 'ftp'" in shown.output


def test_missing_remote_checkpoint_is_not_found(gcs: str, http) -> None:
    with pytest.raises(suture.CheckpointNotFoundError, match="No such file or folder"):
        suture.open(f"{gcs}/nothing/here")
    with pytest.raises(suture.SurgeryError, match="not a file on the HTTP server"):
        suture.open(f"{http.url}/nothing/here")


def test_remote_errors_name_the_url_and_the_fix(gcs: str, http, local_files: Path) -> None:
    with pytest.raises(suture.SurgeryError, match=r"'gs:///x' names no bucket or host"):
        suture.open("gs:///x")
    with pytest.raises(suture.SurgeryError, match=r"Cannot reach gs://Bad_Bucket!: .*bucket"):
        suture.open("gs://Bad_Bucket!/x")
    with pytest.raises(suture.SurgeryError, match=r"Cannot read .*forbidden.*HTTP 403 Forbidden"):
        suture.open(f"{http.url}/forbidden/model.safetensors")
    with pytest.raises(suture.CheckpointNotFoundError, match=r"No such file: 'gs://"):
        suture._location.location_of(f"{gcs}/absent.json").read_bytes()

    truncated = (local_files / "model.safetensors").read_bytes()[:-100]
    suture._location.location_of(f"{gcs}/bad/model.safetensors").write_bytes(truncated)
    with pytest.raises(suture.CorruptCheckpointError, match=r"shorter than its header says"):
        suture.open(f"{gcs}/bad/model.safetensors")

    http.publish(local_files / "hf" / "model-00001-of-00002.safetensors", "bare/a.safetensors")
    with pytest.raises(suture.SurgeryError, match=r"not a file on the HTTP server, and an HTTP"):
        suture.open(f"{http.url}/bare")
    http.publish(local_files / "model.safetensors", "runs/model.safetensors")
    with pytest.raises(suture.NotACheckpointError, match=r"HTTP server cannot list a folder"):
        suture.open(f"{http.url}/runs", format="orbax")


def test_pytorch_files_open_only_locally(gcs: str, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    torch.save({"w": torch.ones(2)}, tmp_path / "model.pt")
    upload(tmp_path / "model.pt", f"{gcs}/torch/model.pt")
    with pytest.raises(suture.SurgeryError, match=r"PyTorch file, which suture opens only from"):
        suture.open(f"{gcs}/torch/model.pt", allow_pickle=True)


def test_a_lock_created_just_after_the_probe_is_not_overwritten(s3: str, monkeypatch) -> None:
    # Two writers start together and both find no lock; the later create must not replace
    # the earlier one's lock. S3 and GCS refuse a create where an object is (moto does;
    # fake-gcs-server ignores the condition, so this is tested on S3).
    from suture._location.publish import exclusive, lock_of
    from suture._location.remote import RemoteLocation

    destination = suture._location.location_of(f"{s3}/racing/out")
    lock = lock_of(destination)
    theirs = b"12345@another-host"
    probe = RemoteLocation.is_file

    def probed_before_theirs(self: RemoteLocation) -> bool:
        found = probe(self)
        if self == lock and not found:  # the other writer creates its lock right after
            lock.write_bytes(theirs)
        return found

    monkeypatch.setattr(RemoteLocation, "is_file", probed_before_theirs)
    refused = pytest.raises(suture.SurgeryError, match=r"pid 12345 on host 'another-host'")
    with refused, exclusive(destination):
        pass
    assert lock.read_bytes() == theirs  # theirs still, not overwritten by ours
    lock.remove_file()


def test_a_lock_held_on_another_machine_is_respected(gcs: str) -> None:
    lock = suture._location.location_of(f"{gcs}/locked/.out.suture-lock")
    lock.write_bytes(b"12345@another-host")
    with pytest.raises(
        suture.SurgeryError,
        match=r"Another process \(pid 12345 on host 'another-host'\) is writing",
    ):
        suture.save({"w": np.ones(2)}, f"{gcs}/locked/out", progress=False)
    lock.remove()
    suture.save({"w": np.ones(2)}, f"{gcs}/locked/out", progress=False)
