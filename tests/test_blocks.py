"""suture._exec.blocks: how each leaf is cut into blocks, and what a block may cost.

Blocks are planned for suture's real writers: a tensor's byte range in a safetensors file
(`SafetensorsTensorWriter`, rows of one element), and a zarr3 array opened with TensorStore
(`OrbaxArrayWriter`, rows of a chunk). Sources are safetensors files written with the
safetensors library. Every plan is then run (each block read and written) and the output
read back: blocks must cover the leaf exactly once, in whole chunks of the writer.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorstore as ts
from safetensors.numpy import load_file, save_file

import suture
from suture._exec.blocks import (
    REMOTE_BLOCK_SHARE,
    WRITE_THREADS,
    Block,
    block_budget,
    block_budget_for,
    check_blocks_fit,
    chunk_rows,
    leaf_blocks,
    plan_blocks,
)
from suture._iostats import count_bytes_read
from suture._location import location_of
from suture._save.verify import DigestingWriter
from suture.sinks.orbax import OrbaxArrayWriter
from suture.sinks.safetensors import SafetensorsTensorWriter

KIB = 1 << 10


def values(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def zarr_writer(folder: Path, shape: tuple[int, ...], chunk: tuple[int, ...]) -> Any:
    store = ts.open(
        {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(folder)}},
        create=True,
        dtype=ts.float32,
        shape=shape,
        chunk_layout=ts.ChunkLayout(chunk_shape=chunk),
    ).result()
    opened: Future = Future()  # the writer waits for its array's opening, as the sink's do
    opened.set_result(store)
    return store, OrbaxArrayWriter(opened, chunk, np.dtype(np.float32).itemsize)


class SafetensorsOutput:
    """One tensor's place in a real safetensors file (laid out by the safetensors library)."""

    def __init__(self, path: Path, array: Any) -> None:
        save_file({"t": np.zeros(array.shape, array.dtype)}, str(path))
        with open(path, "rb") as stream:
            length = int.from_bytes(stream.read(8), "little")
            header = json.loads(stream.read(length))
        self.path = path
        self.descriptor = os.open(path, os.O_RDWR)
        self.writer = SafetensorsTensorWriter(
            self.descriptor, 8 + length + header["t"]["data_offsets"][0], array
        )

    def read(self) -> np.ndarray:
        os.close(self.descriptor)
        return load_file(str(self.path))["t"]


def run(blocks: list[Block]) -> None:
    for block in blocks:
        block.write(np.asarray(block.view.read()))


def covered(blocks: list[Block], length: int, unit: int) -> None:
    """The blocks are consecutive whole multiples of `unit` along their axis, 0 to `length`."""
    position = 0
    for block in blocks:
        start, stop = block.rows.start, block.rows.stop
        assert start == position and start % unit == 0
        assert (stop - start) % unit == 0 or stop == length, (block.rows, unit)
        position = stop
    assert position == length


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, np.ndarray], Any]:
    path = tmp_path_factory.mktemp("blocks") / "model.safetensors"
    tensors = {"embed": values((100, 64)), **{f"w.{i}": values((64, 32), i) for i in range(8)}}
    save_file(tensors, str(path))
    return tensors, suture.open(path)


def test_chunk_rows_and_block_budget() -> None:
    assert chunk_rows((100, 10), 4, 400) == 10  # rows of 40 bytes
    assert chunk_rows((100, 10), 4, 439) == 10  # whole rows only
    assert chunk_rows((100, 10), 4, 10) == 1  # a row larger than a chunk: one row
    assert chunk_rows((100, 10), 4, 1 << 30) == 100  # no more rows than there are
    assert chunk_rows((0, 10), 4, 400) == 1 and chunk_rows((), 4, 400) == 1
    assert chunk_rows((5, 0), 4, 400) == 5  # rows of no bytes
    assert block_budget(1000, 4) == 250
    assert block_budget(1000) == 1000 // WRITE_THREADS
    assert block_budget(3, 4) == 1  # never zero
    # a local folder: a share per thread; a bucket: larger blocks than its many threads'
    assert block_budget_for(location_of(Path("out")), 1 << 30) == (1 << 30) // WRITE_THREADS
    bucket = location_of("gs://bucket/out")
    assert block_budget_for(bucket, 1 << 30) == (1 << 30) // REMOTE_BLOCK_SHARE


@pytest.mark.parametrize("budget", [2 * KIB, 6 * KIB, 13 * KIB, 1 << 20])
@pytest.mark.parametrize("chunk", [1, 8, 30])
def test_blocks_are_whole_chunks_of_the_writer_and_cover_the_leaf(
    tmp_path: Path, source: tuple[dict, Any], budget: int, chunk: int
) -> None:
    tensors, ckpt = source
    leaf = ckpt["embed"] * 2.0
    store, writer = zarr_writer(tmp_path / "out", leaf.shape, (chunk, 64))
    blocks = list(plan_blocks("embed", leaf, writer, budget))
    covered(blocks, 100, chunk)
    assert all(block.axis == 0 and block.outer == () for block in blocks)
    # within the budget wherever one chunk fits it; never smaller than one chunk
    one_chunk = next(iter(plan_blocks("embed", leaf[:chunk], writer, 0))).cost
    if one_chunk <= budget:
        assert all(block.cost <= budget for block in blocks)
    else:
        assert all(block.rows.stop - block.rows.start <= chunk for block in blocks)
    if budget >= 1 << 20:
        assert len(blocks) == 1  # the whole leaf fits
    run(blocks)
    np.testing.assert_array_equal(store.read().result(), tensors["embed"] * 2.0)


def test_a_map_of_the_whole_array_is_one_block(tmp_path: Path, source: tuple[dict, Any]) -> None:
    tensors, ckpt = source
    leaf = suture.map(lambda x: x - x.mean(0), ckpt["embed"])
    store, writer = zarr_writer(tmp_path / "out", leaf.shape, (4, 64))
    (block,) = plan_blocks("centered", leaf, writer, 2 * KIB)
    assert block.rows == slice(None) and block.cost > 2 * KIB
    run([block])
    expected = tensors["embed"] - tensors["embed"].mean(0)
    np.testing.assert_allclose(store.read().result(), expected, rtol=1e-6, atol=1e-6)


def test_a_stack_of_transposed_layers_is_cut_along_its_stacking_axis(
    tmp_path: Path, source: tuple[dict, Any]
) -> None:
    """MaxText's layout: blocks of rows would be column strips of every layer, each reading
    the whole layer; blocks of whole layers along axis 1 read each layer once."""
    tensors, ckpt = source
    leaf = suture.stack([ckpt[f"w/{i}"].T for i in range(8)], axis=1)  # (32, 8, 64)
    store, writer = zarr_writer(tmp_path / "out", leaf.shape, (4, 1, 64))
    budget, max_memory = 24 * KIB, 1 << 20
    rows_only = list(plan_blocks("kernel", leaf, writer, budget))
    assert all(block.axis == 0 for block in rows_only) and len(rows_only) > 1
    blocks = list(leaf_blocks("kernel", leaf, writer, budget, max_memory))
    assert all(block.axis == 1 for block in blocks) and len(blocks) > 1
    covered(blocks, 8, 1)
    assert all(block.cost <= budget for block in blocks)
    stored = sum(tensors[f"w.{i}"].nbytes for i in range(8))
    with count_bytes_read() as by_layers:
        run(blocks)
    assert by_layers.bytes == stored  # each layer read once
    with count_bytes_read() as by_rows:
        for block in rows_only:
            block.view.read()
    assert by_rows.bytes == len(rows_only) * stored  # what cutting by rows would have read
    expected = np.stack([tensors[f"w.{i}"].T for i in range(8)], axis=1)
    np.testing.assert_array_equal(store.read().result(), expected)
    # without max_memory (shares of several processes), blocks stay blocks of rows
    assert all(
        block.axis == 0
        for block in leaf_blocks("kernel", leaf, writer, budget, max_memory, avoid_rereads=False)
    )


def test_a_stack_of_the_experts_of_one_fused_tensor_is_cut_into_blocks_of_experts(
    tmp_path: Path,
) -> None:
    """Qwen3.5's published experts: one (experts, 2 * width, hidden) tensor, each expert's
    gate half transposed and stacked. Every expert reads its own part of the one source, so
    blocks of a few experts read it once between them; counting only the largest of the
    source's reads once made them look like re-reads, and the leaf ran as one block of the
    whole budget, alone (one core)."""
    fused = values((16, 2 * 8, 32))
    path = tmp_path / "model.safetensors"
    save_file({"gate_up": fused}, str(path))
    gate_up = suture.open(path)["gate_up"]
    leaf = suture.stack([gate_up[e, :8].T for e in range(16)])  # (16, 32, 8)
    store, writer = zarr_writer(tmp_path / "out", leaf.shape, (2, 32, 8))
    budget = 8 * KIB
    blocks = list(leaf_blocks("wi_0", leaf, writer, budget, max_memory=1 << 20))
    assert all(block.axis == 0 for block in blocks) and len(blocks) > 2
    covered(blocks, 16, 2)
    assert all(block.cost <= budget for block in blocks)
    with count_bytes_read() as counted:
        run(blocks)
    assert counted.bytes <= fused.nbytes  # each expert's rows read once
    np.testing.assert_array_equal(store.read().result(), fused[:, :8].transpose(0, 2, 1))


@pytest.mark.parametrize("avoid_rereads", [True, False])
def test_a_matrix_chunked_by_columns_is_cut_into_blocks_of_columns(
    tmp_path: Path, avoid_rereads: bool
) -> None:
    """MaxText's `logits_dense` (HF's `lm_head` turned around) is chunked by its columns:
    its blocks are columns too, each within the block budget and reading its own rows of
    the source, for one process and for the shares of several (`avoid_rereads=False`)."""
    stored = values((256, 16))
    path = tmp_path / "model.safetensors"
    save_file({"lm_head": stored}, str(path))
    leaf = suture.open(path)["lm_head"].T  # (16, 256)
    store, writer = zarr_writer(tmp_path / "out", leaf.shape, (16, 32))
    budget = 8 * KIB  # two chunks a block, of the eight
    blocks = list(leaf_blocks("logits", leaf, writer, budget, 1 << 20, avoid_rereads))
    assert all(block.axis == 1 for block in blocks) and len(blocks) > 2
    covered(blocks, 256, 32)
    assert all(block.cost <= budget for block in blocks)
    with count_bytes_read() as counted:
        run(blocks)
    assert counted.bytes == stored.nbytes
    np.testing.assert_array_equal(store.read().result(), stored.T)


def test_a_writer_that_takes_no_blocks_along_the_last_axis_gets_rows(tmp_path: Path) -> None:
    """`unit_along` may say None (no blocks along that axis), as a writer wrapping one
    without it does: the leaf is cut into rows, where the planner failed on a TypeError."""
    stored = values((256, 16))
    save_file({"lm_head": stored}, str(tmp_path / "model.safetensors"))
    leaf = suture.open(tmp_path / "model.safetensors")["lm_head"].T  # (16, 256)
    output = SafetensorsOutput(tmp_path / "out.safetensors", leaf)
    writer = DigestingWriter(output.writer, ("t", ()), {}, threading.Lock())
    assert writer.unit_along(1) is None
    blocks = list(plan_blocks("t", leaf, writer, KIB, max_memory=1 << 20))
    assert all(block.axis == 0 for block in blocks)
    covered(blocks, 16, 1)
    run(blocks)
    np.testing.assert_array_equal(output.read(), stored.T)


def row_writers(tmp_path: Path, array: Any) -> Iterator[tuple[str, Any, Any]]:
    """A safetensors tensor (rows of one element) and a zarr3 array of one-row chunks."""
    output = SafetensorsOutput(tmp_path / "out.safetensors", array)
    yield "safetensors", output.writer, output.read
    store, writer = zarr_writer(tmp_path / "out", array.shape, (1, 4096))
    yield "zarr3", writer, lambda: store.read().result()


def test_a_row_too_large_for_a_block_is_written_in_parts(tmp_path: Path) -> None:
    """Each row is a 1-D tensor of the source, so a part of a row reads only its elements
    (a part of a row of a 2-D safetensors tensor would read the whole row again)."""
    data = values((3, 40_000))  # 160 KB per row
    path = tmp_path / "long.safetensors"
    save_file({f"row.{i}": data[i] for i in range(3)}, str(path))
    ckpt = suture.open(path)
    leaf = suture.stack([ckpt[f"row/{i}"] for i in range(3)])
    budget, max_memory = 16 * KIB, 64 * KIB
    for name, writer, written in row_writers(tmp_path, leaf):
        blocks = list(leaf_blocks("long", leaf, writer, budget, max_memory))
        assert [block.outer for block in blocks] == sorted(block.outer for block in blocks)
        for index in range(3):
            parts = [block for block in blocks if block.outer == (index,)]
            assert len(parts) > 1, name
            assert all(block.array.shape == (40_000,) for block in parts)
            covered(parts, 40_000, 1 if name == "safetensors" else 4096)
        check_blocks_fit(blocks, max_memory)  # every part fits
        with count_bytes_read() as counted:
            run(blocks)
        assert counted.bytes == data.nbytes  # each part reads its own elements
        np.testing.assert_array_equal(written(), data)


def test_rows_that_fit_are_not_cut(tmp_path: Path, source: tuple[dict, Any]) -> None:
    tensors, ckpt = source
    output = SafetensorsOutput(tmp_path / "out.safetensors", ckpt["embed"])
    blocks = list(leaf_blocks("embed", ckpt["embed"], output.writer, 2 * KIB, 1 << 20))
    assert all(block.outer == () for block in blocks) and len(blocks) > 1
    covered(blocks, 100, 1)
    run(blocks)
    np.testing.assert_array_equal(output.read(), tensors["embed"])


def test_a_block_over_the_budget_is_refused_with_what_would_work(
    tmp_path: Path, source: tuple[dict, Any]
) -> None:
    _, ckpt = source
    embed = ckpt["embed"]
    normed = suture.map(
        lambda x: x / np.linalg.norm(x), embed, shape=embed.shape, dtype=embed.dtype
    )
    leaf = normed  # a map of the whole array: one block
    store, writer = zarr_writer(tmp_path / "out", leaf.shape, (10, 64))
    blocks = list(leaf_blocks("normed", leaf, writer, 4 * KIB, 16 * KIB))
    (block,) = blocks
    with pytest.raises(suture.SurgeryError) as refused:
        check_blocks_fit(blocks, 16 * KIB)
    message = str(refused.value)
    assert message.startswith("Leaf 'normed' cannot be written within max_memory=16.0 KiB")
    assert "smaller chunk_bytes" in message and "elementwise=True" in message
    needed = int(re.search(r"Pass max_memory='(\d+)MiB' or more", message).group(1))
    assert needed == math.ceil(block.cost / (1 << 20))
    check_blocks_fit(blocks, needed << 20)  # what it suggests is enough
    check_blocks_fit(blocks, block.cost)  # exactly the cost fits
    with pytest.raises(suture.SurgeryError, match="'normed'"):
        check_blocks_fit(blocks, block.cost - 1)
    check_blocks_fit([], 0)
    assert not store.read().result().any()  # nothing was written


def test_the_worst_block_is_named(tmp_path: Path, source: tuple[dict, Any]) -> None:
    _, ckpt = source
    _, writer = zarr_writer(tmp_path / "out", (100, 64), (10, 64))
    small = next(iter(plan_blocks("small", ckpt["embed"][:10], writer, 1 << 20)))
    embed = ckpt["embed"]
    sort = suture.map(lambda x: np.sort(x, 0), embed, shape=embed.shape, dtype=embed.dtype)
    large = next(iter(plan_blocks("large", sort, writer, 0)))
    assert small.cost < large.cost
    with pytest.raises(suture.SurgeryError, match=r"^Leaf 'large'"):
        check_blocks_fit([small, large, small], small.cost - 1)


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("one.safetensors", "safetensors"), ("folder", "safetensors"), ("ckpt", "orbax")],
)
def test_every_output_over_its_budget_says_the_budget_that_fits(tmp_path: Path, name, fmt) -> None:
    """A folder of safetensors shards once failed its budget check on its own scratch folder
    (a FileExistsError that hid the advice); every output now gives the same error."""
    x = suture.LazyArray.from_array(np.ones((1024, 1024), np.float32))
    tree = {"w": suture.map(lambda a: np.sort(a, axis=0), x, shape=x.shape, dtype=x.dtype)}
    with pytest.raises(
        suture.ArgumentError,
        match=r"Leaf 'w' cannot be written within max_memory=1.0 MiB.*Pass max_memory=",
    ):
        suture.save(tree, tmp_path / name, format=fmt, max_memory="1MiB", progress=False)
    assert list(tmp_path.iterdir()) == []
