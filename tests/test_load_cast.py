"""Loads that cast as they read: each shard's bytes land in the buffer handed to its device.

`read_cast_into` reads into the result's own memory and casts in place; `suture.load` of a
safetensors file onto a mesh reads each row shard into a buffer of its own, which jax keeps
as the device's. The values are ``astype``'s, bit for bit (ml_dtypes' round to nearest even).
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors.numpy import save_file

import suture
from suture._buffers import read_cast_into

BF16 = np.dtype(ml_dtypes.bfloat16)
TILE = 1 << 15  # the tile of read_cast_into


def _read_cast(values: np.ndarray, dtype: np.dtype) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """`values` cast to `dtype` by `read_cast_into` from their bytes, and the reads it made."""
    source = values.reshape(-1).view(np.uint8)
    size = values.dtype.itemsize
    reads: list[tuple[int, int]] = []

    def read(start: int, stop: int, into: np.ndarray) -> None:
        assert into.nbytes == (stop - start) * size
        reads.append((start, stop))
        into[:] = source[start * size : stop * size]

    out = np.full(values.shape, 7, dtype)  # never all zeros: a missed element shows
    with np.errstate(invalid="ignore", over="ignore"):  # as astype, NaN to a narrower type
        read_cast_into(out, values.dtype, read)
    return out, reads


def _bits(values: np.ndarray) -> np.ndarray:
    return values.view(f"u{values.dtype.itemsize}")


def _astype(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return values.astype(dtype)


def test_every_float16_value_casts_in_place_as_astype_does() -> None:
    values = np.arange(1 << 16, dtype=np.uint16).view(np.float16)  # subnormals, inf, NaN
    out, reads = _read_cast(values, BF16)
    np.testing.assert_array_equal(_bits(out), _bits(_astype(values, BF16)))
    assert reads == [(0, 1 << 16)]  # same size: one read, into the result itself


@pytest.mark.parametrize("count", [0, 1, 5, TILE - 1, TILE + 3, 5 * TILE + 123, 90 * TILE + 5])
def test_a_narrowing_cast_reads_in_chunks_that_shrink_at_the_end(count: int) -> None:
    bits = np.random.default_rng(count).integers(0, 1 << 32, size=count, dtype=np.uint32)
    bits[::97] = 0x3F808000  # ties to even, NaN payloads, values that round to infinity
    bits[1::97] = 0x7F800001
    bits[2::97] = 0x7F7FFFFF
    values = bits.view(np.float32)
    out, reads = _read_cast(values, BF16)
    np.testing.assert_array_equal(_bits(out), _bits(_astype(values, BF16)))
    covered = [index for start, stop in reads for index in range(start, stop)]
    assert covered == list(range(count))  # each element read once, in order
    if count > 2 * TILE:  # a chunk at a time (8 MiB), at most half of what is left
        assert reads[0] == (0, min(count // 2, 2 * 1024 * 1024))


def test_no_cast_reads_straight_into_the_result_and_copies_nothing(monkeypatch) -> None:
    import suture._buffers as buffers

    def refuse(*arguments) -> None:
        raise AssertionError("a read of the result's own dtype went through a cast")

    monkeypatch.setattr(buffers, "cast_bytes_into", refuse)
    monkeypatch.setattr(buffers, "cast_into", refuse)
    values = np.random.default_rng(2).normal(size=(3 * 1024 * 1024 + 5, 1)).astype(np.float32)
    out, reads = _read_cast(values, values.dtype)
    np.testing.assert_array_equal(out, values)
    assert reads[0] == (0, 2 * 1024 * 1024) and reads[-1][1] == values.size  # 8 MiB chunks


@pytest.mark.parametrize(
    ("stored", "wanted"),
    [
        (np.float16, np.float32),  # widening: read into the second half, cast forward
        (BF16, np.float64),
        (np.int32, np.float32),  # same size, another kind
        (np.float64, np.float16),
        (np.int8, np.int64),
    ],
)
def test_other_casts_in_place_match_astype(stored: np.dtype, wanted: np.dtype) -> None:
    # float64: past one chunk (8 MiB of the source)
    values = np.random.default_rng(1).normal(0, 300, size=100_003 * 11).astype(stored)
    out, _ = _read_cast(values.reshape(-1, 11), np.dtype(wanted))
    np.testing.assert_array_equal(out, _astype(values, np.dtype(wanted)).reshape(-1, 11))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A safetensors file with float16 (specials included) and float32 tensors."""
    rng = np.random.default_rng(0)
    special = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    tensors = {
        "embed": np.concatenate([special, rng.normal(size=64 * 1024).astype(np.float16)]),
        "odd": rng.normal(size=(64, 7)).astype(np.float16),  # shards of 112 bytes
        "wide": rng.normal(size=(2048, 300)).astype(np.float32),  # 76800 elements a shard
        "norm": rng.normal(size=(300,)).astype(np.float32),
        "tall": rng.normal(size=(5000, 128)).astype(np.float32),  # strips of 4096 rows
    }
    tensors["embed"] = tensors["embed"].reshape(1024, 128)
    path = tmp_path_factory.mktemp("castload")
    save_file(tensors, str(path / "model.safetensors"))
    return path


def _mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(shape), names)


LAYOUTS = {
    "1-D rows": (_mesh((8,), ("x",)), P("x")),
    "2-D rows, a replicated axis": (_mesh((4, 2), ("x", "y")), P("x")),
    "columns": (_mesh((8,), ("x",)), P(None, "x")),
    "replicated": (_mesh((8,), ("x",)), P()),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_cast_load_onto_a_mesh_gives_astypes_bits(folder: Path, layout: str) -> None:
    mesh, spec = LAYOUTS[layout]
    stored = {name: np.asarray(leaf) for name, leaf in suture.open(folder).tree.items()}

    def target(shape: tuple[int, ...]) -> jax.ShapeDtypeStruct:
        divides = len(spec) <= len(shape) and all(
            shape[axis] % mesh.shape[axis_name] == 0
            for axis, axis_name in enumerate(spec)
            if axis_name is not None
        )
        sharding = NamedSharding(mesh, spec if divides else P())
        return jax.ShapeDtypeStruct(shape, BF16, sharding=sharding)

    loaded = suture.load(folder, {n: target(v.shape) for n, v in stored.items()})
    for name, values in stored.items():
        assert loaded[name].dtype == BF16
        for shard in loaded[name].addressable_shards:
            np.testing.assert_array_equal(
                _bits(np.asarray(shard.data)), _bits(_astype(values[shard.index], BF16))
            )


def _resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="Linux's /proc")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"], ids=["cast", "as stored"])
def test_row_shards_are_read_into_the_buffers_the_devices_keep(tmp_path: Path, dtype: str) -> None:
    """Shards of rows of an odd number of bytes: jax copies a view that does not start on a
    64-byte boundary, so shards cut from one box were copied again (7 of 8 here), the box
    kept by the first: 1.9x the array. Each read into a buffer of its own, jax keeps them."""
    rows = np.random.default_rng(2).normal(size=(8 * 10001, 101)).astype(np.float16)
    save_file({"rows": rows}, str(tmp_path / "model.safetensors"))  # 2,020,202 bytes a shard
    checkpoint = suture.open(tmp_path)
    sharding = NamedSharding(_mesh((8,), ("x",)), P("x"))
    target = {"rows": jax.ShapeDtypeStruct(rows.shape, np.dtype(dtype), sharding=sharding)}
    suture.load(checkpoint, target)  # jax's own first-use allocations, out of the count
    gc.collect()
    before = _resident()
    loaded = suture.load(checkpoint, target)
    gc.collect()
    grown = _resident() - before
    assert grown < 1.3 * loaded["rows"].nbytes, f"{grown} bytes for {loaded['rows'].nbytes}"
    np.testing.assert_array_equal(np.asarray(loaded["rows"]), _astype(rows, np.dtype(dtype)))


def test_a_cast_load_holds_no_read_buffer_besides_the_result(folder: Path) -> None:
    """The result's own memory is the read buffer: no full-size temporary, and no 8 MiB
    read tile kept by each reading thread (what the cast route's extra peak was)."""
    sharding = NamedSharding(_mesh((8,), ("x",)), P("x"))
    target = {"wide": jax.ShapeDtypeStruct((2048, 300), BF16, sharding=sharding)}
    result = 2048 * 300 * BF16.itemsize
    gc.collect()
    tracemalloc.start()
    try:
        loaded = suture.load(folder, target, partial=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < result + (1 << 20), f"peak {peak} for a result of {result} bytes"
    stored = np.asarray(suture.open(folder)["wide"])
    np.testing.assert_array_equal(_bits(np.asarray(loaded["wide"])), _bits(_astype(stored, BF16)))


def test_column_shards_are_filled_from_strips_into_buffers_the_devices_keep(folder: Path) -> None:
    """Shards that cut the columns (and rows, across strips): a box read whole and cut into
    column views was copied by jax and freed; each shard is now a buffer of its own, filled
    from strips of rows, and the devices keep those buffers (still allocated after)."""
    mesh = _mesh((4, 2), ("x", "y"))
    sharding = NamedSharding(mesh, P("y", "x"))  # 2 x 4 shards of 2500 x 32
    target = {"tall": jax.ShapeDtypeStruct((5000, 128), BF16, sharding=sharding)}
    checkpoint = suture.open(folder)
    gc.collect()
    tracemalloc.start()
    try:
        loaded = suture.load(checkpoint, target, partial=True)
        gc.collect()
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    result = loaded["tall"].nbytes
    assert kept >= result, f"{kept} bytes kept for a result of {result}"
    assert peak < result + (3 << 20), f"peak {peak} for a result of {result} bytes"
    stored = np.asarray(checkpoint["tall"])
    for shard in loaded["tall"].addressable_shards:
        np.testing.assert_array_equal(
            _bits(np.asarray(shard.data)), _bits(_astype(stored[shard.index], BF16))
        )
