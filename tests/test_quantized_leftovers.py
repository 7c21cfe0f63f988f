"""Quantized tensors that the config's scheme does not dequantize are refused, never passed on.

A dequantized folder says its weights are values; a tensor still stored quantized in it
(another format's codes, scales or packed words, an FP4 weight whose scale is missing, a
part whose packed weight is missing) would be read as values by everything downstream. So
would a plain tensor that a dequantized one silently replaced, or replaced it. And a stored
scale that is not finite is damage in every format, FP8's block scales included.
Each case: the error names the tensor and what was found, and `suture convert --dequantize`
writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="F4 and E8M0 tensors are written by torch (dev)")
compressed_tensors = pytest.importorskip("compressed_tensors", reason="the dev extra")
# ruff: noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
from safetensors.torch import save_file
from typer.testing import CliRunner

import suture
from suture.cli import app

V4 = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "scale_fmt": "ue8m0",
    "weight_block_size": [128, 128],
    "expert_dtype": "fp4",
}
FP8 = {"quant_method": "fp8", "weight_block_size": [128, 128]}
INT4 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "g": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 4,
                "type": "int",
                "symmetric": True,
                "strategy": "group",
                "group_size": 32,
            },
        }
    },
}
NVFP4 = {
    "quant_method": "compressed-tensors",
    "format": "nvfp4-pack-quantized",
    "config_groups": {
        "g": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 4,
                "type": "float",
                "symmetric": True,
                "strategy": "tensor_group",
                "group_size": 16,
            },
        }
    },
}


def folder(path: Path, tensors: dict, quantization: dict) -> Path:
    path.mkdir(parents=True)
    config = {"model_type": "llama", "quantization_config": quantization}
    (path / "config.json").write_text(json.dumps(config))
    save_file(
        {name: value.contiguous() for name, value in tensors.items()}, path / "model.safetensors"
    )
    return path


def fp8_ones(shape: tuple[int, ...]):
    return torch.full(shape, 0x38, dtype=torch.uint8).view(torch.float8_e4m3fn)  # codes of 1.0


def refused(path: Path, tmp_path: Path, *words: str) -> str:
    """The error of opening `path` dequantized (it names every one of `words`); the
    command line's conversion fails with it and leaves no output."""
    with pytest.raises(suture.CorruptCheckpointError) as error:
        opened = suture.open(path, dequantize=True)
        for leaf in opened.paths():
            opened[leaf].read()
    message = str(error.value)
    for word in words:
        assert word in message, (word, message)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["convert", str(path), str(out), "--dequantize"])
    assert result.exit_code == 2, result.output
    assert not out.exists()
    return message


def test_an_fp4_weight_without_its_scale_is_refused_not_read_as_bytes(tmp_path: Path) -> None:
    packed = torch.arange(4 * 32, dtype=torch.uint8).reshape(4, 32)
    path = folder(
        tmp_path / "m",
        {"layers.0.ffn.experts.0.w1.weight": packed.view(torch.float4_e2m1fn_x2)},
        V4,
    )
    assert suture.open(path)["layers/0/ffn/experts/0/w1/weight"].dtype == np.uint8  # stored
    refused(
        path,
        tmp_path,
        "'layers.0.ffn.experts.0.w1.weight' is F4",
        "has no 'layers.0.ffn.experts.0.w1.scale'",
    )


CROSS = {
    "fp8 pair under mxfp4": (
        {"l.weight": fp8_ones((4, 8)), "l.weight_scale_inv": torch.tensor([[0.25]])},
        {"quant_method": "mxfp4"},
        ("'l.weight_scale_inv'", "an FP8 block scale", "'mxfp4'"),
    ),
    "fp8 pair under compressed-tensors": (
        {"l.weight": fp8_ones((4, 8)), "l.weight_scale_inv": torch.tensor([[0.25]])},
        INT4,
        ("'l.weight_scale_inv'", "an FP8 block scale", "'compressed-tensors'"),
    ),
    "packed int4 under fp8": (
        {
            "l.weight_packed": pack_to_int32(torch.ones(4, 64, dtype=torch.int8), 4),
            "l.weight_scale": torch.full((4, 2), 0.5),
            "l.weight_shape": torch.tensor([4, 64]),
        },
        FP8,
        ("'l.weight_packed'", "compressed-tensors' packed values", "'fp8'"),
    ),
    "mxfp4 blocks under fp8": (
        {
            "x_blocks": torch.full((4, 1, 16), 0x22, dtype=torch.uint8),
            "x_scales": torch.full((4, 1), 127, dtype=torch.uint8),
        },
        FP8,
        ("'x_blocks'", "MXFP4 blocks", "'fp8'"),
    ),
    "fp8 codes without scales under compressed-tensors": (
        {"l.weight": fp8_ones((4, 8))},
        INT4,
        ("'l.weight'", "float8_e4m3fn, FP8 codes"),
    ),
}


@pytest.mark.parametrize("case", list(CROSS))
def test_quantized_tensors_of_another_format_are_refused(tmp_path: Path, case: str) -> None:
    tensors, quantization, words = CROSS[case]
    message = refused(folder(tmp_path / "m", tensors, quantization), tmp_path, *words)
    assert "stored quantized" in message and "its codes would be read as values" in message


def test_a_packed_weight_beside_a_plain_one_of_its_name_is_refused(tmp_path: Path) -> None:
    tensors = {
        "m.p.weight": torch.full((8, 64), 7.0, dtype=torch.bfloat16),
        "m.p.weight_packed": pack_to_int32(torch.ones(8, 64, dtype=torch.int8), 4),
        "m.p.weight_scale": torch.full((8, 2), 0.5, dtype=torch.bfloat16),
        "m.p.weight_shape": torch.tensor([8, 64]),
    }
    refused(
        folder(tmp_path / "m", tensors, INT4),
        tmp_path,
        "'m.p.weight_packed' dequantizes to 'm.p.weight'",
        "also holds a tensor 'm.p.weight' (bfloat16 of shape (8, 64))",
    )


def test_mxfp4_blocks_beside_a_plain_tensor_of_their_name_are_refused(tmp_path: Path) -> None:
    tensors = {
        "x": torch.full((32, 4), 7.0, dtype=torch.bfloat16),
        "x_blocks": torch.full((32, 1, 16), 0x22, dtype=torch.uint8),
        "x_scales": torch.full((32, 1), 127, dtype=torch.uint8),
    }
    refused(
        folder(tmp_path / "m", tensors, {"quant_method": "mxfp4"}),
        tmp_path,
        "'x_blocks' dequantizes to 'x'",
        "also holds a tensor 'x' (bfloat16 of shape (32, 4))",
    )


@pytest.mark.parametrize("stored", ["uint8", "float8_e8m0fnu", "float32 nan", "float32 inf"])
def test_an_fp8_block_scale_that_is_not_finite_is_refused_naming_the_block(
    tmp_path: Path, stored: str
) -> None:
    """UE8M0's byte 255 read the same whether stored U8 or F8_E8M0 (it once gave inf in one
    and NaN in the other, with a warning); NaN and inf float scales likewise."""
    weight = fp8_ones((256, 256))
    if stored in ("uint8", "float8_e8m0fnu"):
        scales = torch.full((2, 2), 127, dtype=torch.uint8)
        scales[1, 0] = 255
        if stored == "float8_e8m0fnu":
            scales = scales.view(torch.float8_e8m0fnu)
        shown = "stored byte 255"
    else:
        scales = torch.ones(2, 2)
        scales[1, 0] = float(stored.split()[1])
        shown = f"stored {stored.split()[1]}"
    path = folder(tmp_path / "m", {"l.weight": weight, "l.weight_scale_inv": scales}, V4)
    lazy = suture.open(path, dequantize=True, dequantize_dtype="float32")["l/weight"]
    assert lazy[:128].read().tolist() == np.ones((128, 256), np.float32).tolist()  # intact
    with pytest.raises(suture.CorruptCheckpointError) as error:
        lazy.read()
    for word in ("'l.weight'", "block [1, 0]", "'l.weight_scale_inv'", shown, "not finite"):
        assert word in str(error.value), (word, str(error.value))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["convert", str(path), str(out), "--dequantize"])
    assert result.exit_code == 2 and "not finite" in result.output
    assert not out.exists()


def test_parts_of_a_missing_packed_weight_are_refused(tmp_path: Path) -> None:
    tensors = {
        "m.q.weight_shape": torch.tensor([8, 64]),
        "n.weight": torch.ones(2),
    }
    refused(
        folder(tmp_path / "m", tensors, INT4),
        tmp_path,
        "'m.q.weight_shape' belongs to a packed weight 'm.q.weight_packed'",
        "lacks",
    )


def test_a_zero_point_beside_a_symmetric_nvfp4_weight_is_refused(tmp_path: Path) -> None:
    tensors = {
        "m.p.weight_packed": torch.zeros(4, 16, dtype=torch.uint8),
        "m.p.weight_scale": fp8_ones((4, 2)),
        "m.p.weight_global_scale": torch.ones(1),
        "m.p.weight_zero_point": torch.zeros(4, 2, dtype=torch.int8),
    }
    refused(
        folder(tmp_path / "m", tensors, NVFP4),
        tmp_path,
        "'m.p.weight_zero_point' sits beside 'm.p.weight_packed'",
        "symmetric",
    )


def test_a_ue8m0_scale_without_its_weight_is_refused(tmp_path: Path) -> None:
    scale = torch.full((4, 1), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    refused(
        folder(tmp_path / "m", {"e.scale": scale, "n.weight": torch.ones(2)}, V4),
        tmp_path,
        "UE8M0 scale tensor 'e.scale'",
        "'e.weight' is missing",
    )


def test_a_float_scale_beside_a_float_weight_stays_an_ordinary_tensor(tmp_path: Path) -> None:
    """Not every ``.scale`` is UE8M0: a norm's float scale passes through as it is."""
    tensors = {"norm.scale": torch.full((4,), 2.0), "norm.weight": torch.ones(4)}
    opened = suture.open(folder(tmp_path / "m", tensors, V4), dequantize=True)
    assert opened["norm/scale"].read().tolist() == [2.0] * 4


def test_an_fp8_layer_that_modelopt_excludes_from_nvfp4_is_refused(tmp_path: Path) -> None:
    """ModelOpt's excluded modules pass through as stored; an FP8 one (a mixed-precision
    export) would pass its codes as values, so it is refused naming exclude_modules."""
    path = tmp_path / "m"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    quantization = {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["attn*"]}
    (path / "hf_quant_config.json").write_text(json.dumps({"quantization": quantization}))
    save_file(
        {"attn.weight": fp8_ones((4, 16)), "norm.weight": torch.ones(4)}, path / "model.safetensors"
    )
    refused(path, tmp_path, "'attn.weight' is float8_e4m3fn", "exclude_modules")
