"""The one-lookup-a-byte decode (suture._quant.bytetable) of INT4 and NVFP4 blocks whose
scales take few distinct values: bit for bit compressed-tensors' decompressor, into plain
and transposed results, and the multiply-then-cast route wherever the table would not do."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the references are torch code (the dev extra)")
pytest.importorskip("compressed_tensors", reason="the dev extra")
# ruff: noqa: E402
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.lifecycle.forward import dequantize
from safetensors.torch import save_file

import suture
from suture import SutureWarning
from suture._errors import CorruptCheckpointError
from suture._quant import bytetable

INT4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
NVFP4 = {
    "num_bits": 4,
    "type": "float",
    "symmetric": True,
    "strategy": "tensor_group",
    "group_size": 16,
}
MODULE = "model.layers.0.mlp.experts"
PATH = "model/layers/0/mlp/experts/weight"
# bfloat16 scales: ordinary ones, the smallest normal, subnormal ones, huge ones, negative ones
SCALES = [1e-3, 2.5e-4, 0.37, 1.0, 3.0, 2.0**-126, 1e-39, 9.2e-41, 1e30, -0.75, -1e-3, 7.0]


def config(args, fmt):
    groups = {"group_0": {"targets": ["Linear"], "weights": args}}
    return {"quant_method": "compressed-tensors", "format": fmt, "config_groups": groups}


def folder_of(tmp_path: Path, state: dict, quantization: dict) -> Path:
    import json

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "llama", "quantization_config": quantization})
    )
    tensors = {f"{MODULE}.{key}": value.contiguous() for key, value in state.items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def int4_state(shape, scales, seed=0):
    rng = np.random.default_rng(seed)
    values = rng.integers(-8, 8, shape).astype(np.int8)
    values.reshape(-1)[:16] = np.arange(-8, 8)  # every code
    picked = rng.choice(np.asarray(scales, np.float32), (*shape[:-1], shape[-1] // 32))
    return {
        "weight_packed": pack_to_int32(torch.from_numpy(values), 4),
        "weight_scale": torch.from_numpy(picked).to(torch.bfloat16),
        "weight_shape": torch.tensor(shape),
    }


def int4_reference(state) -> torch.Tensor:
    """compressed-tensors' decompressor in float32, per expert (float32 scales: the contract)."""
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**INT4))
    experts = []
    for expert in range(state["weight_packed"].shape[0]):
        one = {
            "weight_packed": state["weight_packed"][expert],
            "weight_scale": state["weight_scale"][expert].to(torch.float32),
            "weight_shape": state["weight_shape"][1:],
        }
        experts.append(PackedQuantizationCompressor.decompress(one, scheme)["weight"])
    return torch.stack(experts)


def bits(array) -> np.ndarray:
    if isinstance(array, torch.Tensor):
        width = {2: torch.int16, 4: torch.int32}[array.element_size()]
        array = array.view(width).numpy()
    return array.view(np.uint16 if array.dtype.itemsize == 2 else np.uint32)


@pytest.fixture
def gathers(monkeypatch):
    """How many blocks went through the table (the real function, counted)."""
    calls = []
    real = bytetable.gather_into

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(bytetable, "gather_into", counted)
    return calls


@pytest.fixture(scope="module")
def int4_folder(tmp_path_factory):
    state = int4_state((3, 48, 1024), SCALES)
    folder = folder_of(tmp_path_factory.mktemp("int4"), state, config(INT4, "pack-quantized"))
    return folder, int4_reference(state)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_int4_by_table_equals_compressed_tensors(int4_folder, gathers, dtype) -> None:
    folder, expected = int4_folder
    weight = suture.open(folder, dequantize=True, dequantize_dtype=dtype)[PATH]
    with np.errstate(over="ignore"):
        wanted = expected.to(getattr(torch, dtype))
    if dtype == "float16":  # 1e30 overflows float16: said, as the other route says it
        with pytest.warns(SutureWarning, match="exceed the largest float16"):
            ours = weight.read()
    else:
        ours = weight.read()
        assert gathers  # the table route was taken
    np.testing.assert_array_equal(bits(ours), bits(wanted))


def test_int4_by_table_into_transposed_experts(int4_folder, gathers) -> None:
    """Into each expert's transposed place (as MaxText's layout takes it), a tile at a time."""
    folder, expected = int4_folder
    weight = suture.open(folder, dequantize=True, dequantize_dtype="bfloat16")[PATH]
    out = np.full((3, 1024, 48), 7, ml_dtypes.bfloat16).transpose(0, 2, 1)
    weight.node.read_into((range(3), range(48), range(1024)), out)
    assert len(gathers) == 3
    np.testing.assert_array_equal(bits(np.ascontiguousarray(out)), bits(expected.bfloat16()))
    part = np.empty((1024, 20), ml_dtypes.bfloat16).T  # one expert's rows, a slice of them
    weight.node.read_into((range(1, 2), range(5, 25), range(1024)), part[None])
    np.testing.assert_array_equal(bits(part), bits(expected[1, 5:25].bfloat16()))


def test_many_distinct_scales_take_the_multiply_route_with_equal_bits(tmp_path, gathers) -> None:
    scales = np.random.default_rng(3).uniform(1e-3, 2.0, 4000)
    state = int4_state((1, 64, 512), scales)
    folder = folder_of(tmp_path, state, config(INT4, "pack-quantized"))
    ours = suture.open(folder, dequantize=True, dequantize_dtype="bfloat16")[PATH].read()
    assert not gathers
    np.testing.assert_array_equal(bits(ours), bits(int4_reference(state).bfloat16()))


def test_a_non_finite_scale_among_few_is_refused_naming_its_group(tmp_path, gathers) -> None:
    state = int4_state((2, 32, 1024), SCALES[:4])
    state["weight_scale"][1, 17, 9] = float("inf")
    folder = folder_of(tmp_path, state, config(INT4, "pack-quantized"))
    weight = suture.open(folder, dequantize=True, dequantize_dtype="bfloat16")[PATH]
    with pytest.raises(CorruptCheckpointError, match=r"group \[1, 17, 9\].*stored inf"):
        weight.read()
    assert not gathers


def test_nvfp4_by_table_equals_compressed_tensors(tmp_path, gathers) -> None:
    rng = np.random.default_rng(5)
    rows, cols = 64, 2048
    packed = rng.integers(0, 256, (rows, cols // 2)).astype(np.uint8)
    packed.reshape(-1)[:256] = np.arange(256)  # every byte
    codes = rng.integers(0, 0x7F, (rows, cols // 16)).astype(np.uint8)  # finite E4M3 >= 0
    codes.reshape(-1)[:0x7F] = np.arange(0x7F)
    state = {
        "weight_packed": torch.from_numpy(packed),
        "weight_scale": torch.from_numpy(codes).view(torch.float8_e4m3fn),
        "weight_global_scale": torch.tensor([448 * 6 / 3.7], dtype=torch.float32),
    }
    folder = folder_of(tmp_path, state, config(NVFP4, "nvfp4-pack-quantized"))
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**NVFP4))
    float32 = dequantize(
        x_q=unpack_fp4_from_uint8(state["weight_packed"], rows, cols, dtype=torch.float32),
        scale=state["weight_scale"].to(torch.float32),
        args=scheme.weights,
        global_scale=state["weight_global_scale"],
        dtype=torch.float32,
    )
    opened = suture.open(folder, dequantize=True, dequantize_dtype="float32")
    np.testing.assert_array_equal(bits(opened[PATH].read()), bits(float32))
    assert gathers
    decompressed = NVFP4PackedCompressor.decompress(state, scheme)["weight"]  # bfloat16
    opened = suture.open(folder, dequantize=True, dequantize_dtype="bfloat16")
    np.testing.assert_array_equal(bits(opened[PATH].read()), bits(decompressed))
