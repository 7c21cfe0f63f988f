"""DeepSeek-V4's FP4 experts, compressed-tensors INT and NVFP4, ModelOpt NVFP4: read
dequantized, each bit for bit its reference's float32 value (bfloat16: that, rounded once).

References run here: transformers' ``Fp8Dequantize._dequantize_one`` and
``_dequantize_fp8_weight`` (the FP4 and FP8 formulas MaxText's ``deepseek_dequantize.py``
copies; the script itself too, when MaxText 0.2.5's source is on this machine),
compressed-tensors 0.20's ``PackedQuantizationCompressor`` and ``NVFP4PackedCompressor``
(their own packers write the tensors, their decompressors are the reference), and ModelOpt's
``NVFP4QTensor`` (its quantizer writes, its ``dequantize`` reads).
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the references are torch code (the dev extra)")
compressed_tensors = pytest.importorskip("compressed_tensors", reason="the dev extra")
# ruff: noqa: E402
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.lifecycle.forward import dequantize
from safetensors.torch import save_file
from transformers.integrations.finegrained_fp8 import Fp8Dequantize, _dequantize_fp8_weight

import suture
from suture import SutureWarning
from suture._lazy.graph import MemorySource
from suture._quant.e2m1 import E2M1, dequantize_e2m1
from suture._quant.grouped import E2M1Codec, GroupedDequantNode
from suture._quant.intpack import unpack_codes

V4_CONFIG = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128],
    "expert_dtype": "fp4",
}


def write_folder(folder: Path, tensors: dict, quantization=None, extra=None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "llama", "dtype": "bfloat16"}
    if quantization is not None:
        config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    for name, text in (extra or {}).items():
        (folder / name).write_text(json.dumps(text))
    tensors = {name: value.contiguous() for name, value in tensors.items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def bits(array) -> np.ndarray:
    """The bits of a float32 or bfloat16 array (torch or numpy), to compare -0.0 and NaN."""
    if isinstance(array, torch.Tensor):
        array = array.view(torch.int16 if array.dtype == torch.bfloat16 else torch.int32).numpy()
        return array.view(np.uint16 if array.dtype == np.int16 else np.uint32)
    return array.view(np.uint16 if array.dtype.itemsize == 2 else np.uint32)


def read(folder: Path, path: str, dtype="float32") -> np.ndarray:
    return suture.open(folder, dequantize=True, dequantize_dtype=dtype)[path].read()


def every_byte(rows: int, width: int, seed: int = 0) -> np.ndarray:
    """``(rows, width)`` bytes holding every value 0-255 (then random)."""
    values = np.random.default_rng(seed).integers(0, 256, rows * width).astype(np.uint8)
    count = min(256, values.size)
    values[:count] = np.arange(count)
    return values.reshape(rows, width)


def cli(*args: str):
    from typer.testing import CliRunner

    from suture.cli import app

    return CliRunner().invoke(app, list(args))


# --- DeepSeek-V4: FP4 experts and FP8 with UE8M0 `.scale` ----------------------------------


@pytest.fixture(scope="module")
def deepseek_v4(tmp_path_factory):
    """A DeepSeek-V4-shaped folder: FP4 experts as F4 (E8M0 scales) and as I8 (byte scales),
    an FP8 weight of ragged blocks with `.scale`, and a norm."""
    rng = np.random.default_rng(1)
    rows, cols = 9, 256  # 9 x 128 bytes: every byte value
    packed = torch.from_numpy(every_byte(rows, cols // 2))
    scale_bytes = rng.integers(100, 150, (rows, cols // 32)).astype(np.uint8)
    scale_bytes[0, :3] = [0, 1, 254]  # 2**-127 (a float32 subnormal), 2**-126, 2**127
    fp8 = torch.from_numpy(rng.integers(0, 256, (200, 300)).astype(np.uint8))
    fp8[fp8 & 0x7F == 0x7F] = 0  # no NaN codes: transformers and suture agree on them anyway
    tensors = {
        "layers.0.ffn.experts.0.w1.weight": packed.view(torch.float4_e2m1fn_x2),
        "layers.0.ffn.experts.0.w1.scale": torch.from_numpy(scale_bytes).view(torch.float8_e8m0fnu),
        "layers.0.ffn.experts.1.w2.weight": packed.clone().view(torch.int8),
        "layers.0.ffn.experts.1.w2.scale": torch.from_numpy(scale_bytes.copy()),
        "layers.0.attn.wq.weight": fp8.view(torch.float8_e4m3fn),
        "layers.0.attn.wq.scale": torch.from_numpy(
            rng.integers(110, 140, (2, 3)).astype(np.uint8)
        ).view(torch.float8_e8m0fnu),
        "layers.0.attn_norm.weight": torch.ones(8, dtype=torch.bfloat16),
    }
    folder = write_folder(tmp_path_factory.mktemp("v4") / "m", tensors, V4_CONFIG)
    return folder, tensors


def test_f4_header_counts_values_and_bytes_hold_two(deepseek_v4) -> None:
    folder, _ = deepseek_v4
    stored = suture.open(folder)
    assert stored["layers/0/ffn/experts/0/w1/weight"].shape == (9, 128)  # bytes, as stored
    assert stored["layers/0/ffn/experts/0/w1/weight"].dtype == np.uint8
    dequantized = suture.open(folder, dequantize=True)
    assert dequantized["layers/0/ffn/experts/0/w1/weight"].shape == (9, 256)
    assert "layers/0/ffn/experts/0/w1/scale" not in dequantized.paths()


@pytest.mark.parametrize(
    ("name", "output"), [("0.w1", torch.float32), ("1.w2", torch.float32), ("0.w1", torch.bfloat16)]
)
def test_fp4_experts_equal_transformers(deepseek_v4, name, output) -> None:
    folder, tensors = deepseek_v4
    weight = tensors[f"layers.0.ffn.experts.{name}.weight"]
    scale = tensors[f"layers.0.ffn.experts.{name}.scale"]
    expected = Fp8Dequantize(None)._dequantize_one(weight, scale, output_dtype=output)
    dtype = "float32" if output == torch.float32 else "bfloat16"
    with pytest.warns(SutureWarning, match=r"8 inf or NaN value\(s\) from finite codes"):
        ours = read(folder, f"layers/0/ffn/experts/{name.replace('.', '/')}/weight", dtype)
    np.testing.assert_array_equal(bits(ours), bits(expected))
    if output == torch.float32:
        assert ours[0, 2] == np.ldexp(np.float32(0.5), -127) != 0  # byte 1, scale byte 0: exact


def test_fp8_with_ue8m0_dot_scale_equals_transformers_ragged_blocks(deepseek_v4) -> None:
    folder, tensors = deepseek_v4
    weight, scale = tensors["layers.0.attn.wq.weight"], tensors["layers.0.attn.wq.scale"]
    expected = _dequantize_fp8_weight(weight, scale.to(torch.float32), [128, 128], torch.float32)
    np.testing.assert_array_equal(bits(read(folder, "layers/0/attn/wq/weight")), bits(expected))


def _maxtext_script():
    for root in (Path("/tmp/mt025/src"), *Path("/tmp/mtvenv/lib").glob("python3*/site-packages")):
        found = root / "maxtext/checkpoint_conversion/standalone_scripts/deepseek_dequantize.py"
        if found.is_file():
            spec = importlib.util.spec_from_file_location("deepseek_dequantize", found)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    pytest.skip("MaxText 0.2.5's deepseek_dequantize.py is not on this machine")


def test_fp4_and_fp8_equal_maxtexts_script(deepseek_v4) -> None:
    """MaxText's script gives bfloat16: the round-to-nearest of suture's float32 values."""
    script = _maxtext_script()
    folder, tensors = deepseek_v4
    for name in ("ffn.experts.1.w2", "ffn.experts.0.w1"):
        weight, scale = tensors[f"layers.0.{name}.weight"], tensors[f"layers.0.{name}.scale"]
        if weight.dtype != torch.int8:  # the script reads FP4 as int8 (what V4's files hold)
            weight = weight.view(torch.int8)
        expected = script.dequantize_mxfp4(weight, scale)
        with pytest.warns(SutureWarning, match="scale byte 254|exceed"):  # 6 * 2**127
            ours = read(folder, f"layers/0/{name.replace('.', '/')}/weight", "bfloat16")
        np.testing.assert_array_equal(bits(ours), bits(expected))
    weight, scale = tensors["layers.0.attn.wq.weight"], tensors["layers.0.attn.wq.scale"]
    expected = script.dequantize_fp8(weight, scale.view(torch.uint8))  # its ragged path
    np.testing.assert_array_equal(
        bits(read(folder, "layers/0/attn/wq/weight", "bfloat16")), bits(expected)
    )


def test_nibble_order_is_low_first_and_the_other_order_would_fail() -> None:
    packed = np.array([[0x21, 0x9F]], np.uint8)  # 0.5, 1.0 | -6.0, -0.5
    ours = dequantize_e2m1(packed, np.ones((1, 1), np.float32), 4)
    assert ours.tolist() == [[0.5, 1.0, -6.0, -0.5]]
    swapped = dequantize_e2m1((packed >> 4) | (packed << 4), np.ones((1, 1), np.float32), 4)
    expected = Fp8Dequantize(None)._unpack_fp4(torch.from_numpy(packed)).numpy()
    np.testing.assert_array_equal(ours, expected)
    assert not np.array_equal(swapped, expected)


def test_ue8m0_byte_255_is_refused_naming_tensor_group_and_byte(tmp_path: Path) -> None:
    scales = np.full((2, 2), 127, np.uint8)
    scales[1, 1] = 255  # E8M0's NaN
    folder = write_folder(
        tmp_path / "m",
        {
            "e.w1.weight": torch.zeros(2, 32, dtype=torch.uint8).view(torch.int8),
            "e.w1.scale": torch.from_numpy(scales).view(torch.float8_e8m0fnu),
        },
        V4_CONFIG,
    )
    lazy = suture.open(folder, dequantize=True)["e/w1/weight"]
    assert lazy[0].read().tolist() == [0.0] * 64  # the intact row reads
    with pytest.raises(suture.CorruptCheckpointError) as error:
        lazy.read()
    for word in ("'e.w1.weight'", "[1, 1]", "'e.w1.scale'", "byte 255", "expected a finite"):
        assert word in str(error.value), (word, str(error.value))
    result = cli("convert", str(folder), str(tmp_path / "out"), "--dequantize")
    assert result.exit_code == 2 and "byte 255" in result.output
    assert not (tmp_path / "out").exists()


# --- compressed-tensors pack-quantized ------------------------------------------------------


def packed_module(shape, bits, strategy, symmetric, group=32, scale_dtype=torch.bfloat16, seed=0):
    """The stored tensors of one pack-quantized module, packed by compressed-tensors (every
    code value used), and its scheme."""
    rng = np.random.default_rng(seed)
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    values = rng.integers(low, high + 1, shape).astype(np.int8)
    values.reshape(-1)[: high - low + 1] = np.arange(low, high + 1)
    groups = shape[-1] // group if strategy == "group" else 1
    scales = torch.from_numpy(rng.uniform(1e-3, 2.0, (*shape[:-1], groups)).astype(np.float32))
    scales = scales.to(scale_dtype)
    args = {"num_bits": bits, "type": "int", "symmetric": symmetric, "strategy": strategy}
    if strategy == "group":
        args["group_size"] = group
    if strategy == "tensor":
        scales = scales.reshape(-1)[:1].clone()
    state = {
        "weight_packed": pack_to_int32(torch.from_numpy(values), bits),
        "weight_scale": scales,
        "weight_shape": torch.tensor(shape),
    }
    if not symmetric:
        zero = rng.integers(low, high + 1, (*shape[:-1], groups)).astype(np.int8)
        state["weight_zero_point"] = pack_to_int32(torch.from_numpy(zero), bits, packed_dim=0)
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))
    return state, scheme, args


def ct_config(args, fmt="pack-quantized", targets=("Linear",)):
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": list(targets), "weights": args}},
    }


def ct_folder(folder: Path, state: dict, config: dict, module="model.layers.0.mlp.down_proj"):
    return write_folder(folder, {f"{module}.{key}": value for key, value in state.items()}, config)


def reference_pack(state, scheme) -> torch.Tensor:
    """compressed-tensors' decompressor in float32 (its scales as float32: the contract)."""
    with_float = {**state, "weight_scale": state["weight_scale"].to(torch.float32)}
    return PackedQuantizationCompressor.decompress(with_float, scheme)["weight"]


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize(
    ("strategy", "symmetric"),
    [("group", True), ("group", False), ("channel", False), ("tensor", True)],
)
def test_pack_quantized_equals_compressed_tensors(tmp_path: Path, width, strategy, symmetric):
    # 80 columns: a row's last word is part empty for every width but 2, 4 and 8
    state, scheme, args = packed_module((13, 80), width, strategy, symmetric, group=16)
    folder = ct_folder(tmp_path / "m", state, ct_config(args))
    expected = reference_pack(state, scheme)
    ours = read(folder, "model/layers/0/mlp/down_proj/weight")
    assert ours.shape == (13, 80)
    np.testing.assert_array_equal(bits(ours), bits(expected))
    ours_bf16 = read(folder, "model/layers/0/mlp/down_proj/weight", "bfloat16")
    np.testing.assert_array_equal(bits(ours_bf16), bits(expected.to(torch.bfloat16)))
    lazy = suture.open(folder, dequantize=True, dequantize_dtype="float32")
    weight = lazy["model/layers/0/mlp/down_proj/weight"]
    for rows in (slice(5, 12), slice(12, 13), slice(None, None, -4)):  # zero points mid-word
        np.testing.assert_array_equal(weight[rows, 17:70].read(), ours[rows, 17:70])


def test_pack_quantized_experts_and_any_slice(tmp_path: Path) -> None:
    """3-D experts (packed per expert, zero points along rows), float16 scales, a slice of
    rows and columns equal to the whole read's."""
    state, scheme, args = packed_module(
        (3, 40, 96), 4, "group", False, group=32, scale_dtype=torch.float16
    )
    folder = ct_folder(tmp_path / "m", state, ct_config(args), "model.layers.1.mlp.experts")
    expected = reference_pack(state, scheme).numpy()
    lazy = suture.open(folder, dequantize=True, dequantize_dtype="float32")
    weight = lazy["model/layers/1/mlp/experts/weight"]
    np.testing.assert_array_equal(bits(weight.read()), bits(expected))
    np.testing.assert_array_equal(weight[1:3, 7:29, 33:70].read(), expected[1:3, 7:29, 33:70])
    np.testing.assert_array_equal(weight[:, ::5, ::7].read(), expected[:, ::5, ::7])
    np.testing.assert_array_equal(weight[2, ::-3, ::-5].read(), expected[2, ::-3, ::-5])
    assert weight[:, 3:3].read().shape == (3, 0, 96)
    # 16-bit scales are computed in their own dtype by compressed-tensors (two roundings);
    # its float16 output differs from one rounding of the float32 value, suture's contract
    fp16 = PackedQuantizationCompressor.decompress(state, scheme)["weight"]
    assert fp16.dtype == torch.float16


def test_a_row_block_reads_its_rows_and_groups_only(tmp_path: Path) -> None:
    state, _, args = packed_module((64, 256), 4, "group", False, group=32)
    folder = ct_folder(tmp_path / "m", state, ct_config(args))
    node = suture.open(folder, dequantize=True)["model/layers/0/mlp/down_proj/weight"].node
    parts = node.input_selections((range(16, 24), range(64, 96)))
    shapes = [tuple(len(axis) for axis in part) for _, part in parts]
    assert shapes == [(8, 4), (8, 1), (1, 1)]  # 4 words of 8 values, a group, a word of zeros
    assert node.describe() == "dequantize int4 pack-quantized, group 32 -> bfloat16"


def test_written_by_compressed_tensors_own_compressor(tmp_path: Path) -> None:
    """A weight compressed by compressed-tensors (quantize, pack, zero points) reads back as
    its decompressor gives it."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(24, 64, generator=generator)
    scheme = QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(
            num_bits=4, type="int", symmetric=False, strategy="group", group_size=32
        ),
    )
    grouped = weight.reshape(24, 2, 32)
    low, high = grouped.amin(-1).clamp(max=0), grouped.amax(-1).clamp(min=0)
    scale = ((high - low) / 15).to(torch.bfloat16)
    zero = (-8 - torch.round(low / scale.float())).clamp(-8, 7).to(torch.int8)
    compressed = PackedQuantizationCompressor.compress(
        {"weight": weight, "weight_scale": scale, "weight_zero_point": zero}, scheme
    )
    folder = ct_folder(tmp_path / "m", compressed, ct_config(scheme.weights.model_dump()))
    expected = reference_pack(compressed, scheme)
    ours = read(folder, "model/layers/0/mlp/down_proj/weight")
    np.testing.assert_array_equal(bits(ours), bits(expected))
    assert np.abs(ours - weight.numpy()).max() < 0.5  # the values it quantized, near


def test_dense_packing_is_not_the_older_per_word_packing() -> None:
    """0.20 packs 3-bit values across word boundaries (value 10 straddles bits 30-32); the
    older layout (ten whole values a word) would read other values."""
    values = torch.arange(-4, 4, dtype=torch.int8).repeat(4)[:32].reshape(1, 32)
    words = pack_to_int32(values, 3).numpy()
    assert words.shape == (1, 3)
    np.testing.assert_array_equal(unpack_codes(words, 3, 32).astype(np.int16) - 4, values)
    per_word = np.array([(int(words[0, w]) >> (3 * i)) & 7 for w in range(3) for i in range(10)])
    assert not np.array_equal(per_word - 4, values.numpy()[0, :30])


# --- NVFP4: compressed-tensors and ModelOpt -------------------------------------------------


def nvfp4_tensors(rows=9, cols=512, seed=0):
    rng = np.random.default_rng(seed)
    packed = torch.from_numpy(every_byte(rows, cols // 2, seed))
    codes = rng.integers(0, 0x7F, (rows, cols // 16)).astype(np.uint8)  # every finite E4M3 > 0
    count = min(0x7F, codes.size)
    codes.reshape(-1)[:count] = np.arange(count)
    scales = torch.from_numpy(codes).view(torch.float8_e4m3fn)
    return packed, scales


NVFP4_ARGS = {
    "num_bits": 4,
    "type": "float",
    "symmetric": True,
    "strategy": "tensor_group",
    "group_size": 16,
}


def test_nvfp4_pack_quantized_equals_compressed_tensors(tmp_path: Path) -> None:
    packed, scales = nvfp4_tensors()
    global_scale = torch.tensor([448 * 6 / 3.7], dtype=torch.float32)
    state = {"weight_packed": packed, "weight_scale": scales, "weight_global_scale": global_scale}
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**NVFP4_ARGS))
    folder = ct_folder(tmp_path / "m", state, ct_config(NVFP4_ARGS, "nvfp4-pack-quantized"))
    float32 = dequantize(
        x_q=unpack_fp4_from_uint8(packed, 9, 512, dtype=torch.float32),
        scale=scales.to(torch.float32),
        args=scheme.weights,
        global_scale=global_scale,
        dtype=torch.float32,
    )
    ours = read(folder, "model/layers/0/mlp/down_proj/weight")
    np.testing.assert_array_equal(bits(ours), bits(float32))
    eight = np.flatnonzero(packed.numpy()[0] == 0x08)[0] * 2  # low nibble 8, high 0
    assert ours[0, eight] == 0 and np.signbit(ours[0, eight])  # -0.0 in compressed-tensors
    decompressed = NVFP4PackedCompressor.decompress(state, scheme)["weight"]  # bfloat16
    np.testing.assert_array_equal(
        bits(read(folder, "model/layers/0/mlp/down_proj/weight", "bfloat16")), bits(decompressed)
    )


def _modelopt():
    with warnings.catch_warnings():  # its import warns of deprecated torch APIs
        warnings.simplefilter("ignore")
        nvfp4 = pytest.importorskip("modelopt.torch.quantization.qtensor.nvfp4_tensor")
    return nvfp4.NVFP4QTensor


@pytest.mark.parametrize("config_in", ["hf_quant_config.json", "config.json"])
def test_modelopt_nvfp4_equals_modelopt(tmp_path: Path, config_in) -> None:
    qtensor = _modelopt()
    packed, scales = nvfp4_tensors(seed=1)
    scale_2 = torch.tensor(3.7 / (448 * 6), dtype=torch.float32)  # 0-D, as ModelOpt writes
    module = "model.layers.0.mlp.up_proj"
    tensors = {
        f"{module}.weight": packed,
        f"{module}.weight_scale": scales,
        f"{module}.weight_scale_2": scale_2,
        f"{module}.input_scale": torch.tensor(0.5),
        "lm_head.weight": torch.ones(3, 4),
    }
    details = {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
    if config_in == "config.json":
        folder = write_folder(tmp_path / "m", tensors, {"quant_method": "modelopt", **details})
    else:
        hf_quant = {"producer": {"name": "modelopt"}, "quantization": details}
        folder = write_folder(tmp_path / "m", tensors, extra={"hf_quant_config.json": hf_quant})
    reference = qtensor(torch.Size([9, 512]), torch.float32, packed)
    expected = reference.dequantize(
        dtype=torch.float32, scale=scales, double_scale=scale_2, block_sizes={-1: 16}
    )
    opened = suture.open(folder, dequantize=True, dequantize_dtype="float32")
    assert sorted(opened.paths()) == ["lm_head/weight", "model/layers/0/mlp/up_proj/weight"]
    ours = opened["model/layers/0/mlp/up_proj/weight"].read()
    np.testing.assert_array_equal(bits(ours), bits(expected))
    eight = np.flatnonzero(packed.numpy()[0] == 0x08)[0] * 2  # low nibble 8, high 0
    assert ours[0, eight] == 0 and not np.signbit(ours[0, eight])  # +0.0 in ModelOpt's table
    result = cli("convert", str(folder), str(tmp_path / "out"), "--dequantize")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "out" / "hf_quant_config.json").exists()
    out = suture.open(tmp_path / "out")
    assert "quantization_config" not in out.layout
    np.testing.assert_array_equal(
        out["model/layers/0/mlp/up_proj/weight"].read(), ours.astype(ml_dtypes.bfloat16)
    )


def test_modelopt_quantizer_output_reads_back(tmp_path: Path) -> None:
    qtensor = _modelopt()
    weight = torch.randn(32, 64, generator=torch.Generator().manual_seed(2))
    quantized, scale, scale_2 = qtensor.quantize(weight, 16)
    tensors = {
        "m.weight": quantized._quantized_data,
        "m.weight_scale": scale,
        "m.weight_scale_2": scale_2.reshape(()),
    }
    hf_quant = {"quantization": {"quant_algo": "NVFP4", "group_size": 16}}
    folder = write_folder(tmp_path / "m", tensors, extra={"hf_quant_config.json": hf_quant})
    expected = quantized.dequantize(
        dtype=torch.float32, scale=scale, double_scale=scale_2, block_sizes={-1: 16}
    )
    np.testing.assert_array_equal(bits(read(folder, "m/weight")), bits(expected))


def test_e2m1_node_slices_equal_the_whole() -> None:
    packed, scales = nvfp4_tensors(rows=6, cols=128)
    node = GroupedDequantNode(
        E2M1Codec(
            MemorySource(packed.numpy()),
            MemorySource(scales.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)),
            16,
            "w",
            "w_scale",
        ),
        np.float32,
    )
    whole = node.read((range(6), range(128)))
    assert whole[0, 0] == E2M1[0] * 0  # nibble 0 of scale code 0
    for selection in [(range(2, 5), range(17, 40)), (np.array([5, 0]), range(127, 8, -3))]:
        expected = whole[np.ix_(np.asarray(list(selection[0])), np.asarray(list(selection[1])))]
        np.testing.assert_array_equal(node.read(selection), expected)


# --- bad input --------------------------------------------------------------------------------


def _int4(tmp_path: Path, change=None, args_change=None, drop=None, shape=(8, 64)):
    state, _, args = packed_module(shape, 4, "group", False, group=32)
    state = dict(state)
    if change:
        state.update(change(state))
    for name in drop or ():
        del state[name]
    return ct_folder(tmp_path / "m", state, ct_config({**args, **(args_change or {})}))


BAD = {
    "scale of another group size": (
        lambda p: _int4(p, change=lambda s: {"weight_scale": torch.ones(8, 4)}),
        ["weight_scale'", "(8, 4)", "group_size 32", "(8, 2)"],
    ),
    "config with the wrong group size": (
        lambda p: _int4(p, args_change={"group_size": 16}),
        ["weight_scale'", "(8, 2)", "group_size 16", "(8, 4)"],
    ),
    "weight_shape disagreeing with the bytes": (
        lambda p: _int4(p, change=lambda s: {"weight_shape": torch.tensor([8, 96])}),
        ["weight_shape'", "(8, 96)", "(8, 8)", "(8, 12)"],
    ),
    "config with the wrong bit width": (
        lambda p: _int4(p, args_change={"num_bits": 8}),
        ["weight_packed'", "(8, 8)", "(8, 16)", "num_bits=8"],
    ),
    "group size not dividing the columns": (
        lambda p: _int4(
            p,
            change=lambda s: {
                "weight_shape": torch.tensor([8, 60]),
                "weight_scale": torch.ones(8, 2, dtype=torch.bfloat16),
            },
        ),
        ["60 columns", "group_size 32", "multiple of 32"],
    ),
    "scale missing": (
        lambda p: _int4(p, drop=["weight_scale"]),
        ["has no 'model.layers.0.mlp.down_proj.weight_scale'", "weight_packed"],
    ),
    "zero points missing": (
        lambda p: _int4(p, drop=["weight_zero_point"]),
        ["weight_zero_point'", "has no"],
    ),
    "unsupported format": (
        lambda p: ct_folder(p / "m", {"w": torch.zeros(1)}, ct_config({}, "marlin-24")),
        ["format 'marlin-24'", "pack-quantized"],
    ),
    "sparse compression": (
        lambda p: ct_folder(
            p / "m",
            {"w": torch.zeros(1)},
            {
                **ct_config(NVFP4_ARGS, "nvfp4-pack-quantized"),
                "sparsity_config": {"format": "sparse-24-bitmask"},
            },
        ),
        ["sparsity_config format 'sparse-24-bitmask'"],
    ),
    "unsupported bit width": (
        lambda p: ct_folder(
            p / "m",
            {"w": torch.zeros(1)},
            ct_config({"num_bits": 16, "type": "int", "strategy": "group", "group_size": 8}),
        ),
        ["num_bits=16", "1 to 8 bits"],
    ),
    "fp4 scale per 16 instead of 32": (
        lambda p: write_folder(
            p / "m",
            {
                "e.weight": torch.zeros(4, 32, dtype=torch.int8),
                "e.scale": torch.zeros(4, 4, dtype=torch.uint8),
            },
            V4_CONFIG,
        ),
        ["'e.scale'", "(4, 4)", "(4, 2)", "per 32"],
    ),
    "nvfp4 scale of the wrong shape": (
        lambda p: ct_folder(
            p / "m",
            {
                "weight_packed": torch.zeros(4, 32, dtype=torch.uint8),
                "weight_scale": torch.zeros(4, 8, dtype=torch.uint8).view(torch.float8_e4m3fn),
                "weight_global_scale": torch.ones(1),
            },
            ct_config(NVFP4_ARGS, "nvfp4-pack-quantized"),
        ),
        ["weight_scale'", "(4, 8)", "(4, 4)", "group_size 16"],
    ),
    "modelopt without weight_scale_2": (
        lambda p: write_folder(
            p / "m",
            {
                "m.weight": torch.zeros(4, 8, dtype=torch.uint8),
                "m.weight_scale": torch.zeros(4, 1, dtype=torch.uint8).view(torch.float8_e4m3fn),
            },
            {"quant_method": "modelopt", "quant_algo": "NVFP4"},
        ),
        ["'m.weight'", "has no 'm.weight_scale_2'"],
    ),
    "modelopt weight without its scales": (
        lambda p: write_folder(
            p / "m",
            {"m.weight": torch.zeros(4, 8, dtype=torch.uint8)},
            {"quant_method": "modelopt", "quant_algo": "NVFP4"},
        ),
        ["'m.weight'", "uint8", "no 'm.weight_scale'"],
    ),
    "modelopt algorithm not supported": (
        lambda p: write_folder(
            p / "m",
            {"m.weight": torch.zeros(1)},
            {"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"},
        ),
        ["quant_algo 'W4A8_AWQ'", "NVFP4"],
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_naming_tensor_expected_and_found(tmp_path: Path, case) -> None:
    make, words = BAD[case]
    folder = make(tmp_path)
    with pytest.raises(suture.SurgeryError) as error:
        suture.open(folder, dequantize=True)
    for word in words:
        assert word in str(error.value), (word, str(error.value))
    result = cli("convert", str(folder), str(tmp_path / "out"), "--dequantize")
    assert result.exit_code == 2 and result.output.startswith("Error: "), result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("kind", "value"), [("int4 NaN scale", float("nan")), ("nvfp4 global scale 0", 0.0)]
)
def test_non_finite_scales_are_refused_before_anything_is_written(tmp_path, kind, value):
    if kind.startswith("int4"):
        folder = _int4(
            tmp_path,
            change=lambda s: {
                "weight_scale": s["weight_scale"].index_fill(0, torch.tensor([5]), value)
            },
        )
        words = ["'model.layers.0.mlp.down_proj.weight'", "group [5, 0]", "nan"]
    else:
        packed, scales = nvfp4_tensors(rows=2, cols=64)
        state = {
            "weight_packed": packed,
            "weight_scale": scales,
            "weight_global_scale": torch.tensor([value]),
        }
        folder = ct_folder(tmp_path / "m", state, ct_config(NVFP4_ARGS, "nvfp4-pack-quantized"))
        words = ["'model.layers.0.mlp.down_proj.weight'", "group [0, 0]", "global scale 0.0"]
    lazy = suture.open(folder, dequantize=True)["model/layers/0/mlp/down_proj/weight"]
    row = 1 if kind.startswith("nvfp4") else 5
    with pytest.raises(suture.CorruptCheckpointError) as error:
        lazy[row].read()  # one row read: the error names that row's group
    assert f"group [{row}, 0]" in str(error.value), str(error.value)
    with pytest.raises(suture.CorruptCheckpointError) as error:
        read(folder, "model/layers/0/mlp/down_proj/weight")
    for word in words:
        assert word in str(error.value), (word, str(error.value))
    result = cli("convert", str(folder), str(tmp_path / "out"), "--dequantize")
    assert result.exit_code == 2 and not (tmp_path / "out").exists()


# --- the command line -------------------------------------------------------------------------


def test_inspect_shows_logical_shape_and_format(deepseek_v4, tmp_path: Path) -> None:
    folder, _ = deepseek_v4
    shown = cli("inspect", str(folder), "--flat").output
    line = next(line for line in shown.splitlines() if "experts/0/w1/weight" in line)
    assert "fp4 e2m1 group 32" in line and "(9, 256)" in line
    state, _, args = packed_module((8, 64), 4, "group", True)
    ct = ct_folder(tmp_path / "ct", state, ct_config(args))
    shown = cli("inspect", str(ct), "--flat").output
    assert "INT4 pack-quantized, symmetric, a scale per 32" in shown
    line = next(line for line in shown.splitlines() if "weight_packed" in line)
    assert "int4 pack-quantized, group 32" in line and "(8, 64)" in line


def test_plan_shows_the_dequantization_per_leaf(tmp_path: Path) -> None:
    state, _, args = packed_module((8, 64), 3, "group", False)
    folder = ct_folder(tmp_path / "m", state, ct_config(args))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("rules:\n  - rename: {pattern: 'model', to: 'params'}\n")
    result = cli("plan", str(recipe), str(folder), "--dequantize", "--json")
    assert result.exit_code == 0, result.output
    outputs = {leaf["path"]: leaf for leaf in json.loads(result.output)["outputs"]}
    leaf = outputs["params/layers/0/mlp/down_proj/weight"]
    assert leaf["operations"] == ["dequantize int3 pack-quantized, group 32 -> bfloat16"]
    assert leaf["shape"] == [8, 64] and leaf["dtype"] == "bfloat16"
    # the packed words (8 rows of 6), bfloat16 scales (8 x 2), zero points (1 word x 2)
    assert leaf["bytes_to_read"] == 8 * 6 * 4 + 8 * 2 * 2 + 1 * 2 * 4
    assert not any("weight_scale" in path or "weight_shape" in path for path in outputs)


def test_a_family_recipe_dequantizes_int4_experts_in_the_same_pass(tmp_path: Path) -> None:
    """A Llama whose linear weights compressed-tensors packed to INT4 converts to MaxText in
    one pass; the result equals converting the folder compressed-tensors' decompressor
    gives (bfloat16), both directions."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    weights = load_file(tmp_path / "bf16" / "model.safetensors")
    _, scheme, args = packed_module((2, 32), 4, "group", True)  # the scheme only
    packed, reference = {}, {}
    for name, weight in weights.items():
        if weight.ndim != 2 or "embed" in name or "lm_head" in name:
            packed[name] = reference[name] = weight
            continue
        module = name[: -len(".weight")]
        scale = (weight.float().reshape(weight.shape[0], -1, 32).abs().amax(-1) / 7).clamp(min=1e-4)
        compressed = PackedQuantizationCompressor.compress(
            {"weight": weight.float(), "weight_scale": scale}, scheme
        )
        packed.update({f"{module}.{key}": value for key, value in compressed.items()})
        reference[name] = reference_pack(compressed, scheme).to(torch.bfloat16)
    saved = json.loads((tmp_path / "bf16" / "config.json").read_text())
    ct = write_folder(tmp_path / "int4", packed, ct_config(args))
    (ct / "config.json").write_text(json.dumps({**saved, "quantization_config": ct_config(args)}))
    plain = write_folder(tmp_path / "dequantized", reference)
    (plain / "config.json").write_text(json.dumps(saved))
    for source, out in ((ct, "one"), (plain, "two")):
        result = cli("convert", str(source), str(tmp_path / out), "--recipe", "llama3.1:maxtext")
        assert result.exit_code == 0, result.output
    assert cli("diff", str(tmp_path / "one"), str(tmp_path / "two"), "--values").exit_code == 0
    back = cli(
        "convert",
        str(tmp_path / "one"),
        str(tmp_path / "back"),
        "--recipe",
        "llama3.1:maxtext",
        "--reverse",
    )
    assert back.exit_code == 0, back.output
    assert "quantization_config" not in json.loads((tmp_path / "back" / "config.json").read_text())
    assert cli("diff", str(tmp_path / "back"), str(plain), "--values").exit_code == 0


# --- hostile layouts ------------------------------------------------------------------------


@pytest.mark.parametrize("scale_shape", [(1,), (1, 1), ()])
def test_one_per_tensor_scale_of_any_shape_equals_compressed_tensors(tmp_path, scale_shape):
    """A per-tensor scale stored (1, 1) is the one scale of every row, not a row's: a read of
    8 rows must not take 8 rows of it (the bytes after it are another tensor's)."""
    state, scheme, args = packed_module((8, 64), 4, "tensor", True)
    state = {**state, "weight_scale": state["weight_scale"].reshape(scale_shape)}
    module = "model.layers.0.mlp.down_proj"
    tensors = {f"{module}.{key}": value for key, value in state.items()}
    tensors[f"{module}.zz_after_the_scale"] = torch.full((64,), 1000.0, dtype=torch.bfloat16)
    folder = write_folder(tmp_path / "m", tensors, ct_config(args))
    expected = reference_pack(state, scheme)
    ours = read(folder, "model/layers/0/mlp/down_proj/weight")
    np.testing.assert_array_equal(bits(ours), bits(expected))


def test_a_read_past_a_stored_tensors_rows_is_refused_not_the_next_tensors_bytes(tmp_path):
    from suture._errors import InvalidIndexError
    from suture.sources.filesource import FileRangeSource

    save_file({"a": torch.ones(1, 2), "b": torch.full((4, 2), 7.0)}, tmp_path / "x.safetensors")
    stored = suture.open(tmp_path / "x.safetensors")["a"].node
    assert isinstance(stored, FileRangeSource) and stored.shape == (1, 2)
    with pytest.raises(InvalidIndexError, match=r"rows 0-3 of tensor 'a'.*shape \(1, 2\)"):
        stored.read((range(3), range(2)))
    with pytest.raises(InvalidIndexError, match="rows 1-2"):
        stored.read((range(1, 2), range(1)))


def test_a_modelopt_weight_of_another_scheme_is_refused_not_passed_on_as_codes(tmp_path):
    """An FP8 layer (a float32 per-tensor weight_scale) in an NVFP4 export: passed on as it
    was, its E4M3 codes would be read as values in a checkpoint that says it is dequantized."""
    packed, scales = nvfp4_tensors(rows=2, cols=64)
    folder = write_folder(
        tmp_path / "m",
        {
            "m.weight": packed,
            "m.weight_scale": scales,
            "m.weight_scale_2": torch.tensor(1.0),
            "f.weight": torch.ones(4, 16).to(torch.float8_e4m3fn),
            "f.weight_scale": torch.tensor(0.5),
        },
        {"quant_method": "modelopt", "quant_algo": "NVFP4"},
    )
    with pytest.raises(suture.CorruptCheckpointError) as error:
        suture.open(folder, dequantize=True)
    for word in ("'f.weight' is float8_e4m3fn", "'f.weight_scale' is float32 of shape ()"):
        assert word in str(error.value), str(error.value)
    result = cli("convert", str(folder), str(tmp_path / "out"), "--dequantize")
    assert result.exit_code == 2 and not (tmp_path / "out").exists()
