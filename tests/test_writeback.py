from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from safetensors.numpy import save_file

import suture
from suture._location import writeback
from suture.sinks import orbax as orbax_sink

pytestmark = pytest.mark.skipif(not writeback.available(), reason="no posix_fadvise here")


def _wait_for(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_only_finished_files_are_released(tmp_path: Path, monkeypatch) -> None:
    released: list[str] = []
    monkeypatch.setattr(writeback, "release", lambda path: released.append(path.name))
    folder = tmp_path / "d"
    dropper = writeback.DropBehind(folder, interval=0.01)
    try:
        folder.mkdir()  # the folder appears after the thread started
        (folder / "aa").write_bytes(b"x" * 10)
        (folder / "bb.__lock").write_bytes(b"y")  # still being written
        assert _wait_for(lambda: released == ["aa"])
        (folder / "bb.__lock").rename(folder / "bb")
        assert _wait_for(lambda: sorted(released) == ["aa", "bb"])
    finally:
        dropper.stop()
    assert not dropper._thread.is_alive()
    assert sorted(released) == ["aa", "bb"]  # each once


def test_release_leaves_the_bytes_and_tolerates_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_bytes(b"abc" * 5000)
    writeback.release(path)
    assert path.read_bytes() == b"abc" * 5000
    writeback.release(tmp_path / "missing")  # no error


def test_a_large_save_drops_its_data_files_and_stock_orbax_restores_it(
    tmp_path: Path, monkeypatch
) -> None:
    released: list[Path] = []
    original = writeback.release

    def recording(path: Path) -> None:
        released.append(path)
        original(path)

    monkeypatch.setattr(writeback, "release", recording)
    monkeypatch.setattr(writeback, "INTERVAL_SECONDS", 0.01)
    monkeypatch.setattr(orbax_sink, "DROP_BEHIND_BYTES", 1)  # every save counts as large
    write = orbax_sink.OrbaxArrayWriter.write_along

    def slow_write(self, *arguments) -> None:
        write(self, *arguments)
        # the thread looks every 10 ms and takes a file once its mtime is SETTLED_NS old
        time.sleep(writeback.SETTLED_NS / 1e9 + 0.05)

    monkeypatch.setattr(orbax_sink.OrbaxArrayWriter, "write_along", slow_write)
    values = np.random.default_rng(0).standard_normal((64, 256, 256), dtype=np.float32)
    suture.save(
        {"a": values, "b": values[:3] * 2},
        tmp_path / "out",
        chunk_bytes="1MiB",
        max_memory="16MiB",
        progress=False,
    )
    restored = ocp.StandardCheckpointer().restore(tmp_path / "out")
    np.testing.assert_array_equal(restored["a"], values)
    np.testing.assert_array_equal(restored["b"], values[:3] * 2)
    assert released and all(path.parent.name == "d" for path in released)
    assert not [t for t in threading.enumerate() if t.name == "suture-drop-behind"]


def test_a_small_save_starts_no_thread(tmp_path: Path, monkeypatch) -> None:
    started: list[Path] = []
    monkeypatch.setattr(writeback, "DropBehind", lambda folder: started.append(folder))
    suture.save({"a": np.ones((4, 4))}, tmp_path / "out", progress=False)
    assert started == []


def _drop_behind_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "suture-drop-behind" and t.is_alive()]


def test_a_save_refused_over_its_budget_leaves_no_thread(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(orbax_sink, "DROP_BEHIND_BYTES", 1)  # every save counts as large
    path = tmp_path / "model.safetensors"
    save_file({"w": np.ones((512, 1024), np.float32)}, str(path))
    w = suture.open(path)["w"]
    # a map of the whole array is one block, over the budget: refused after a trial save
    normed = suture.map(lambda x: x / np.linalg.norm(x), w, shape=w.shape, dtype=w.dtype)
    with pytest.raises(suture.SurgeryError, match="max_memory"):
        suture.save({"normed": normed}, tmp_path / "out", max_memory="1MiB", progress=False)
    assert _wait_for(lambda: not _drop_behind_threads())
    assert not (tmp_path / "out").exists()


def test_a_save_failing_mid_write_leaves_no_thread(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(orbax_sink, "DROP_BEHIND_BYTES", 1)

    def failing(self, *arguments) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(orbax_sink.OrbaxArrayWriter, "write_along", failing)
    with pytest.raises(suture.SurgeryError):
        suture.save({"a": np.ones((64, 64), np.float32)}, tmp_path / "out", progress=False)
    assert _wait_for(lambda: not _drop_behind_threads())
    assert not (tmp_path / "out").exists()


def test_fsync_tree_skips_only_files_synced_and_unchanged_since(tmp_path: Path, monkeypatch):
    folder = tmp_path / "out"
    (folder / "d").mkdir(parents=True)
    for name in ("a", "b", "c"):
        (folder / "d" / name).write_bytes(name.encode() * 100)
    synced = {writeback.release(folder / "d" / name) for name in ("a", "b")}
    with (folder / "d" / "b").open("ab") as changed:  # written again after it was synced
        changed.write(b"more")
    (folder / "manifest").write_bytes(b"m")
    fsynced: list[str] = []
    original = writeback._fsync
    monkeypatch.setattr(writeback, "_fsync", lambda path: (fsynced.append(path), original(path)))
    writeback.fsync_tree(folder, synced)
    names = sorted(Path(path).relative_to(tmp_path).as_posix() for path in fsynced)
    assert names == ["out", "out/d", "out/d/b", "out/d/c", "out/manifest"]
    fsynced.clear()
    writeback.fsync_tree(folder)  # nothing known synced: everything
    assert len(fsynced) == 6


def test_a_large_saves_files_synced_as_they_go_are_not_synced_again(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(writeback, "INTERVAL_SECONDS", 0.01)
    monkeypatch.setattr(orbax_sink, "DROP_BEHIND_BYTES", 1)
    released: list[str] = []
    release = writeback.release
    monkeypatch.setattr(
        writeback, "release", lambda path: (released.append(path.name), release(path))[1]
    )
    fsynced: list[str] = []
    fsync = writeback._fsync
    monkeypatch.setattr(
        writeback, "_fsync", lambda path: (fsynced.append(Path(path).name), fsync(path))
    )
    write = orbax_sink.OrbaxArrayWriter.write_along

    def slow_write(self, *arguments) -> None:
        write(self, *arguments)
        # the thread looks every 10 ms and takes a file once its mtime is SETTLED_NS old
        time.sleep(writeback.SETTLED_NS / 1e9 + 0.05)

    monkeypatch.setattr(orbax_sink.OrbaxArrayWriter, "write_along", slow_write)
    values = np.random.default_rng(0).standard_normal((32, 256, 256), dtype=np.float32)
    suture.save(
        {"a": values}, tmp_path / "out", chunk_bytes="1MiB", max_memory="16MiB", progress=False
    )
    np.testing.assert_array_equal(ocp.StandardCheckpointer().restore(tmp_path / "out")["a"], values)
    files = {path.name for path in (tmp_path / "out").rglob("*") if path.is_file()}
    assert released and not set(released) & set(fsynced)  # each file synced once
    assert files <= set(released) | set(fsynced)  # and every file synced


def test_a_file_changed_within_its_mtime_tick_after_release_is_synced_again(
    tmp_path: Path, monkeypatch
) -> None:
    # a file's mtime moves in ticks of the kernel's coarse clock (a few ms), so a file
    # written again (same size) in the tick it was released in keeps its `file_key`: the
    # dropper releases a file only once its mtime is a settled while in the past
    folder = tmp_path / "d"
    folder.mkdir()
    path = folder / "manifest"
    path.write_bytes(b"one")
    dropper = writeback.DropBehind(folder, interval=3600)  # passes run by hand below
    try:
        dropper._pass()
        assert dropper.synced == set()  # written just now: left for a later pass
        settled = time.time_ns() - 10**9
        os.utime(path, ns=(settled, settled))
        dropper._pass()
        assert dropper.synced == {writeback.file_key(os.stat(path))}
    finally:
        dropper.stop()
    fsynced: list[str] = []
    monkeypatch.setattr(writeback, "_fsync", lambda name: fsynced.append(Path(name).name))
    path.write_bytes(b"two")  # in place, same size, after the release: a new mtime
    writeback.fsync_tree(folder, dropper.synced)
    assert fsynced == ["manifest", "d"]
