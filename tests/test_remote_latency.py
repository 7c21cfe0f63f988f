"""Fewer round trips on a bucket: stack members read at once, long ranges read in parts,
a block's memory counted once, and the questions of an opening asked once.

Servers are the real ones of tests/remote_servers.py (fake-gcs-server, moto, the range
HTTP server); concurrency is proven with a barrier that only several reads at once pass.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import suture
from suture._exec.blocks import leaf_blocks
from suture._lazy.array import LazyArray
from suture._lazy.graph import MemorySource
from suture._lazy.joins import REMOTE_MEMBER_READS, StackNode
from suture._lazy.selection import Selection, full
from suture._location import MAX_METADATA_BYTES, location_of, metadata_read_once, read_ahead
from suture._location import remote as remote_module
from suture._location.remote import RemoteLocation, _open_store
from suture.sources.filesource import FileRangeSource
from suture.sources.safetensors import HEADER_GUESS
from tests.remote_servers import upload


class BarrierSource(MemorySource):
    """An in-memory array whose reads wait at `barrier` (as a read waits on a round trip):
    reads one after another never pass a barrier of two or more."""

    def __init__(self, values: np.ndarray, barrier: threading.Barrier, remote: bool) -> None:
        super().__init__(values)
        self.barrier, self.remote = barrier, remote

    def read(self, selection: Selection) -> np.ndarray:
        self.barrier.wait()
        return super().read(selection)


def test_a_stack_of_remote_members_reads_them_at_once() -> None:
    members = [np.full((4, 3), i, np.float32) for i in range(3)]
    barrier = threading.Barrier(3, timeout=10)
    stack = StackNode([BarrierSource(m, barrier, remote=True) for m in members], 0, np.float32)
    np.testing.assert_array_equal(stack.read(full(stack.shape)), np.stack(members))
    assert stack.reads_at_once == REMOTE_MEMBER_READS
    # each member read at once holds its own part: the sum, not the largest
    assert stack.held_while_reading(full(stack.shape), into=True) == 3 * members[0].nbytes


def test_a_stack_of_local_members_reads_them_one_after_another() -> None:
    reading, most = [0], [0]
    lock = threading.Lock()

    class Counted(MemorySource):
        def read(self, selection: Selection) -> np.ndarray:
            with lock:
                reading[0] += 1
                most[0] = max(most[0], reading[0])
            time.sleep(0.02)
            with lock:
                reading[0] -= 1
            return super().read(selection)

    stack = StackNode([Counted(np.ones(4)) for _ in range(3)], 0, np.float64)
    assert stack.reads_at_once == 1
    np.testing.assert_array_equal(stack.read(full(stack.shape)), np.ones((3, 4)))
    assert most[0] == 1
    assert stack.held_while_reading(full(stack.shape), into=True) == 4 * 8


def test_a_failed_member_read_is_raised_after_the_others() -> None:
    class Broken(MemorySource):
        remote = True

        def read(self, selection: Selection) -> np.ndarray:
            raise OSError("the bucket went away")

    stack = StackNode([MemorySource(np.ones(2)), Broken(np.ones(2))], 0, np.float64)
    with pytest.raises(OSError, match="the bucket went away"):
        stack.read(full(stack.shape))


class Writer:
    """A writer that holds `factor` times each block's bytes while writing it."""

    def __init__(self, factor: int) -> None:
        self.factor = factor

    def block_rows(self) -> int:
        return 1

    def held_while_writing(self, nbytes: int) -> int:
        return self.factor * nbytes

    def write(self, rows: slice, values: np.ndarray) -> None:
        pass


@pytest.mark.parametrize("factor", [0, 1, 3])
def test_a_block_costs_its_bytes_and_the_larger_of_reading_and_writing(factor: int) -> None:
    """A block is read whole, then written: what reading held is freed before the writer
    holds anything, so the two are not added (a cast layer cost 208 MiB instead of 160)."""
    layers = [LazyArray(MemorySource(np.ones((8, 8), np.float32))) for _ in range(4)]
    leaf = suture.stack(layers).astype(np.float16)  # read as float32, cast
    reading = leaf.node.held_while_reading(full((1, 8, 8)), into=True)
    (first, *_) = leaf_blocks("w", leaf, Writer(factor), 1, 1 << 20)
    out = 8 * 8 * 2
    assert first.rows == slice(0, 1)
    assert first.cost == out + max(reading, factor * out)


def test_a_long_range_is_read_in_parts_at_once(gcs: str, tmp_path: Path, monkeypatch) -> None:
    data = np.random.default_rng(0).integers(0, 256, 100_000, dtype=np.uint8)
    (tmp_path / "blob").write_bytes(data.tobytes())
    url = upload(tmp_path / "blob", f"{gcs}/latency/blob")
    monkeypatch.setattr(remote_module, "PART_BYTES", 16 << 10)  # seven parts
    place = location_of(url)
    np.testing.assert_array_equal(place.read_range(1000, 90_000), data[1000:91_000])
    into = np.empty(50_000 // 4, np.float32)
    place.read_into(5, into)
    assert into.tobytes() == data[5:50_005].tobytes()
    with pytest.raises(suture.CorruptCheckpointError, match=r"needs 60000 bytes at offset 50000"):
        place.read_range(50_000, 60_000, "w")  # the last part runs past the end


def test_a_transposed_read_of_a_remote_tensor_reads_its_rows_at_once(
    gcs: str, tmp_path: Path
) -> None:
    values = np.arange(64 * 48, dtype=np.float32).reshape(64, 48)
    save_file({"w": values}, tmp_path / "model.safetensors")
    url = upload(tmp_path / "model.safetensors", f"{gcs}/latency/model.safetensors")
    source = suture.open(url)["w"].node
    assert isinstance(source, FileRangeSource) and source.remote
    out = np.empty((48, 64), np.float64)
    source.read_into(full(values.shape), out.T)  # cast and transposed into place
    np.testing.assert_array_equal(out, values.T)
    # the rows are held whole while they are cast into place (not one tile at a time)
    assert source.read_cost(full(values.shape), into=True).memory == values.nbytes
    np.testing.assert_array_equal(suture.open(url)["w"].T.read(), values.T)


def test_within_metadata_read_once_each_question_is_asked_once(gcs: str) -> None:
    folder = location_of(f"{gcs}/latency/once")
    (folder / "config.json").write_bytes(b'{"a": 1}')
    store = _open_store("gs", folder.host)

    def behind_its_back(name: str) -> None:  # a write that does not pass through a Location
        store.write(f"{folder.key}/{name}", b"{}").result()

    with metadata_read_once():
        assert folder.children() == ["config.json"]
        behind_its_back("late.json")
        assert folder.children() == ["config.json"]  # the listing's answer, kept
        assert not (folder / "late.json").is_file()  # answered by that listing
        assert (folder / "config.json").is_file()
        assert json.loads((folder / "config.json").read_bytes()) == {"a": 1}
        behind_its_back("config.json")  # replaced: the answer kept is the first one
        assert (folder / "config.json").read_head(4) == b'{"a"'  # cut from the whole file
        with pytest.raises(suture.CorruptCheckpointError, match="needs 100 bytes at offset 0"):
            (folder / "config.json").read_range(0, 100)
        (folder / "written.json").write_bytes(b"{}")  # through a Location: answers forgotten
        assert folder.children() == ["config.json", "late.json", "written.json"]
        assert (folder / "late.json").is_file()
    assert (folder / "config.json").read_bytes() == b"{}"  # outside: asked again


def test_opening_a_remote_folder_lists_it_once(gcs: str, tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    save_file({"w": np.ones((2, 2), np.float32)}, hf / "model.safetensors")
    (hf / "config.json").write_text("{}")
    url = upload(hf, f"{gcs}/latency/hf")
    listings: list[str] = []
    list_now = RemoteLocation._list_now

    def listed(self: RemoteLocation, start: str, end: str) -> list[str]:  # the real listing
        listings.append(start)
        return list_now(self, start, end)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RemoteLocation, "_list_now", listed)
        ckpt = suture.open(url)
    np.testing.assert_array_equal(ckpt["w"].read(), np.ones((2, 2)))
    assert listings == ["latency/hf/"]  # asked by the detection and by the opening


def test_read_ahead_answers_the_reads_that_follow(gcs: str, monkeypatch) -> None:
    folder = location_of(f"{gcs}/latency/ahead")
    (folder / "a.json").write_bytes(b'{"a": 1}')
    (folder / "b.json").write_bytes(b'{"b": 2}')
    files = [folder / "a.json", folder / "b.json", folder / "missing.json"]
    asked: list[tuple[str, object]] = []
    read_now = RemoteLocation._read_now

    def counted(self: RemoteLocation, key: str, byte_range: slice | None = None):
        asked.append((key, byte_range))  # the real read, counted
        return read_now(self, key, byte_range)

    monkeypatch.setattr(RemoteLocation, "_read_now", counted)
    read_ahead(files, MAX_METADATA_BYTES)
    assert asked == []  # outside metadata_read_once: nothing to keep the answers in
    with metadata_read_once():
        read_ahead(files, MAX_METADATA_BYTES)
        ahead = len(asked)
        assert ahead == 5  # a probe of the limit each, and the two files that are there
        assert json.loads(files[0].read_bytes(MAX_METADATA_BYTES)) == {"a": 1}
        assert json.loads(files[1].read_bytes(MAX_METADATA_BYTES)) == {"b": 2}
        assert files[1].is_file() and not files[2].is_file()
        with pytest.raises(suture.CheckpointNotFoundError, match="missing.json"):
            files[2].read_bytes(MAX_METADATA_BYTES)
        assert len(asked) == ahead  # every answer was there already


def test_opening_a_remote_orbax_folder_reads_its_metadata_at_once(gcs: str, monkeypatch) -> None:
    import orbax.checkpoint as ocp
    from etils import epath

    url = f"{gcs}/latency/orbax"
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(epath.Path(url), {"w": np.arange(4.0, dtype=np.float32)})
        checkpointer.wait_until_finished()
    probes: dict[str, int] = {}  # file -> the thread that probed its size limit
    together = threading.Barrier(3, timeout=30)  # broken unless the three probes are at once
    read_now = RemoteLocation._read_now

    def counted(self: RemoteLocation, key: str, byte_range: slice | None = None):
        if byte_range is not None and byte_range.start == MAX_METADATA_BYTES:
            probes[key.rsplit("/", 1)[-1]] = threading.get_ident()
            together.wait()
        return read_now(self, key, byte_range)  # the real read

    monkeypatch.setattr(RemoteLocation, "_read_now", counted)
    np.testing.assert_array_equal(suture.open(url)["w"].read(), np.arange(4.0))
    metadata = {"_CHECKPOINT_METADATA", "_METADATA", "commit_success.txt"}
    assert set(probes) == metadata  # each read once, the three at once
    assert threading.get_ident() not in probes.values()


def test_opening_remote_shards_reads_each_header_in_one_request(gcs: str, tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    rng = np.random.default_rng(3)
    shards = {"model-00001-of-00002.safetensors": "a", "model-00002-of-00002.safetensors": "b"}
    values = {tensor: rng.standard_normal((160, 128)).astype(np.float32) for tensor in "ab"}
    for name, tensor in shards.items():  # 80 KiB each: longer than the first read
        save_file({tensor: values[tensor]}, hf / name)
    index = {"metadata": {}, "weight_map": {tensor: name for name, tensor in shards.items()}}
    (hf / "model.safetensors.index.json").write_text(json.dumps(index))
    url = upload(hf, f"{gcs}/latency/shards")
    asked: list[tuple[str, tuple[int, int] | None]] = []
    read_now = RemoteLocation._read_now

    def counted(self: RemoteLocation, key: str, byte_range: slice | None = None):
        if "model-0000" in key:
            bounds = None if byte_range is None else (byte_range.start, byte_range.stop)
            asked.append((key.rsplit("/", 1)[-1], bounds))
        return read_now(self, key, byte_range)  # the real read

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RemoteLocation, "_read_now", counted)
        ckpt = suture.open(url)
    # per shard: the length and the header in one read, then the last byte the header
    # names; no probe of whether the shard is there (the folder's listing said so)
    for name in shards:
        reads = sorted(bounds for shard, bounds in asked if shard == name)
        size = (hf / name).stat().st_size
        assert reads == [(0, HEADER_GUESS), (size - 1, size)], reads
    for tensor in "ab":
        np.testing.assert_array_equal(ckpt[tensor].read(), values[tensor])


def test_a_conversion_between_buckets_reads_the_config_once(gcs: str, tmp_path: Path) -> None:
    # Opening read config.json (a size probe, then the file); the save read it again to
    # copy it and check its dtype: two more round trips before the first block.
    pytest.importorskip("torch", reason="transformers' models need torch (the dev extra)")
    from suture.families._convert import convert_with_recipe
    from tests.test_hf_output import tiny_llama

    tiny_llama(tmp_path / "hf")
    url = upload(tmp_path / "hf", f"{gcs}/latency/convert-config/hf")
    out = f"{gcs}/latency/convert-config/out"
    asked: list[tuple[int, int] | None] = []
    read_now = RemoteLocation._read_now

    def counted(self: RemoteLocation, key: str, byte_range: slice | None = None):
        if key.endswith("/config.json"):
            asked.append(None if byte_range is None else (byte_range.start, byte_range.stop))
        return read_now(self, key, byte_range)  # the real read

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RemoteLocation, "_read_now", counted)
        convert_with_recipe(url, out, "llama3.1:maxtext", progress=False)
    assert len(asked) == 2, asked  # the probe of the size cap and the read, once
    copied = location_of(f"{out}/config.json").read_bytes()
    assert copied == (tmp_path / "hf" / "config.json").read_bytes()  # byte for byte


def test_opening_remote_shards_asks_index_config_and_headers_at_once(
    gcs: str, tmp_path: Path
) -> None:
    # One after another these were six round trips before the first tensor: the index's
    # size probe and read, each header, then config.json's probe and read.
    hf = tmp_path / "hf"
    hf.mkdir()
    shards = {"model-00001-of-00002.safetensors": "a", "model-00002-of-00002.safetensors": "b"}
    for name, tensor in shards.items():
        save_file({tensor: np.full((4, 4), ord(tensor), np.float32)}, hf / name)
    save_file({"c": np.zeros(2, np.float32)}, hf / "consolidated.safetensors")  # not a shard
    index = {"metadata": {}, "weight_map": {tensor: name for name, tensor in shards.items()}}
    (hf / "model.safetensors.index.json").write_text(json.dumps(index))
    (hf / "config.json").write_text(json.dumps({"model_type": "llama"}))
    url = upload(hf, f"{gcs}/latency/open-ahead")
    firsts: dict[str, int] = {}  # file -> the thread of its first read
    asked: list[tuple[str, tuple[int, int] | None]] = []
    together = threading.Barrier(4, timeout=30)  # broken unless all four are asked at once
    read_now = RemoteLocation._read_now

    def counted(self: RemoteLocation, key: str, byte_range: slice | None = None):
        name = key.rsplit("/", 1)[-1]
        bounds = None if byte_range is None else (byte_range.start, byte_range.stop)
        asked.append((name, bounds))
        first = bounds in ((MAX_METADATA_BYTES, MAX_METADATA_BYTES + 1), (0, HEADER_GUESS))
        if first and name not in firsts:  # a file's size probe, or a shard's header
            firsts[name] = threading.get_ident()
            together.wait()
        return read_now(self, key, byte_range)  # the real read

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RemoteLocation, "_read_now", counted)
        ckpt = suture.open(url)
    assert set(firsts) == {"model.safetensors.index.json", "config.json", *shards}
    assert threading.get_ident() not in firsts.values()
    assert len(asked) == len(set(asked)), asked  # each read asked once: the later ones kept
    assert not [name for name, _ in asked if name == "consolidated.safetensors"]
    for tensor in "ab":
        np.testing.assert_array_equal(ckpt[tensor].read(), np.full((4, 4), ord(tensor)))


def test_opening_a_remote_manager_root_asks_nothing_more_of_its_older_steps(gcs: str, monkeypatch):
    """Telling a Hugging Face folder beside a step-like subfolder from a CheckpointManager
    root (`detect._beside_step_names`) reads only the listing the steps were found in: it
    asks no step whether it holds a checkpoint (before this was settled, it asked the oldest
    step's `_CHECKPOINT_METADATA`, then listed it). The older step's `_METADATA` is probed by
    the layout's own choice of the newest finished step, as before."""
    import orbax.checkpoint as ocp
    from etils import epath

    url = f"{gcs}/latency/manager"
    with ocp.CheckpointManager(epath.Path(url)) as manager:
        for step in (1, 2):
            manager.save(step, args=ocp.args.StandardSave({"w": np.full(2, float(step))}))
        manager.wait_until_finished()
    asked: list[str] = []
    read_now, list_now = RemoteLocation._read_now, RemoteLocation._list_now

    def read(self: RemoteLocation, key: str, byte_range: slice | None = None):
        asked.append(key)
        return read_now(self, key, byte_range)

    def listed(self: RemoteLocation, start: str, end: str) -> list[str]:
        asked.append(start)
        return list_now(self, start, end)

    monkeypatch.setattr(RemoteLocation, "_read_now", read)
    monkeypatch.setattr(RemoteLocation, "_list_now", listed)
    assert suture.open(url)["w"].read().tolist() == [2.0, 2.0]
    older = [key for key in asked if key.startswith("latency/manager/1")]
    assert older == ["latency/manager/1/_METADATA"], asked
