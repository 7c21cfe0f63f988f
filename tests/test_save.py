"""suture.save: round trips that stock Orbax and the safetensors library read, atomically."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import pytest
import tensorstore as ts
from orbax.checkpoint import v1 as ocp_v1
from safetensors.numpy import load_file

import suture
from suture import rules
from suture._iostats import count_bytes_read
from suture.sinks.orbax import BLOSC_LARGEST_CHUNK, chunk_codecs
from tests.orbax_writers import save_standard

DTYPES = [
    np.float32,
    np.float64,
    np.float16,
    ml_dtypes.bfloat16,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.bool_,
]


def every_dtype_tree() -> dict:
    rng = np.random.default_rng(0)
    tree = {
        np.dtype(dtype).name: (rng.standard_normal((3, 5)) * 10).astype(dtype)
        if dtype is not np.bool_
        else rng.random((3, 5)) > 0.5
        for dtype in DTYPES
    }
    tree["zero_d"] = np.asarray(2.5, np.float32)
    tree["zeros"] = np.zeros((4, 8), np.float32)  # chunks equal to the fill value are still written
    tree["empty"] = np.zeros((0, 4), np.float32)
    tree["nested"] = {"list": [np.arange(3, dtype=np.int32), np.ones(2, np.float32)]}
    return tree


def assert_same(actual: dict, expected: dict) -> None:
    flat_actual, flat_expected = suture.flatten(actual), suture.flatten(expected)
    assert sorted(flat_actual) == sorted(flat_expected)
    for path, value in flat_expected.items():
        got = np.asarray(flat_actual[path])
        assert got.dtype == np.asarray(value).dtype, path
        np.testing.assert_array_equal(got, np.asarray(value), err_msg=path)


def stored_codecs(folder: Path, leaf: str) -> list[str]:
    """The zarr3 codec names of one leaf of an Orbax checkpoint, as TensorStore reads them."""
    array = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "ocdbt", "base": f"file://{folder}", "path": leaf},
        }
    ).result()
    return [codec["name"] for codec in array.spec().to_json()["metadata"]["codecs"]]


def test_every_compression_is_read_by_stock_orbax_and_costs_what_it_says(
    tmp_path: Path,
) -> None:
    """compression="auto" (the default), "zstd" and "none": every dtype round-trips through
    stock Orbax (v0 and v1) and suture; "none" stores the arrays' bytes (and a crc32c each);
    "auto" stores bfloat16 weights bit-shuffled and LZ4'd, smaller than zstd, and 1-byte
    types as zstd."""
    # at a trained model's scale (values near 1 spread over two exponents and shuffle worse)
    weights = (np.random.default_rng(1).standard_normal((256, 512)) * 0.02).astype(
        ml_dtypes.bfloat16
    )
    codes = np.random.default_rng(2).standard_normal((256, 512)).astype(ml_dtypes.float8_e4m3fn)
    tree = {**every_dtype_tree(), "weights": weights, "codes": codes}
    for compression in ("auto", "zstd", "none"):
        suture.save(tree, tmp_path / compression, progress=False, compression=compression)
        assert_same(ocp.PyTreeCheckpointer().restore(tmp_path / compression), tree)
        assert_same(ocp_v1.load(tmp_path / compression), tree)
        assert_same(suture.load(tmp_path / compression), tree)
    suture.save(tree, tmp_path / "default", progress=False)

    def data_bytes(folder: Path) -> int:
        return sum(p.stat().st_size for p in (folder / "d").iterdir())

    array_bytes = sum(np.asarray(value).nbytes for value in jax.tree.leaves(tree))
    assert array_bytes <= data_bytes(tmp_path / "none") <= array_bytes * 1.05 + 65536
    assert data_bytes(tmp_path / "zstd") < 0.9 * data_bytes(tmp_path / "none")
    # weights alone, large enough that their bytes, not the database's own records (whose
    # size varies from one save to the next by a few KiB), make the difference
    large = (np.random.default_rng(3).standard_normal((1024, 1024)) * 0.02).astype(
        ml_dtypes.bfloat16
    )
    for compression in ("auto", "zstd"):
        suture.save(
            {"w": large}, tmp_path / f"w-{compression}", progress=False, compression=compression
        )
    assert data_bytes(tmp_path / "w-auto") < 0.98 * data_bytes(tmp_path / "w-zstd")
    assert stored_codecs(tmp_path / "auto", "weights") == ["bytes", "blosc", "crc32c"]
    assert stored_codecs(tmp_path / "default", "weights") == ["bytes", "blosc", "crc32c"]
    assert stored_codecs(tmp_path / "auto", "codes") == ["bytes", "zstd"]
    assert stored_codecs(tmp_path / "auto", "int8") == ["bytes", "zstd"]
    assert stored_codecs(tmp_path / "zstd", "weights") == ["bytes", "zstd"]
    assert stored_codecs(tmp_path / "none", "weights") == ["bytes", "crc32c"]


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"compression": "gzip"}, "Unknown compression 'gzip': use one of auto, zstd, none"),
        ({"compression": "none", "format": "safetensors"}, "applies to Orbax output only"),
    ],
)
def test_a_compression_that_cannot_be_is_refused(tmp_path: Path, keywords, message) -> None:
    with pytest.raises(suture.SurgeryError, match=message):
        suture.save({"w": np.ones(2)}, tmp_path / "out", progress=False, **keywords)
    assert not (tmp_path / "out").exists()


def test_orbax_round_trip_read_by_stock_orbax_v0_v1_and_suture(tmp_path: Path) -> None:
    tree = {**every_dtype_tree(), "name": "model", "count": 3, "rate": 0.5, "nothing": None}
    suture.save(tree, tmp_path / "out", progress=False)
    arrays = {
        key: value for key, value in tree.items() if key not in ("name", "count", "rate", "nothing")
    }
    v0 = ocp.PyTreeCheckpointer().restore(tmp_path / "out")
    assert_same({k: v0[k] for k in arrays}, arrays)
    assert v0["name"] == "model" and v0["count"] == 3 and v0["rate"] == 0.5
    standard = ocp.StandardCheckpointer().restore(tmp_path / "out")
    np.testing.assert_array_equal(standard["float32"], tree["float32"])
    v1 = ocp_v1.load(tmp_path / "out")
    assert_same({k: v1[k] for k in arrays}, arrays)
    ours = suture.load(tmp_path / "out")
    assert_same({k: ours[k] for k in arrays}, arrays)
    assert ours["name"] == "model" and ours["count"] == 3 and ours["nothing"] is None
    assert isinstance(v0["nested"]["list"], list)


def test_orbax_metadata_and_custom_metadata(tmp_path: Path) -> None:
    suture.save(
        {"w": np.ones((4, 4), np.float32)},
        tmp_path / "out",
        metadata={"source": "suture"},
        progress=False,
    )
    assert suture.open(tmp_path / "out").custom_metadata == {"source": "suture"}
    metadata = ocp_v1.metadata(tmp_path / "out").metadata
    assert metadata["w"].shape == (4, 4)


def test_safetensors_round_trip_read_by_the_safetensors_library(tmp_path: Path) -> None:
    tree = {k: v for k, v in every_dtype_tree().items()}
    suture.save(
        tree,
        tmp_path / "model.safetensors",
        format="safetensors",
        metadata={"format": "np"},
        progress=False,
    )
    loaded = load_file(tmp_path / "model.safetensors")
    expected = {path.replace("/", "."): value for path, value in suture.flatten(tree).items()}
    assert sorted(loaded) == sorted(expected)
    for name, value in expected.items():
        assert loaded[name].dtype == np.asarray(value).dtype, name
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", framework="np") as opened:
        assert opened.metadata() == {"format": "np"}


def test_safetensors_shards_with_an_index_like_hugging_face(tmp_path: Path) -> None:
    tree = {
        "model": {"layers": {str(i): {"w": np.full((256, 256), i, np.float32)} for i in range(5)}}
    }
    suture.save(tree, tmp_path / "hf", format="safetensors", max_shard_size=600_000, progress=False)
    files = sorted(p.name for p in (tmp_path / "hf").iterdir())
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)] + [
        "model.safetensors.index.json"
    ]
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 5 * 256 * 256 * 4
    assert index["weight_map"]["model.layers.0.w"] == "model-00001-of-00003.safetensors"
    assert index["weight_map"]["model.layers.4.w"] == "model-00003-of-00003.safetensors"
    for name, filename in index["weight_map"].items():
        np.testing.assert_array_equal(
            load_file(tmp_path / "hf" / filename)[name],
            np.full((256, 256), int(name.split(".")[2]), np.float32),
        )


def test_one_shard_is_a_plain_model_safetensors(tmp_path: Path) -> None:
    suture.save(
        {"w": np.ones(4, np.float32)},
        tmp_path / "hf",
        format="safetensors",
        max_shard_size="1GiB",
        progress=False,
    )
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["model.safetensors"]


def test_streaming_surgery_result_and_stacked_chunks(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    layers = {
        f"layer{i}": {"kernel": rng.standard_normal((256, 256), dtype=np.float32)} for i in range(8)
    }
    state = {"params": layers, "opt_state": {"mu": {f"layer{i}": np.ones(3) for i in range(8)}}}
    save_standard(tmp_path / "source", state)
    surgery = [
        rules.drop("opt_state"),
        rules.stack(r"params/layer(?P<i>\d+)", into="params/layers"),
        rules.cast("params", "bfloat16"),
    ]
    with count_bytes_read() as reading:
        suture.save(
            suture.transform(surgery, tmp_path / "source"), tmp_path / "out", progress=False
        )
    assert reading.bytes < 8 * 256 * 256 * 4 * 1.1  # each source kernel read once, opt_state never
    restored = ocp.StandardCheckpointer().restore(tmp_path / "out")
    expected = np.stack([layers[f"layer{i}"]["kernel"] for i in range(8)]).astype(
        ml_dtypes.bfloat16
    )
    np.testing.assert_array_equal(restored["params"]["layers"]["kernel"], expected)
    out = suture.open(tmp_path / "out")["params/layers/kernel"]
    assert out.node.store().chunk_layout.read_chunk.shape == (1, 256, 256)
    out[0].read()  # the index
    with count_bytes_read() as one_layer:
        out[5].read()
    assert one_layer.bytes < 256 * 256 * 2 * 1.2


def test_a_leaf_larger_than_the_budget_is_written_in_blocks(tmp_path: Path, monkeypatch) -> None:
    from suture._exec import runner

    seen_blocks = []
    original = runner.run_blocks

    def recording(blocks, max_memory, on_progress=None, **options):
        seen_blocks.extend(blocks)
        return original(blocks, max_memory, on_progress, **options)

    monkeypatch.setattr("suture._save.writer.run_blocks", recording)
    big = np.random.default_rng(0).standard_normal((64, 1024, 256), dtype=np.float32)  # 64 MiB
    result = suture.save(
        {"big": big}, tmp_path / "out", max_memory="8MiB", chunk_bytes="1MiB", progress=False
    )
    assert result.peak_in_flight <= 8 << 20
    assert (
        len(seen_blocks) > 16
        and max(block.nbytes for block in seen_blocks) <= 8 * 2**20 // 12 + 1024 * 256 * 4
    )
    np.testing.assert_array_equal(suture.open(tmp_path / "out")["big"].read(), big)


def test_chunks_divide_the_array_where_they_can(tmp_path: Path) -> None:
    # 96 rows of 40 bytes under 1400-byte chunks: 3 chunks of 32 rows, not 35 + 35 + 26 (a
    # last chunk the array's end cuts short is padded in the file and copied by TensorStore)
    values = np.arange(960, dtype=np.float32).reshape(96, 10)
    suture.save(
        {"w": values, "odd": values[:95]}, tmp_path / "out", chunk_bytes=1400, progress=False
    )
    out = suture.open(tmp_path / "out")
    assert out["w"].node.store().chunk_layout.read_chunk.shape == (32, 10)
    assert out["odd"].node.store().chunk_layout.read_chunk.shape == (19, 10)  # 95 = 5 x 19
    restored = ocp.StandardCheckpointer().restore(tmp_path / "out")
    np.testing.assert_array_equal(restored["w"], values)
    np.testing.assert_array_equal(restored["odd"], values[:95])


def test_existing_destination_needs_overwrite(tmp_path: Path) -> None:
    suture.save({"a": np.zeros(2)}, tmp_path / "out", progress=False)
    with pytest.raises(suture.SurgeryError, match=r"already exists\. Pass overwrite=True"):
        suture.save({"a": np.ones(2)}, tmp_path / "out", progress=False)
    suture.save({"a": np.ones(2)}, tmp_path / "out", overwrite=True, progress=False)
    np.testing.assert_array_equal(suture.open(tmp_path / "out")["a"].read(), np.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_destination_that_is_a_source_is_refused(tmp_path: Path) -> None:
    save_standard(tmp_path / "ckpt", {"a": np.zeros(2)})
    with pytest.raises(suture.SurgeryError, match=r"holds 'a', a source this save reads"):
        suture.save(
            suture.transform([rules.rename("a", "b")], tmp_path / "ckpt"),
            tmp_path / "ckpt",
            overwrite=True,
            progress=False,
        )
    np.testing.assert_array_equal(suture.open(tmp_path / "ckpt")["a"].read(), np.zeros(2))


def test_failure_midway_leaves_nothing_and_the_source_intact(tmp_path: Path) -> None:
    save_standard(tmp_path / "source", {"a": np.arange(8.0), "b": np.arange(4.0)})
    before = sorted(
        (p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in (tmp_path / "source").rglob("*")
    )

    def explode(x):
        raise RuntimeError("boom")

    lazy = suture.transform(
        [rules.map_values("b", lambda v: suture.map(explode, v, shape=v.shape, dtype=v.dtype))],
        tmp_path / "source",
    )
    with pytest.raises(RuntimeError, match="boom"):
        suture.save(lazy, tmp_path / "out", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source"]
    after = sorted(
        (p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in (tmp_path / "source").rglob("*")
    )
    assert after == before


WRITER = """
import sys, numpy as np, suture
def slow(x):
    import time; time.sleep(0.2); return x
tree = {f"w{i}": suture.map(slow, suture.LazyArray.from_array(np.ones((256, 256), np.float32)), shape=(256, 256), dtype=np.float32) for i in range(200)}
print("writing", flush=True)
suture.save(tree, sys.argv[1], format=sys.argv[2], max_memory="2MiB", progress=False)
print("done", flush=True)
"""


@pytest.mark.parametrize("format", ["orbax", "safetensors"])
def test_sigkill_midway_leaves_no_result_and_a_rerun_succeeds(tmp_path: Path, format: str) -> None:
    save_standard(tmp_path / "source", {"a": np.arange(8.0)})
    destination = tmp_path / ("out" if format == "orbax" else "out.safetensors")
    with subprocess.Popen(  # closes the pipe on the way out (no unclosed-file warning)
        [sys.executable, "-c", WRITER, str(destination), format], stdout=subprocess.PIPE, text=True
    ) as process:
        assert process.stdout.readline().strip() == "writing"
        time.sleep(1.5)
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert not destination.exists()
    assert any(
        ".orbax-checkpoint-tmp-suture-" in p.name for p in tmp_path.iterdir()
    )  # the debris is marked
    np.testing.assert_array_equal(suture.open(tmp_path / "source")["a"].read(), np.arange(8.0))
    with pytest.warns(suture.StaleLockWarning, match="the unfinished output it left"):
        suture.save({"a": np.ones(3)}, destination, format=format, progress=False)
    assert destination.exists()
    assert not any(".orbax-checkpoint-tmp" in p.name for p in tmp_path.iterdir())  # debris gone


def test_a_second_writer_gets_a_clear_error(tmp_path: Path) -> None:
    lock = tmp_path / ".out.suture-lock"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        lock.write_text(str(holder.pid))
        with pytest.raises(
            suture.SurgeryError, match=rf"Another process \(pid {holder.pid}\) is writing"
        ):
            suture.save({"a": np.zeros(2)}, tmp_path / "out", progress=False)
    finally:
        holder.kill()
        holder.wait()


def test_asynchronous_save_returns_a_handle(tmp_path: Path) -> None:
    tree = {"w": jax.numpy.arange(1000.0)}
    handle = suture.save(tree, tmp_path / "out", asynchronous=True, progress=False)
    result = handle.wait()
    assert handle.done() and result.path == tmp_path / "out" and result.leaves == 1
    np.testing.assert_array_equal(
        suture.open(tmp_path / "out")["w"].read(), np.arange(1000.0, dtype=np.float32)
    )
    failing = suture.save(
        {"w": np.ones(2)}, tmp_path / "out", asynchronous=False, overwrite=True, progress=False
    )
    assert failing.bytes_written == 16


def test_asynchronous_errors_surface_in_wait(tmp_path: Path) -> None:
    handle = suture.save({"s": object()}, tmp_path / "out", asynchronous=True, progress=False)
    with pytest.raises(
        suture.SurgeryError, match=r"Leaf 's' is a object, which an Orbax checkpoint cannot hold"
    ):
        handle.wait()
    assert not (tmp_path / "out").exists()


def test_safetensors_refuses_non_arrays_and_bad_dtypes(tmp_path: Path) -> None:
    with pytest.raises(
        suture.SurgeryError,
        match=r"safetensors holds only arrays, but 1 leaves are not: 'step'.*rules.drop",
    ):
        suture.save(
            {"w": np.ones(2), "step": 3},
            tmp_path / "m.safetensors",
            format="safetensors",
            progress=False,
        )
    with pytest.raises(
        suture.SurgeryError, match=r"Tensor 'w' has dtype int4, which safetensors cannot store"
    ):
        suture.save(
            {"w": np.ones(2, ml_dtypes.int4)},
            tmp_path / "m.safetensors",
            format="safetensors",
            progress=False,
        )
    with pytest.raises(suture.SurgeryError, match=r"Unknown output format 'npz'"):
        suture.save({"w": np.ones(2)}, tmp_path / "m", format="npz")
    assert not any(tmp_path.iterdir())


def test_progress_bar_shows_on_request(tmp_path: Path, capsys) -> None:
    suture.save({"w": np.ones((64, 64))}, tmp_path / "out", progress=True)
    assert "Writing out" in capsys.readouterr().err
    suture.save(
        {"w": np.ones((64, 64))}, tmp_path / "quiet", progress=None
    )  # stderr is not a terminal here
    assert capsys.readouterr().err == ""


def test_disk_full_gives_a_surgery_error_and_cleans_up(small_tmpfs: Path) -> None:
    with pytest.raises(suture.SurgeryError, match="No space left on the device"):
        suture.save(
            {"w": np.ones(4 << 20, np.uint8)},
            small_tmpfs / "model.safetensors",
            format="safetensors",
            progress=False,
        )
    assert list(small_tmpfs.iterdir()) == []


def test_chunks_past_blosc_s_limit_and_complex_numbers_get_fitting_codecs() -> None:
    """blosc encodes at most about 2 GiB at once: a larger chunk is zstd's; a complex number
    is bit-shuffled as its two parts."""
    names = [c["name"] for c in chunk_codecs("auto", np.dtype("bfloat16"), 4 << 30)]
    assert names == ["bytes", "zstd"]
    fits = chunk_codecs("auto", np.dtype("bfloat16"), BLOSC_LARGEST_CHUNK)
    assert [c["name"] for c in fits] == ["bytes", "blosc", "crc32c"]
    assert chunk_codecs("auto", np.dtype("complex64"))[1]["configuration"]["typesize"] == 4
