"""Reads of safetensors tensors: over 2 GiB, by columns in strips, and fused with casts."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

import suture
from suture._buffers import assign
from suture._iostats import count_bytes_read
from suture._lazy.selection import full
from suture._location.base import read_fully
from suture.sources import filesource as _filesource

# Linux returns at most this many bytes from one read call.
LINUX_READ_LIMIT = 2_147_479_552


def sparse_safetensors(path: Path, length: int) -> None:
    """A safetensors file with one uint8 tensor of `length` bytes, mostly a hole on disk.

    The safetensors library would need the whole tensor in memory to write it, so the
    header is written the way it writes one (the test checks that it opens the file).
    """
    header = json.dumps({"embed": {"dtype": "U8", "shape": [length], "data_offsets": [0, length]}})
    header = header.encode() + b" " * (-len(header) % 8)
    start = 8 + len(header)
    with open(path, "wb") as stream:
        stream.write(len(header).to_bytes(8, "little") + header)
        stream.write(b"\x01\x02\x03")  # markers at the start, at the limit, and at the end
        stream.seek(start + LINUX_READ_LIMIT)
        stream.write(b"\x04")
        stream.seek(start + length - 2)
        stream.write(b"\x05\x06")


def test_a_tensor_over_2_gib_is_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "big.safetensors"
    length = LINUX_READ_LIMIT + 8192
    sparse_safetensors(path, length)
    with safe_open(str(path), framework="numpy") as stock:  # the library accepts the file
        assert stock.get_slice("embed")[length - 2 :].tolist() == [5, 6]
    embed = suture.open(path)["embed"]
    with count_bytes_read() as counter:
        values = embed.read()
    assert counter.bytes == length
    assert values.shape == (length,)
    assert values[:4].tolist() == [1, 2, 3, 0]
    assert values[LINUX_READ_LIMIT] == 4
    assert values[-3:].tolist() == [0, 5, 6]
    del values


def test_read_fully_reports_the_end_of_a_short_file(tmp_path: Path) -> None:
    path = tmp_path / "short"
    path.write_bytes(b"abc")
    buffer = np.zeros(8, np.uint8)
    with open(path, "rb") as stream:
        assert read_fully(stream.fileno(), buffer, 1) == 2
    assert bytes(buffer[:2]) == b"bc"


def test_a_truncated_file_is_an_error_naming_the_tensor(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_file({"w": np.ones((64, 64), np.float32)}, str(path))
    weights = suture.open(path)["w"]
    with open(path, "r+b") as stream:
        stream.truncate(path.stat().st_size - 100)
    with pytest.raises(suture.CorruptCheckpointError, match=r"changed since it was opened.*'w'"):
        weights.read()  # the file's identity check (issue 19) catches it first
    source = weights.node
    unchecked = _filesource.FileRangeSource(
        source.file, source.offset, source.shape, source.dtype, "w"
    )
    with pytest.raises(suture.CorruptCheckpointError, match=r"'w' needs 16384 bytes.*truncated"):
        unchecked.read((range(64), range(64)))  # the read loop's own check, without identity


@pytest.fixture
def small_strips(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strips of a few rows, so that small tensors are read in many strips."""
    monkeypatch.setattr(_filesource, "STRIP_BYTES", 3 * 40 * 4)
    monkeypatch.setattr(_filesource, "TILE_BYTES", 5 * 40 * 4)


SELECTIONS = [
    (slice(None), slice(3, 17)),
    (slice(None, None, -1), slice(None, None, 3)),
    (slice(2, 29, 4), slice(None)),
    (slice(27, 1, -5), 7),
    ([5, 1, 1, 30, 0, 12], slice(4, 9)),
    (slice(None, None, 11), [3, 0, 39]),
    (4, slice(None)),
    (slice(7, 7), slice(None)),
]


@pytest.mark.parametrize("index", SELECTIONS, ids=str)
def test_partial_reads_in_strips_match_numpy(
    index: tuple, small_strips: None, tmp_path: Path
) -> None:
    values = np.arange(31 * 40, dtype=np.float32).reshape(31, 40)
    save_file({"w": values}, str(tmp_path / "m.safetensors"))
    lazy = suture.open(tmp_path / "m.safetensors")["w"]
    np.testing.assert_array_equal(lazy[index].read(), values[index])
    np.testing.assert_array_equal(lazy.T[index[::-1]].read(), values.T[index[::-1]])


@pytest.mark.parametrize("index", SELECTIONS, ids=str)
def test_partial_reads_into_a_callers_array_match_numpy(
    index: tuple, small_strips: None, tmp_path: Path
) -> None:
    """A column read into the caller's array (as the blocks of a save are read) goes a strip
    at a time straight into it: into a transposed view, cast, the values are numpy's."""
    values = np.arange(31 * 40, dtype=np.float32).reshape(31, 40)
    save_file({"w": values}, str(tmp_path / "m.safetensors"))
    lazy = suture.open(tmp_path / "m.safetensors")["w"]
    for view, expected in (
        (lazy[index], values[index]),
        (lazy.T[index[::-1]], values.T[index[::-1]]),
    ):
        out = np.full(expected.shape[::-1], -1, np.float16).T  # a transposed view
        view.node.read_into(full(view.shape), out)
        assert out.tobytes() == expected.astype(np.float16).tobytes()


def test_fused_cast_transpose_and_stack_equal_numpy(small_strips: None, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    layers = {f"l{i}": rng.standard_normal((300, 40), dtype=np.float32) for i in range(3)}
    save_file(layers, str(tmp_path / "m.safetensors"))
    ckpt = suture.open(tmp_path / "m.safetensors")
    stacked = suture.stack([ckpt[f"l{i}"].T for i in range(3)]).astype("bfloat16")
    expected = np.stack([layers[f"l{i}"].T for i in range(3)]).astype(ml_dtypes.bfloat16)
    assert stacked.read().tobytes() == expected.tobytes()
    wide = ckpt["l0"].T.astype("float16")  # transposed tiles larger than one copy square
    assert wide.read().tobytes() == layers["l0"].T.astype(np.float16).tobytes()
    assert wide[5:9].read().tobytes() == layers["l0"].T[5:9].astype(np.float16).tobytes()


def test_a_column_read_costs_whole_rows_and_holds_one_strip(tmp_path: Path) -> None:
    save_file({"w": np.ones((1000, 256), np.float32)}, str(tmp_path / "m.safetensors"))
    source = suture.open(tmp_path / "m.safetensors")["w"].node
    cost = source.read_cost((range(1000), range(0, 2)))
    assert cost.disk == 1000 * 256 * 4
    assert cost.memory == 1000 * 2 * 4 + 1000 * 256 * 4  # the result and one strip (< 32 MiB)


def test_a_column_read_into_the_callers_array_holds_one_strip(tmp_path: Path) -> None:
    """Read into a block's own array (a save's blocks), a column read holds one strip of
    rows, not a temporary of the whole result besides it; picking single columns also holds
    their copy out of the strip."""
    save_file({"w": np.ones((1000, 256), np.float32)}, str(tmp_path / "m.safetensors"))
    source = suture.open(tmp_path / "m.safetensors")["w"].node
    strip = 1000 * 256 * 4
    assert source.read_cost((range(1000), range(0, 2)), into=True) == (strip, strip)
    assert source.read_cost((range(1000), [0, 5]), into=True) == (strip, strip + 1000 * 2 * 4)


def test_a_transposed_leaf_is_read_once_with_room_for_one_strip(tmp_path: Path) -> None:
    """lm_head's transpose: the whole leaf is one block when the leaf, one strip and the
    writer's chunks fit, without a second copy of the leaf; so it is read once."""
    path = tmp_path / "model.safetensors"
    stored = np.random.default_rng(0).standard_normal((2048, 512), np.float32)  # 4 MiB
    save_file({"lm_head": stored}, str(path))
    head = suture.open(path)["lm_head"]
    with count_bytes_read() as counter:
        result = suture.save({"t": head.T}, tmp_path / "out", max_memory="10MiB", progress=False)
    assert stored.nbytes <= counter.bytes < stored.nbytes + 4096  # the rest is the header
    assert 0 < result.peak_in_flight <= 10 << 20
    assert np.asarray(suture.load(tmp_path / "out")["t"]).tobytes() == stored.T.tobytes()


def test_assign_casts_into_transposed_views_as_astype_does() -> None:
    values = np.random.default_rng(1).standard_normal((3, 300, 700), dtype=np.float32)
    values[0, 0, :3] = [np.nan, np.inf, -0.0]
    out = np.empty((3, 700, 300), ml_dtypes.bfloat16)
    assign(out.transpose(0, 2, 1), values)  # a stack of transposed matrices, tile by tile
    expected = values.transpose(0, 2, 1).astype(ml_dtypes.bfloat16)
    assert out.tobytes() == expected.tobytes()
    single = np.empty((700, 300), np.float16)
    assign(single.T, values[1])
    assert single.tobytes() == values[1].T.astype(np.float16).tobytes()


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32, np.int8, np.float64])
@pytest.mark.parametrize(
    ("rows", "columns", "start", "spare"),
    [(300, 500, 0, 0), (257, 301, 1, 3), (1024, 700, 4, 4), (513, 1100, 2, 1), (260, 260, 0, 0)],
)
def test_transposed_copies_are_exact_at_any_shape_and_offset(
    dtype: np.dtype, rows: int, columns: int, start: int, spare: int
) -> None:
    """Rows interleaved into 64-bit lanes where the view is aligned, element copies where it
    is not (odd offsets, row counts that are not a multiple of the lanes): the same bytes."""
    rng = np.random.default_rng(rows)
    stored = np.zeros((columns, start + rows + spare), dtype)
    out = stored.T[start : start + rows]  # rows adjacent in memory, maybe off 8 bytes
    for source_dtype in (np.float32, dtype):
        values = (rng.standard_normal((rows, columns)) * 50).astype(source_dtype)
        stored[...] = 0
        assign(out, values)
        assert out.tobytes() == values.astype(dtype).tobytes()
        assert not stored.T[:start].any() and not stored.T[start + rows :].any()


def test_a_compressed_npz_member_costs_the_whole_member(tmp_path: Path) -> None:
    values = np.zeros((400, 100), np.float32)
    np.savez_compressed(tmp_path / "m.npz", w=values)
    leaf = suture.open(tmp_path / "m.npz")["w"]
    cost = leaf.node.read_cost((range(2), range(100)))
    assert cost.memory == values.nbytes + 2 * 100 * 4  # inflated whole, whatever is picked
    with count_bytes_read() as counter:
        leaf[:2].read()
    assert cost.disk == counter.bytes < values.nbytes  # the compressed bytes


def test_orbax_leaves_transposed_into_safetensors_match_numpy(tmp_path: Path) -> None:
    """TensorStore fills transposed outputs a tile of chunks at a time (the reverse route)."""
    from safetensors.numpy import load_file

    from tests.orbax_writers import save_standard

    rng = np.random.default_rng(2)
    tree = {
        "a": rng.standard_normal((700, 300), dtype=np.float32),
        "s": rng.standard_normal((3, 500, 200), dtype=np.float32),
    }
    save_standard(tmp_path / "stock", tree)  # one chunk per array
    suture.save(tree, tmp_path / "small", chunk_bytes="64KiB", progress=False)  # many chunks
    for name in ("stock", "small"):
        ckpt = suture.open(tmp_path / name)
        out = {
            "a_t": ckpt["a"].T,
            "s_t": suture.stack([ckpt["s"][i].T for i in range(3)]),
            "part_t": ckpt["a"][100:650].T,
        }
        suture.save(out, tmp_path / f"{name}.safetensors", format="safetensors", progress=False)
        stock = load_file(str(tmp_path / f"{name}.safetensors"))
        np.testing.assert_array_equal(stock["a_t"], tree["a"].T)
        np.testing.assert_array_equal(stock["s_t"], tree["s"].transpose(0, 2, 1))
        np.testing.assert_array_equal(stock["part_t"], tree["a"][100:650].T)


def test_reshapes_fill_outputs_in_place_and_equal_numpy(tmp_path: Path) -> None:
    weights = np.random.default_rng(3).standard_normal((256, 512), dtype=np.float32)
    save_file({"q": weights}, str(tmp_path / "m.safetensors"))
    heads = suture.open(tmp_path / "m.safetensors")["q"].T.reshape(512, 8, 32).astype("bfloat16")
    expected = weights.T.reshape(512, 8, 32).astype(ml_dtypes.bfloat16)
    suture.save({"heads": heads}, tmp_path / "out", progress=False, chunk_bytes="16KiB")
    assert suture.load(tmp_path / "out")["heads"].tobytes() == expected.tobytes()
    assert heads[100:200, 3:5].read().tobytes() == expected[100:200, 3:5].tobytes()
