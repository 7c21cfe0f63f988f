"""Large reads of local files around the page cache (``O_DIRECT``), as big saves make them.

The files are real safetensors files; the pieces are made small so that a few hundred KiB
exercise what 30 GiB would (unaligned tensor offsets, many pieces, the end of the file).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import suture
from suture._location import direct
from suture.sources import filesource as _filesource


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct, "PIECE_BYTES", 3 * direct.ALIGNMENT)
    monkeypatch.setattr(direct, "SMALLEST_DIRECT_READ", 1)


def tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {  # odd sizes, so that most tensors start off a 4096-byte boundary
        "a": rng.standard_normal((3, 5), np.float32),
        "b": rng.standard_normal((301, 67), np.float32),
        "c": rng.integers(0, 255, (1001, 13), np.uint8),
        "d": rng.standard_normal((129, 33)).astype(np.float16),
        "z": rng.standard_normal((77, 91), np.float32),  # ends the file off a boundary
    }


@pytest.mark.parametrize("setting", ["1", "0"])
def test_saves_read_the_same_values_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_pieces: None, setting: str
) -> None:
    monkeypatch.setenv("SUTURE_DIRECT_IO", setting)
    stored = tensors()
    save_file(stored, str(tmp_path / "model.safetensors"))
    ckpt = suture.open(tmp_path / "model.safetensors")
    tree = {
        "same": {name: ckpt[name] for name in stored},  # whole rows into the block
        "cast": {name: ckpt[name].astype("bfloat16") for name in ("b", "d", "z")},  # tiles
        "transposed": ckpt["z"].T.astype("bfloat16"),
    }
    with suture.count_bytes_read() as counter:
        suture.save(tree, tmp_path / "out", progress=False)
    assert counter.bytes >= sum(value.nbytes for value in stored.values())
    loaded = suture.load(tmp_path / "out")
    for name, value in stored.items():
        np.testing.assert_array_equal(loaded["same"][name], value)
    for name in ("b", "d", "z"):
        np.testing.assert_array_equal(loaded["cast"][name], stored[name].astype(ml_dtypes.bfloat16))
    np.testing.assert_array_equal(loaded["transposed"], stored["z"].T.astype(ml_dtypes.bfloat16))


def test_direct_reads_match_buffered_reads_at_every_offset(
    tmp_path: Path, small_pieces: None
) -> None:
    data = np.random.default_rng(1).integers(0, 255, 5 * direct.ALIGNMENT + 123, np.uint8)
    path = tmp_path / "blob"
    data.tofile(path)
    for offset, count in [(0, 1), (1, 4095), (4095, 2), (100, 4 * 4096), (5000, len(data) - 5000)]:
        into = np.empty(count, np.uint8)
        assert direct.read_direct(path, offset, into) == count
        np.testing.assert_array_equal(into, data[offset : offset + count])
        view = direct.read_direct_view(path, offset, count)
        assert view is not None
        np.testing.assert_array_equal(view, data[offset : offset + count])
    past_the_end = np.empty(500, np.uint8)
    assert direct.read_direct(path, len(data) - 200, past_the_end) == 200
    np.testing.assert_array_equal(past_the_end[:200], data[-200:])


def test_a_truncated_file_is_an_error_with_direct_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_pieces: None
) -> None:
    monkeypatch.setenv("SUTURE_DIRECT_IO", "1")
    path = tmp_path / "model.safetensors"
    save_file({"w": np.ones((512, 64), np.float32)}, str(path))
    source = suture.open(path)["w"].node
    os.truncate(path, path.stat().st_size - 1000)
    unchecked = _filesource.FileRangeSource(  # without the file identity check (issue 19)
        source.file, source.offset, source.shape, source.dtype, "w"
    )
    whole = (range(512), range(64))
    with pytest.raises(suture.CorruptCheckpointError, match=r"'w' needs .*truncated"):
        unchecked.read_into(whole, np.empty((512, 64), ml_dtypes.bfloat16))  # cast tiles
    with pytest.raises(suture.CorruptCheckpointError, match=r"'w' needs .*truncated"):
        unchecked.read(whole)  # whole rows


def test_a_file_system_without_direct_io_is_read_through_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_pieces: None
) -> None:
    """tmpfs on older kernels refuses O_DIRECT with EINVAL: reads fall back, values stay."""
    monkeypatch.setenv("SUTURE_DIRECT_IO", "1")
    real_open = os.open

    def refusing_direct(path, flags, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_direct)
    stored = tensors()
    save_file(stored, str(tmp_path / "model.safetensors"))
    ckpt = suture.open(tmp_path / "model.safetensors")
    np.testing.assert_array_equal(ckpt["b"].read(), stored["b"])
    np.testing.assert_array_equal(
        ckpt["z"].astype("bfloat16").read(), stored["z"].astype(ml_dtypes.bfloat16)
    )


def test_saves_read_directly_once_they_read_a_quarter_of_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SUTURE_DIRECT_IO", raising=False)
    monkeypatch.setattr(direct, "_physical_memory", lambda: 24 << 30)
    assert not direct.should_read_direct(5 << 30)
    assert direct.should_read_direct(6 << 30)
    monkeypatch.setenv("SUTURE_DIRECT_IO", "0")
    assert not direct.should_read_direct(30 << 30)
    monkeypatch.setenv("SUTURE_DIRECT_IO", "1")
    assert direct.should_read_direct(0)


def test_reads_go_around_the_cache_only_inside_a_big_save(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SUTURE_DIRECT_IO", raising=False)
    big = 64 << 20
    assert not direct.wanted(big)
    with direct.direct_reads(True):
        assert direct.wanted(big)
        assert not direct.wanted(direct.SMALLEST_DIRECT_READ - 1)  # small reads keep the cache
    with direct.direct_reads(False):
        assert not direct.wanted(big)
    assert not direct.wanted(big)
