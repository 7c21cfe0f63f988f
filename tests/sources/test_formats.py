"""safetensors, Flax msgpack, npz and PyTorch files written by their own libraries, read by suture."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import suture
from suture._iostats import count_bytes_read

SAFETENSORS_DTYPES = [
    np.float64,
    np.float32,
    np.float16,
    ml_dtypes.bfloat16,
    np.int64,
    np.int32,
    np.int16,
    np.int8,
    np.uint64,
    np.uint32,
    np.uint16,
    np.uint8,
    np.bool_,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e5m2,
]


def sample(dtype, shape=(3, 4), seed=0):
    rng = np.random.default_rng(seed)
    if dtype is np.bool_:
        return rng.random(shape) > 0.5
    return (rng.standard_normal(shape) * 4).astype(dtype)


def test_safetensors_every_dtype_value_exact(tmp_path: Path) -> None:
    tensors = {f"model.{np.dtype(d).name}.weight": sample(d) for d in SAFETENSORS_DTYPES}
    tensors["model.scalar"] = np.asarray(1.5, np.float32)
    tensors["model.empty"] = np.zeros((0, 3), np.float32)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt", "note": "x"})
    ckpt = suture.open(tmp_path / "model.safetensors")
    assert ckpt.format == "safetensors" and ckpt.custom_metadata == {"format": "pt", "note": "x"}
    for name, value in tensors.items():
        leaf = ckpt[name.replace(".", "/")]
        assert leaf.dtype == value.dtype and leaf.shape == value.shape, name
        np.testing.assert_array_equal(leaf.read(), value, err_msg=name)
    np.testing.assert_array_equal(
        ckpt["model/float32/weight"][1:, ::-2].read(), tensors["model.float32.weight"][1:, ::-2]
    )


def test_safetensors_separator_option(tmp_path: Path) -> None:
    save_file({"a.b": np.ones(2, np.float32)}, tmp_path / "m.safetensors")
    assert suture.open(tmp_path / "m.safetensors", separator="/").paths() == ["a.b"]
    assert suture.open(tmp_path / "m.safetensors").paths() == ["a/b"]


def test_safetensors_names_that_clash_as_a_tree_explain_the_separator(tmp_path: Path) -> None:
    save_file(
        {"a.b": np.ones(2, np.float32), "a.b.c": np.ones(2, np.float32)}, tmp_path / "m.safetensors"
    )
    with pytest.raises(
        suture.SurgeryError, match=r"do not form a tree with separator '\.'.*separator='/'"
    ):
        suture.open(tmp_path / "m.safetensors")


def test_slicing_a_row_of_a_1gib_tensor_reads_about_one_row(tmp_path: Path) -> None:
    path = tmp_path / "big.safetensors"
    rows, width = 16384, 16384  # float32: 1 GiB
    header = json.dumps(
        {"big": {"dtype": "F32", "shape": [rows, width], "data_offsets": [0, rows * width * 4]}}
    ).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as stream:
        stream.write(struct.pack("<Q", len(header)) + header)
        stream.truncate(8 + len(header) + rows * width * 4)  # sparse: the disk holds no zeros
        stream.seek(8 + len(header) + 123 * width * 4)
        stream.write(np.arange(width, dtype=np.float32).tobytes())
    from safetensors import safe_open

    with safe_open(path, framework="np") as opened:  # the file is valid for the library too
        assert opened.get_slice("big").get_shape() == [rows, width]
    big = suture.open(path)["big"]
    with count_bytes_read() as counter:
        row = big[123].read()
    np.testing.assert_array_equal(row, np.arange(width, dtype=np.float32))
    assert counter.bytes == width * 4


def _hostile(tmp_path: Path, header: bytes, data: bytes = b"", length: int | None = None) -> Path:
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    return path


@pytest.mark.parametrize(
    ("header", "data", "length", "message"),
    [
        (b"{}", b"", 10**6, r"claims a 1000000-byte header"),
        (b"{nope", b"", None, r"header of .* is not valid JSON"),
        (b"[1]", b"", None, r"header of .* is not a JSON object"),
        (
            b'{"w":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}}',
            b"\0" * 4,
            None,
            r"Tensor 'w' .* has dtype 'F99'",
        ),
        (
            b'{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}',
            b"\0" * 4,
            None,
            r"has shape \[-1\]",
        ),
        (
            b'{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}',
            b"\0" * 4,
            None,
            r"spans 4 bytes, but shape \(2,\) of float32 needs 8",
        ),
        (
            b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,400]}}',
            b"\0" * 4,
            None,
            r"data_offsets \[0, 400\]; expected \[begin, end\] within the 4 data bytes",
        ),
        (
            b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
            b"\0" * 12,
            None,
            r"Tensors 'a' and 'b' overlap",
        ),
        (b'{"__metadata__":{"a":1}}', b"", None, r"__metadata__ of .* must map strings to strings"),
    ],
)
def test_hostile_safetensors_headers_are_clear_errors(
    tmp_path: Path, header, data, length, message
) -> None:
    with pytest.raises(suture.CorruptCheckpointError, match=message):
        suture.open(_hostile(tmp_path, header, data, length), format="safetensors")


def test_truncated_safetensors_data_is_an_error_on_read(tmp_path: Path) -> None:
    save_file({"w": np.ones((64, 64), np.float32)}, tmp_path / "m.safetensors")
    ckpt = suture.open(tmp_path / "m.safetensors")
    with open(tmp_path / "m.safetensors", "r+b") as stream:
        stream.truncate(200)
    with pytest.raises(
        suture.CorruptCheckpointError, match=r"changed since it was opened .*tensor 'w' would mix"
    ):
        ckpt["w"].read()


def hf_folder(folder: Path, shards: int = 3) -> dict:
    folder.mkdir()
    rng = np.random.default_rng(0)
    tensors, weight_map = {}, {}
    for shard in range(1, shards + 1):
        part = {
            f"model.layers.{shard}.mlp.up_proj.weight": rng.standard_normal((32, 16)).astype(
                ml_dtypes.bfloat16
            ),
            f"model.layers.{shard}.input_layernorm.weight": rng.standard_normal(16).astype(
                np.float32
            ),
        }
        filename = f"model-{shard:05d}-of-{shards:05d}.safetensors"
        save_file(part, folder / filename, metadata={"format": "pt"})
        tensors.update(part)
        weight_map.update({name: filename for name in part})
    total = sum(value.nbytes for value in tensors.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    (folder / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 16}))
    return tensors


def test_hugging_face_sharded_folder_and_index(tmp_path: Path) -> None:
    tensors = hf_folder(tmp_path / "hf")
    for source in (tmp_path / "hf", tmp_path / "hf" / "model.safetensors.index.json"):
        ckpt = suture.open(source)
        assert sorted(ckpt.paths()) == sorted(name.replace(".", "/") for name in tensors)
        assert (
            ckpt.layout["weight_map"]["model.layers.2.mlp.up_proj.weight"]
            == "model-00002-of-00003.safetensors"
        )
        np.testing.assert_array_equal(
            ckpt["model/layers/3/mlp/up_proj/weight"].read(),
            tensors["model.layers.3.mlp.up_proj.weight"],
        )


def test_index_naming_a_missing_shard_is_an_error(tmp_path: Path) -> None:
    hf_folder(tmp_path / "hf")
    (tmp_path / "hf" / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(
        suture.CorruptCheckpointError,
        match=r"lists shard 'model-00002-of-00003.safetensors', which is not in",
    ):
        suture.open(tmp_path / "hf")


def test_flax_msgpack_files(tmp_path: Path) -> None:
    from flax import serialization

    state = {
        "params": {
            "Dense_0": {
                "kernel": sample(np.float32, (4, 3)),
                "bias": sample(ml_dtypes.bfloat16, (3,)),
            }
        },
        "opt": [sample(np.int8, (2,)), {"count": np.int32(5)}],
        "step": 12,
        "name": "cnn",
    }
    (tmp_path / "state.msgpack").write_bytes(serialization.to_bytes(state))
    ckpt = suture.open(tmp_path / "state.msgpack")
    assert ckpt.format == "msgpack"
    reference = serialization.msgpack_restore((tmp_path / "state.msgpack").read_bytes())
    for path, value in suture.flatten(reference).items():
        leaf = ckpt[path]
        got = leaf.read() if isinstance(leaf, suture.LazyArray) else leaf
        np.testing.assert_array_equal(np.asarray(got), np.asarray(value), err_msg=path)
    assert ckpt["step"] == 12 and ckpt["name"] == "cnn"
    assert ckpt["params/Dense_0/bias"].dtype == ml_dtypes.bfloat16


def test_flax_msgpack_chunked_arrays(tmp_path: Path, monkeypatch) -> None:
    from flax import serialization

    monkeypatch.setattr(serialization, "MAX_CHUNK_SIZE", 64)  # force flax to split this array
    big = np.arange(100, dtype=np.float32).reshape(10, 10)
    (tmp_path / "chunked.msgpack").write_bytes(serialization.msgpack_serialize({"big": big}))
    np.testing.assert_array_equal(suture.open(tmp_path / "chunked.msgpack")["big"].read(), big)


def test_damaged_msgpack_is_a_clear_error(tmp_path: Path) -> None:
    from flax import serialization

    raw = serialization.to_bytes({"w": np.ones(100, np.float32)})
    (tmp_path / "bad.msgpack").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(
        suture.CorruptCheckpointError, match="is not a valid Flax msgpack checkpoint"
    ):
        suture.open(tmp_path / "bad.msgpack")


@pytest.mark.parametrize("compressed", [False, True])
def test_npz_members_value_exact_and_lazy(tmp_path: Path, compressed: bool) -> None:
    arrays = {
        "params/w": sample(np.float32, (64, 32)),
        "params/b": sample(np.float16, (32,)),
        "step": np.asarray(3),
    }
    (np.savez_compressed if compressed else np.savez)(tmp_path / "a.npz", **arrays)
    with count_bytes_read() as opening:
        ckpt = suture.open(tmp_path / "a.npz")
    assert opening.bytes == 0 and ckpt.format == "npz"
    for name, value in arrays.items():
        np.testing.assert_array_equal(ckpt[name].read(), value, err_msg=name)
    with count_bytes_read() as one_row:
        np.testing.assert_array_equal(ckpt["params/w"][5].read(), arrays["params/w"][5])
    if not compressed:
        assert one_row.bytes == 32 * 4


def test_npz_with_pickled_objects_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "objects.npz", bad=np.array([{"a": 1}], dtype=object))
    with pytest.raises(
        suture.CorruptCheckpointError, match=r"Member 'bad' .* holds Python objects"
    ):
        suture.open(tmp_path / "objects.npz")


def test_torch_state_dict_needs_allow_pickle(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    state = {
        "layer.0.weight": torch.randn(4, 3),
        "layer.0.bias": torch.randn(3).to(torch.bfloat16),
        "embed.weight": torch.randint(-5, 5, (6, 2), dtype=torch.int8),
        "scale": torch.tensor(2.0, dtype=torch.float16),
    }
    torch.save(state, tmp_path / "model.pt")
    with pytest.raises(
        suture.SurgeryError,
        match=r"is a PyTorch pickle; unpickling can run code.*allow_pickle=True.*convert it to safetensors",
    ):
        suture.open(tmp_path / "model.pt")
    ckpt = suture.open(tmp_path / "model.pt", allow_pickle=True)
    assert ckpt.format == "torch"
    for name, tensor in state.items():
        leaf = ckpt[name.replace(".", "/")]
        expected = (
            tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
            if tensor.dtype == torch.bfloat16
            else tensor.numpy()
        )
        assert leaf.dtype == expected.dtype, name
        np.testing.assert_array_equal(leaf.read(), expected, err_msg=name)


def test_torch_legacy_pickle_format_is_detected(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    torch.save({"w": torch.ones(2)}, tmp_path / "old.bin", _use_new_zipfile_serialization=False)
    with pytest.raises(suture.SurgeryError, match="is a PyTorch pickle"):
        suture.open(tmp_path / "old.bin")


def test_format_detection_by_content_not_suffix(tmp_path: Path) -> None:
    save_file({"w": np.ones(2, np.float32)}, tmp_path / "weights.bin")
    assert suture.open(tmp_path / "weights.bin").format == "safetensors"
    np.savez(tmp_path / "arrays.data", w=np.ones(2))
    assert suture.open(tmp_path / "arrays.data.npz").format == "npz"
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(
        suture.NotACheckpointError,
        match=r"zip archive holding readme.txt, neither an .npz nor a PyTorch file",
    ):
        suture.open(tmp_path / "other.zip")
    with pytest.raises(suture.SurgeryError, match=r"Unknown format 'onnx'"):
        suture.open(tmp_path / "weights.bin", format="onnx")
