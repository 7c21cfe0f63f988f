"""Quantized checkpoints: FP8 block scales and MXFP4 read dequantized, FP8 written.

The references are transformers' own functions, run here: `Fp8Dequantize._dequantize_one`
and `_dequantize_fp8_weight` (integrations/finegrained_fp8.py: DeepSeek-V3's formula,
``float32(w) * scale_inv`` per block, ragged edge blocks included), `Fp8Quantize._quantize_one`
(the FP8 quantizer) and `convert_moe_packed_tensors` (integrations/mxfp4.py). DeepSeek-V3's
``fp8_cast_bf16.py`` and MaxText's dequantization script are scripts of repositories that
cannot be installed (the first needs a GPU for its Triton kernel); they compute the same
``weight * scale_inv[i // 128, j // 128]`` that the transformers functions above compute.
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="the references are transformers' torch code (the dev extra)"
)
# ruff: noqa: E402
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from transformers import FineGrainedFP8Config
from transformers.integrations.finegrained_fp8 import (
    Fp8Dequantize,
    Fp8Quantize,
    _dequantize_fp8_weight,
    replace_with_fp8_linear,
)
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

import suture
from suture._lazy.graph import MemorySource
from suture._lazy.selection import outer_index
from suture._quant.formats import dequantize_fp8, quantize_fp8
from suture._quant.nodes import FP8DequantNode, MXFP4DequantNode

FP8_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic"}


def fp8_config(block=(128, 128), **extra):
    return {**FP8_CONFIG, "weight_block_size": list(block), **extra}


def quantizer(block=(128, 128), scale_fmt="float"):
    """transformers' FP8 quantizer, as its HF quantizer object hands it its config."""
    config = FineGrainedFP8Config(weight_block_size=block, scale_fmt=scale_fmt)
    return Fp8Quantize(types.SimpleNamespace(quantization_config=config))


def reference_quantize(weight: torch.Tensor, block=(128, 128), name="x.weight"):
    out = quantizer(block)._quantize_one(name, weight)
    return out[name], out[name.rsplit(".", 1)[0] + ".weight_scale_inv"]


def write_folder(folder: Path, tensors: dict, quantization=None, shards=None) -> Path:
    """A Hugging Face folder: tensors (torch) in one file or in `shards` files with an index."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "llama", "dtype": "bfloat16"}
    if quantization is not None:
        config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    if not shards:
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        return folder
    names = list(tensors)
    weight_map = {}
    for index in range(shards):
        part = names[index::shards]
        file = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        save_file({name: tensors[name] for name in part}, folder / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return folder


def as_numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if tensor.dtype == torch.float8_e4m3fn:
        return tensor.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    return tensor.numpy()


def random_fp8(shape, block, seed=0):
    """A bfloat16 weight and its FP8 + scale_inv made by transformers' quantizer (padded to
    whole blocks for the quantizer, then cut: zeros change no block's scale)."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(*shape, generator=generator, dtype=torch.float32).to(torch.bfloat16)
    padded_shape = (
        *shape[:-2],
        math.ceil(shape[-2] / block[0]) * block[0],
        math.ceil(shape[-1] / block[1]) * block[1],
    )
    padded = torch.zeros(padded_shape, dtype=torch.bfloat16)
    padded[..., : shape[-2], : shape[-1]] = weight
    values, scales = reference_quantize(padded, block)
    return weight, values[..., : shape[-2], : shape[-1]].contiguous(), scales


# --- the arithmetic, against transformers ---------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_dequantize_equals_transformers_where_blocks_divide(dtype) -> None:
    _, values, scales = random_fp8((256, 384), (128, 128))
    expected = Fp8Dequantize(None)._dequantize_one(values, scales, output_dtype=dtype)
    ours = dequantize_fp8(as_numpy(values), scales.numpy(), (128, 128))
    np.testing.assert_array_equal(ours.astype(as_numpy(expected).dtype), as_numpy(expected))


@pytest.mark.parametrize("shape", [(200, 300), (576, 7168 // 8), (1, 129), (3, 130, 257)])
def test_fp8_dequantize_ragged_edges_equal_transformers(shape) -> None:
    _, values, scales = random_fp8(shape, (128, 128))
    expected = _dequantize_fp8_weight(values, scales, [128, 128], torch.float32)
    ours = dequantize_fp8(as_numpy(values), scales.numpy(), (128, 128))
    np.testing.assert_array_equal(ours, expected.numpy())


def test_fp8_quantize_bytes_equal_transformers() -> None:
    weight = torch.randn(640, 512, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    weight[:128, :128] = 0  # an all-zero block keeps scale 1
    values, scales = reference_quantize(weight)
    ours, our_scales = quantize_fp8(as_numpy(weight), (128, 128))
    assert ours.tobytes() == as_numpy(values).tobytes()
    assert our_scales.tobytes() == scales.numpy().tobytes()


def test_fp8_quantize_ragged_equals_transformers_on_the_padded_weight() -> None:
    weight, values, scales = random_fp8((200, 300), (128, 128), seed=4)
    ours, our_scales = quantize_fp8(as_numpy(weight), (128, 128))
    assert ours.tobytes() == as_numpy(values).tobytes()
    assert our_scales.tobytes() == scales.numpy().tobytes()


def test_fp8_quantize_then_dequantize_within_one_fp8_step() -> None:
    weight = np.random.default_rng(5).standard_normal((300, 260)).astype(np.float32)
    weight[5, 7] = 40.0  # one large value in a block
    values, scales = quantize_fp8(weight, (128, 128))
    back = dequantize_fp8(values, scales, (128, 128))
    per_block = np.repeat(np.repeat(scales, 128, 0), 128, 1)[:300, :260]
    # E4M3 has 3 mantissa bits: a step is 2**(e-3) of the scaled value, at most 32 below 448
    step = np.maximum(
        2.0 ** (np.floor(np.log2(np.maximum(np.abs(weight / per_block), 2**-6))) - 3), 2**-9
    )
    assert np.all(np.abs(back - weight) <= step * per_block)


def test_mxfp4_equals_transformers() -> None:
    rng = np.random.default_rng(6)
    blocks = rng.integers(0, 256, (3, 10, 4, 16), dtype=np.uint8)
    scales = rng.integers(110, 140, (3, 10, 4), dtype=np.uint8)
    scales[0, 0, 0], scales[1, 1, 1] = 0, 254  # the extremes E8M0 holds
    for dtype in (torch.bfloat16, torch.float32):
        expected = convert_moe_packed_tensors(
            torch.from_numpy(blocks), torch.from_numpy(scales), dtype=dtype
        )
        node = MXFP4DequantNode(
            MemorySource(blocks), MemorySource(scales), as_numpy(expected).dtype, "mxfp4", "e"
        )
        assert node.shape == tuple(expected.shape)
        full = (range(3), range(128), range(10))
        # scale 254 times FP4's 6 is beyond float32: inf, as transformers gives, said once
        with pytest.warns(suture.SutureWarning, match=r"Tensor 'e': .* inf or NaN .* 2\*\*127"):
            np.testing.assert_array_equal(node.read(full), as_numpy(expected))
        part = (range(1, 3), np.array([5, 70, 33, 127]), range(9, 2, -3))
        np.testing.assert_array_equal(
            node.read(part), as_numpy(expected)[1:3][:, [5, 70, 33, 127]][:, :, 9:2:-3]
        )


# --- suture.open(dequantize=True) -------------------------------------------------------


def fp8_folder(folder: Path, shards=None, block=(128, 128)):
    """A folder with two FP8 weights (one ragged), a norm, and the bfloat16 originals."""
    original, values, scales = random_fp8((300, 260), block, seed=1)
    original2, values2, scales2 = random_fp8((256, 128), block, seed=2)
    norm = torch.ones(260, dtype=torch.bfloat16)
    tensors = {
        "model.a.weight": values,
        "model.a.weight_scale_inv": scales,
        "model.b.weight": values2,
        "model.b.weight_scale_inv": scales2,
        "model.norm.weight": norm,
    }
    write_folder(folder, tensors, fp8_config(block), shards=shards)
    expected = {
        "model/a/weight": _dequantize_fp8_weight(values, scales, list(block), torch.float32),
        "model/b/weight": _dequantize_fp8_weight(values2, scales2, list(block), torch.float32),
    }
    return folder, expected


@pytest.mark.parametrize("shards", [None, 3])
def test_open_dequantize_fp8_folder(tmp_path: Path, shards) -> None:
    folder, expected = fp8_folder(tmp_path / "m", shards=shards)
    stored = suture.open(folder)
    assert "model/a/weight_scale_inv" in stored.paths()
    assert stored["model/a/weight"].dtype == ml_dtypes.float8_e4m3fn
    ckpt = suture.open(folder, dequantize=True)
    assert sorted(ckpt.paths()) == ["model/a/weight", "model/b/weight", "model/norm/weight"]
    for path, reference in expected.items():
        leaf = ckpt[path]
        assert leaf.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(leaf.read(), reference.numpy().astype(ml_dtypes.bfloat16))
    as_float32 = suture.open(folder, dequantize=True, dequantize_dtype="float32")
    np.testing.assert_array_equal(
        as_float32["model/a/weight"][130:290:3, 7:250].read(),
        expected["model/a/weight"].numpy()[130:290:3, 7:250],
    )
    np.testing.assert_array_equal(
        as_float32["model/a/weight"][[299, 0, 140], ::-1].read(),
        expected["model/a/weight"].numpy()[[299, 0, 140], ::-1],
    )


def test_a_row_block_reads_its_share_of_weight_and_scales(tmp_path: Path) -> None:
    _, values, scales = random_fp8((4096, 2048), (128, 128), seed=7)
    folder = write_folder(
        tmp_path / "m",
        {"w.weight": values, "w.weight_scale_inv": scales},
        fp8_config(),
    )
    leaf = suture.open(folder, dequantize=True)["w/weight"]
    with suture.count_bytes_read() as counter:
        block = leaf[1024:1280].read()
    share = 256 * 2048 + 2 * 16 * 4  # 256 rows of FP8, 2 block rows of float32 scales
    assert share <= counter.bytes <= share * 1.02
    np.testing.assert_array_equal(
        block,
        _dequantize_fp8_weight(values[1024:1280], scales[8:10], [128, 128], torch.float32)
        .numpy()
        .astype(ml_dtypes.bfloat16),
    )


def test_ue8m0_scales(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    values = torch.from_numpy(
        rng.standard_normal((200, 130))
        .astype(np.float32)
        .astype(ml_dtypes.float8_e4m3fn)
        .view(np.uint8)
    ).view(torch.float8_e4m3fn)
    exponents = rng.integers(120, 135, (2, 2), dtype=np.uint8)
    as_e8m0 = torch.from_numpy(exponents).view(torch.float8_e8m0fnu)
    write_folder(
        tmp_path / "m",
        {
            "w.weight": values,
            "w.weight_scale_inv": as_e8m0,
            "v.weight": values.clone(),
            "v.weight_scale_inv": torch.from_numpy(exponents.copy()),
        },
        fp8_config(scale_fmt="ue8m0"),
    )
    ckpt = suture.open(tmp_path / "m", dequantize=True, dequantize_dtype="float32")
    # transformers' dequantization reads uint8 scales as 2**(s-127); e8m0 converts exactly
    expected = Fp8Dequantize(None)._dequantize_one(
        torch.nn.functional.pad(values.float(), (0, 126, 0, 56)).to(torch.float8_e4m3fn),
        torch.from_numpy(exponents),
        output_dtype=torch.float32,
    )[:200, :130]
    np.testing.assert_array_equal(ckpt["w/weight"].read(), expected.numpy())
    np.testing.assert_array_equal(ckpt["v/weight"].read(), expected.numpy())
    assert (2.0 ** (exponents.astype(np.float64) - 127) == as_e8m0.float().numpy()).all()


def test_open_dequantize_mxfp4_folder(tmp_path: Path) -> None:
    rng = np.random.default_rng(9)
    blocks = rng.integers(0, 256, (2, 64, 2, 16), dtype=np.uint8)
    scales = rng.integers(115, 135, (2, 64, 2), dtype=np.uint8)
    bias = torch.zeros(2, 64, dtype=torch.bfloat16)
    write_folder(
        tmp_path / "m",
        {
            "model.layers.0.mlp.experts.gate_up_proj_blocks": torch.from_numpy(blocks),
            "model.layers.0.mlp.experts.gate_up_proj_scales": torch.from_numpy(scales),
            "model.layers.0.mlp.experts.gate_up_proj_bias": bias,
        },
        {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]},
    )
    ckpt = suture.open(tmp_path / "m", dequantize=True)
    assert sorted(ckpt.paths()) == [
        "model/layers/0/mlp/experts/gate_up_proj",
        "model/layers/0/mlp/experts/gate_up_proj_bias",
    ]
    expected = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales))
    leaf = ckpt["model/layers/0/mlp/experts/gate_up_proj"]
    assert leaf.shape == (2, 64, 64) and leaf.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(leaf.read(), as_numpy(expected))
    np.testing.assert_array_equal(leaf[1, 33:40].read(), as_numpy(expected)[1, 33:40])


# --- every command -------------------------------------------------------------------------


def cli(*args: str):
    from typer.testing import CliRunner

    from suture.cli import app

    return CliRunner().invoke(app, list(args))


def test_inspect_says_quantized_and_how_to_dequantize(tmp_path: Path) -> None:
    folder, _ = fp8_folder(tmp_path / "m")
    result = cli("inspect", str(folder))
    assert result.exit_code == 0, result.output
    assert "Quantized: FP8 E4M3 with 128x128 blocks; tensors shown as stored." in result.output
    assert "--dequantize" in result.output and "weight_scale_inv" in result.output


def test_convert_dequantize_writes_a_bfloat16_folder(tmp_path: Path) -> None:
    folder, expected = fp8_folder(tmp_path / "m", shards=2)
    result = cli(
        "convert", str(folder), str(tmp_path / "out"), "--dequantize", "--format", "safetensors"
    )
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    out = suture.open(tmp_path / "out")
    assert sorted(out.paths()) == ["model/a/weight", "model/b/weight", "model/norm/weight"]
    for path, reference in expected.items():
        assert out[path].dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(
            out[path].read(), reference.numpy().astype(ml_dtypes.bfloat16)
        )
    assert "Quantized" not in cli("inspect", str(tmp_path / "out")).output


def test_plan_and_apply_dequantize(tmp_path: Path) -> None:
    folder, _ = fp8_folder(tmp_path / "m")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("rules:\n  - rename: {pattern: 'model', to: 'params'}\n")
    result = cli("plan", str(recipe), str(folder), "--dequantize", "--json")
    assert result.exit_code == 0, result.output
    outputs = {leaf["path"]: leaf for leaf in json.loads(result.output)["outputs"]}
    leaf = outputs["params/a/weight"]
    assert leaf["operations"] == ["dequantize fp8 128x128 blocks -> bfloat16"]
    assert leaf["bytes_to_read"] == 300 * 260 + 3 * 3 * 4  # FP8 values and float32 scales
    assert leaf["dtype"] == "bfloat16"
    assert "params/a/weight_scale_inv" not in outputs
    applied = cli("apply", str(recipe), str(folder), "-o", str(tmp_path / "out"), "--dequantize")
    assert applied.exit_code == 0, applied.output
    np.testing.assert_array_equal(
        suture.open(tmp_path / "out")["params/a/weight"].read(),
        suture.open(folder, dequantize=True)["model/a/weight"].read(),
    )


def test_merge_of_quantized_models_works_on_dequantized_values(tmp_path: Path) -> None:
    first, expected = fp8_folder(tmp_path / "a")
    second, _ = fp8_folder(tmp_path / "b")
    merged = suture.merge([first, second], "linear", weights=[0.5, 0.5])
    assert "model/a/weight_scale_inv" not in merged
    np.testing.assert_array_equal(
        np.asarray(merged["model"]["a"]["weight"].read(), np.float32),
        expected["model/a/weight"].numpy().astype(ml_dtypes.bfloat16).astype(np.float32),
    )


def test_save_quantize_fp8_block_and_read_back(tmp_path: Path) -> None:
    rng = np.random.default_rng(10)
    tree = {
        "model": {
            "embed_tokens": {"weight": rng.standard_normal((64, 200)).astype(np.float32)},
            "layers": {
                "0": {
                    "mlp": {
                        "up_proj": {"weight": rng.standard_normal((300, 200)).astype(np.float32)},
                        "gate": {"weight": rng.standard_normal((4, 200)).astype(np.float32)},
                    },
                    "input_layernorm": {"weight": np.ones(200, np.float32)},
                }
            },
        },
        "lm_head": {"weight": rng.standard_normal((64, 200)).astype(np.float32)},
    }
    side = tmp_path / "config.json"
    side.write_text(json.dumps({"model_type": "deepseek_v3", "dtype": "float32"}))
    suture.save(
        tree,
        tmp_path / "out",
        format="safetensors",
        quantize="fp8-block",
        extra_files={"config.json": side},
        max_memory="8MiB",
        progress=False,
    )
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["quantization_config"] == {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "modules_to_not_convert": ["model.embed_tokens", "model.layers.0.mlp.gate", "lm_head"],
    }
    out = suture.open(tmp_path / "out")
    weight = tree["model"]["layers"]["0"]["mlp"]["up_proj"]["weight"]
    stored = out["model/layers/0/mlp/up_proj/weight"]
    assert stored.dtype == ml_dtypes.float8_e4m3fn
    padded = np.zeros((384, 256), np.float32)
    padded[:300, :200] = weight
    values, scales = reference_quantize(torch.from_numpy(padded))
    assert stored.read().tobytes() == as_numpy(values)[:300, :200].tobytes()
    assert (
        out["model/layers/0/mlp/up_proj/weight_scale_inv"].read().tobytes()
        == scales.numpy().tobytes()
    )
    for kept in ("model/embed_tokens/weight", "model/layers/0/mlp/gate/weight", "lm_head/weight"):
        assert out[kept].dtype == np.float32
    back = suture.open(tmp_path / "out", dequantize=True, dequantize_dtype="float32")
    np.testing.assert_allclose(
        back["model/layers/0/mlp/up_proj/weight"].read(), weight, rtol=0.07, atol=1e-2
    )


def test_convert_quantize_with_keep_unquantized(tmp_path: Path) -> None:
    folder, _ = fp8_folder(tmp_path / "m")
    assert (
        cli(
            "convert",
            str(folder),
            str(tmp_path / "bf16"),
            "--dequantize",
            "--format",
            "safetensors",
        ).exit_code
        == 0
    )
    result = cli(
        "convert",
        str(tmp_path / "bf16"),
        str(tmp_path / "fp8"),
        "--format",
        "safetensors",
        "--quantize",
        "fp8-block",
        "--keep-unquantized",
        r"^model\.b\.",
    )
    assert result.exit_code == 0, result.output
    out = suture.open(tmp_path / "fp8")
    assert out["model/a/weight"].dtype == ml_dtypes.float8_e4m3fn
    assert out["model/b/weight"].dtype == ml_dtypes.bfloat16
    assert "model/b/weight_scale_inv" not in out
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert config["quantization_config"]["modules_to_not_convert"] == ["model.b"]
    # the FP8 source's own values come back exactly: they are a fixed point of the quantizer
    original = suture.open(folder)
    assert out["model/a/weight"].read().tobytes() == original["model/a/weight"].read().tobytes()


# --- bad input -----------------------------------------------------------------------------


def broken_folder(folder: Path, scale, quantization=None, weight=None) -> Path:
    _, values, _ = random_fp8((300, 260), (128, 128))
    tensors = {
        "model.a.weight": values if weight is None else weight,
        "model.a.weight_scale_inv": scale,
    }
    return write_folder(folder, tensors, quantization or fp8_config())


@pytest.mark.parametrize(
    ("scale", "quantization", "weight", "kind", "words"),
    [
        (
            torch.ones(2, 2),
            None,
            None,
            suture.CorruptCheckpointError,
            ["'model.a.weight_scale_inv'", "(2, 2)", "(3, 3)", "[128, 128]", "do not divide"],
        ),
        (
            torch.ones(3, 3, dtype=torch.int32),
            None,
            None,
            suture.CorruptCheckpointError,
            ["'model.a.weight_scale_inv'", "int32", "expected float32"],
        ),
        (
            torch.ones(3, 3),
            fp8_config((64, 64)),
            None,
            suture.CorruptCheckpointError,
            ["[64, 64]", "(5, 5)", "(3, 3)", "do not divide the weight as the config declares"],
        ),
        (
            torch.ones(3, 3),
            fp8_config((128,)),
            None,
            suture.ConfigMismatchError,
            ["weight_block_size", "[128]", "two positive integers"],
        ),
        (
            torch.ones(3, 3),
            None,
            torch.ones(300, 260, dtype=torch.bfloat16),
            suture.CorruptCheckpointError,
            ["'model.a.weight'", "bfloat16", "expected float8_e4m3fn"],
        ),
    ],
)
def test_bad_scales_and_configs_name_the_tensor(
    tmp_path, scale, quantization, weight, kind, words
) -> None:
    folder = broken_folder(tmp_path / "m", scale, quantization, weight)
    with pytest.raises(kind) as error:
        suture.open(folder, dequantize=True)
    for word in words:
        assert word in str(error.value), (word, str(error.value))
    result = cli("convert", str(folder), str(tmp_path / "out"), "--dequantize")
    assert result.exit_code == 2 and result.output.startswith("Error: ")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("method", ["gptq", "awq", "bitsandbytes", "hqq"])
def test_unknown_quantization_methods_are_not_supported_yet(tmp_path: Path, method) -> None:
    folder = write_folder(
        tmp_path / "m",
        {"model.a.qweight": torch.zeros(4, 4, dtype=torch.int32)},
        {"quant_method": method, "bits": 4},
    )
    assert "model/a/qweight" in suture.open(folder)  # shown as stored
    with pytest.raises(suture.UnsupportedError, match=f"quant_method='{method}'.*not support yet"):
        suture.open(folder, dequantize=True)
    assert "does not support yet" in cli("inspect", str(folder)).output
    result = cli("convert", str(folder), str(tmp_path / "out"), "--dequantize")
    assert result.exit_code == 2 and "not support yet" in result.output


def test_quantized_tensors_without_their_pair_are_refused(tmp_path: Path) -> None:
    _, values, scales = random_fp8((256, 128), (128, 128))
    lone = write_folder(tmp_path / "lone", {"a.weight": values}, fp8_config())
    with pytest.raises(
        suture.CorruptCheckpointError,
        match="'a.weight' is float8_e4m3fn but has no 'a.weight_scale_inv'",
    ):
        suture.open(lone, dequantize=True)
    orphan = write_folder(tmp_path / "orphan", {"a.weight_scale_inv": scales}, fp8_config())
    with pytest.raises(suture.CorruptCheckpointError, match="has no weight 'a.weight'"):
        suture.open(orphan, dequantize=True)
    blocks = write_folder(
        tmp_path / "blocks",
        {"e.down_proj_blocks": torch.zeros(1, 4, 1, 16, dtype=torch.uint8)},
        {"quant_method": "mxfp4"},
    )
    with pytest.raises(
        suture.CorruptCheckpointError, match="'e.down_proj_blocks' has no 'e.down_proj_scales'"
    ):
        suture.open(blocks, dequantize=True)
    wrong = write_folder(
        tmp_path / "wrong",
        {
            "e.down_proj_blocks": torch.zeros(1, 4, 1, 16, dtype=torch.uint8),
            "e.down_proj_scales": torch.zeros(1, 4, 2, dtype=torch.uint8),
        },
        {"quant_method": "mxfp4"},
    )
    with pytest.raises(
        suture.CorruptCheckpointError,
        match=r"shape \(1, 4, 2\); expected uint8 \(E8M0\) of shape \(1, 4, 1\)",
    ):
        suture.open(wrong, dequantize=True)


def test_quantized_values_are_never_cast_or_requantized_without_dequantize(tmp_path: Path) -> None:
    folder, _ = fp8_folder(tmp_path / "m")
    for extra in (["--dtype", "float32"], ["--quantize", "fp8-block"]):
        result = cli("convert", str(folder), str(tmp_path / "out"), *extra)
        assert result.exit_code == 2 and "Add --dequantize" in result.output, result.output
    plain = write_folder(tmp_path / "plain", {"a.weight": torch.zeros(2, 2)})
    with pytest.raises(suture.ArgumentError, match="nothing to dequantize"):
        suture.open(plain, dequantize=True)
    with pytest.raises(suture.ArgumentError, match="Unknown quantize='int4'"):
        suture.save({"w": np.zeros((2, 2), np.float32)}, tmp_path / "x", quantize="int4")


# --- end to end: a tiny DeepSeek-V3 quantized by the reference quantizer ---------------------


def quantize_folder(source: Path, destination: Path, block=(8, 8)) -> Path:
    """An HF folder quantized to FP8 as DeepSeek-V3 is published, by transformers' quantizer:
    every 2-D linear weight but embeddings, norms, the LM head and the router."""
    from safetensors.torch import load_file

    tensors = load_file(source / "model.safetensors")
    quantize = quantizer(block)
    out = {}
    for name, tensor in tensors.items():
        keep = any(word in name for word in ("embed", "norm", "lm_head", "mlp.gate."))
        if tensor.ndim == 2 and name.endswith(".weight") and not keep:
            out.update(quantize._quantize_one(name, tensor))
        else:
            out[name] = tensor
    destination.mkdir()
    save_file(out, destination / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = fp8_config(block)
    (destination / "config.json").write_text(json.dumps(config))
    return destination


def reference_dequantize(source: Path, destination: Path) -> Path:
    """The two-pass route's first pass: a bfloat16 copy by transformers' FP8 dequantization."""
    from safetensors.torch import load_file

    tensors = load_file(source / "model.safetensors")
    out = {}
    for name, tensor in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        scale = tensors.get(name + "_scale_inv")
        out[name] = (
            tensor
            if scale is None
            else Fp8Dequantize(None)._dequantize_one(tensor, scale, output_dtype=torch.bfloat16)
        )
    destination.mkdir()
    save_file(out, destination / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    del config["quantization_config"]
    (destination / "config.json").write_text(json.dumps(config))
    return destination


@pytest.fixture(scope="module")
def tiny_deepseek(tmp_path_factory) -> Path:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        n_routed_experts=4,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=16,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("deepseek") / "bf16"
    DeepseekV3ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    return quantize_folder(folder, folder.parent / "fp8")


def test_tiny_deepseek_one_pass_equals_dequantize_then_convert(tiny_deepseek, tmp_path) -> None:
    fp8 = tiny_deepseek
    assert (
        suture.open(fp8)["model/layers/1/mlp/experts/0/up_proj/weight"].dtype.name
        == "float8_e4m3fn"
    )
    # one pass: the FP8 folder to Orbax, dequantized as it streams
    one = cli(
        "convert",
        str(fp8),
        str(tmp_path / "one"),
        "--dequantize",
        "--format",
        "orbax",
        "--max-memory",
        "1MiB",
    )
    assert one.exit_code == 0, one.output
    # two passes: the reference dequantization writes bfloat16, then a plain conversion
    dequantized = reference_dequantize(fp8, tmp_path / "bf16")
    two = cli("convert", str(dequantized), str(tmp_path / "two"))
    assert two.exit_code == 0, two.output
    assert cli("diff", str(tmp_path / "one"), str(tmp_path / "two"), "--values").exit_code == 0
    # and straight to a Hugging Face folder: the reference's bytes, loadable by transformers
    hf = cli("convert", str(fp8), str(tmp_path / "hf"), "--dequantize", "--format", "safetensors")
    assert hf.exit_code == 0, hf.output
    assert cli("diff", str(tmp_path / "hf"), str(dequantized), "--values").exit_code == 0
    from transformers import AutoModelForCausalLM

    ours = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    reference = AutoModelForCausalLM.from_pretrained(dequantized)
    tokens = torch.tensor([[1, 5, 9, 2, 33, 7, 60, 3]])
    with torch.no_grad():
        assert torch.equal(ours(tokens).logits, reference(tokens).logits)
    assert "quantization_config" not in json.loads((tmp_path / "hf" / "config.json").read_text())


def test_family_recipes_dequantize_a_quantized_source_in_the_same_pass(tmp_path: Path) -> None:
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
    fp8 = quantize_folder(tmp_path / "bf16", tmp_path / "fp8")
    dequantized = reference_dequantize(fp8, tmp_path / "dequantized")
    one = cli("convert", str(fp8), str(tmp_path / "one"), "--recipe", "llama3.1:maxtext")
    assert one.exit_code == 0, one.output
    two = cli("convert", str(dequantized), str(tmp_path / "two"), "--recipe", "llama3.1:maxtext")
    assert two.exit_code == 0, two.output
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
    assert cli("diff", str(tmp_path / "back"), str(dequantized), "--values").exit_code == 0


# --- the dtypes, in both formats -------------------------------------------------------------


def test_float8_and_packed_fp4_dtypes_round_trip_orbax_and_safetensors(tmp_path: Path) -> None:
    import orbax.checkpoint as ocp
    from safetensors.torch import load_file

    values = np.arange(24, dtype=np.float32).reshape(4, 6) / 8
    tree = {
        name: values.astype(getattr(ml_dtypes, name))
        for name in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
    }
    tree["packed_fp4"] = np.arange(32, dtype=np.uint8).reshape(2, 16)  # MXFP4 blocks are U8
    suture.save(tree, tmp_path / "orbax", progress=False)
    restored = ocp.StandardCheckpointer().restore(tmp_path / "orbax")
    suture.save(tree, tmp_path / "t.safetensors", format="safetensors", progress=False)
    by_torch = load_file(tmp_path / "t.safetensors")
    for path in ("orbax", "t.safetensors"):
        opened = suture.open(tmp_path / path)
        for name, value in tree.items():
            assert opened[name].dtype == value.dtype
            assert opened[name].read().tobytes() == value.tobytes()
    for name, value in tree.items():
        assert np.asarray(restored[name]).dtype == value.dtype
        assert np.asarray(restored[name]).tobytes() == value.tobytes()
        assert by_torch[name].view(torch.uint8).numpy().tobytes() == value.tobytes()
    assert str(by_torch["float8_e8m0fnu"].dtype) == "torch.float8_e8m0fnu"
    with pytest.raises(suture.SurgeryError, match="float4_e2m1fn"):
        suture.save(
            {"w": np.zeros(4, ml_dtypes.float4_e2m1fn)},
            tmp_path / "x.safetensors",
            format="safetensors",
            progress=False,
        )


# --- any shape, block and selection ----------------------------------------------------------


@st.composite
def axis_selections(draw, length: int):
    if draw(st.booleans()):
        start = draw(st.integers(0, length - 1))
        stop = draw(st.integers(start + 1, length))
        step = draw(st.integers(1, 3))
        return (
            range(start, stop, step) if draw(st.booleans()) else range(stop - 1, start - 1, -step)
        )
    return np.array(draw(st.lists(st.integers(0, length - 1), min_size=1, max_size=6)))


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 300),
    st.sampled_from([(128, 128), (16, 32), (7, 5), (1, 300)]),
    st.data(),
)
def test_any_slice_of_any_shape_equals_transformers(rows, cols, block, data) -> None:
    rng = np.random.default_rng(rows * 1000 + cols)
    raw = rng.integers(0, 256, (rows, cols), dtype=np.uint8)
    raw[(raw & 0x7F) == 0x7F] = 0x38  # no NaN codes
    scales = rng.random((-(-rows // block[0]), -(-cols // block[1])), dtype=np.float32)
    values = torch.from_numpy(raw).view(torch.float8_e4m3fn)
    expected = _dequantize_fp8_weight(values, torch.from_numpy(scales), list(block), torch.float32)
    node = FP8DequantNode(
        MemorySource(raw.view(ml_dtypes.float8_e4m3fn)),
        MemorySource(scales),
        block,
        np.dtype(np.float32),
        "fp8",
    )
    selection = (data.draw(axis_selections(rows)), data.draw(axis_selections(cols)))
    np.testing.assert_array_equal(node.read(selection), outer_index(expected.numpy(), selection))


# widths in multiples of 128 (see test_transformers_loads_the_fp8_folder_suture_writes)
SERVED_WIDTHS = dict(
    vocab_size=96,
    hidden_size=256,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
)


def _served_fp8(tmp_path: Path, model_class, config, **save_options):
    """A tiny random transformers model saved as `hf`, and `suture convert --quantize
    fp8-block` of it as `fp8`: (the model, the FP8 folder)."""
    pytest.importorskip("accelerate", reason="transformers loads FP8 folders through it")
    torch.manual_seed(0)
    model = model_class(config).eval()
    model.save_pretrained(tmp_path / "hf", **save_options)
    result = cli("convert", str(tmp_path / "hf"), str(tmp_path / "fp8"), "--quantize", "fp8-block")
    assert result.exit_code == 0, result.output
    return model, tmp_path / "fp8"


def test_transformers_loads_the_fp8_folder_suture_writes(tmp_path: Path) -> None:
    """The serving side of --quantize fp8-block: transformers' own FP8 loader (on a CPU it
    dequantizes as it loads) reads the folder, and every weight equals what suture reads
    back dequantized; the logits stay near the unquantized model's.

    The widths are multiples of 128: transformers' load-time dequantization (5.x,
    `Fp8Dequantize._dequantize_one`) derives the block from the scale grid (rows // scale
    rows), which for a ragged edge is not the 128 of the format; its FP8 linear layers
    (`_dequantize_fp8_weight`) and DeepSeek's formula use 128 with a ragged last block, as
    suture does (`test_fp8_dequantize_ragged_edges_equal_transformers`)."""
    config = transformers.LlamaConfig(**SERVED_WIDTHS, tie_word_embeddings=False)
    model, fp8 = _served_fp8(tmp_path, transformers.LlamaForCausalLM, config)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(fp8, dtype=torch.bfloat16).eval()
    ours = suture.open(fp8, dequantize=True, dequantize_dtype="bfloat16")
    stored = suture.open(fp8)
    quantized = [name for name in stored.paths() if name.endswith("weight_scale_inv")]
    assert len(quantized) == 2 * 7  # q, k, v, o, gate, up, down in each layer
    for name, parameter in loaded.state_dict().items():
        path = name.replace(".", "/")
        if path not in ours.paths():
            continue  # buffers transformers makes (rotary frequencies)
        # the tensors kept unquantized are float32 as saved; transformers casts them too
        expected = ours[path].read().astype(ml_dtypes.bfloat16).astype(np.float32)
        got = parameter.to(torch.float32).numpy()
        np.testing.assert_array_equal(got, expected, err_msg=name)
    tokens = torch.tensor([[1, 5, 9, 2, 33, 7, 60, 3]])
    with torch.no_grad():
        reference = model(tokens).logits.float().numpy()
        served = loaded(tokens).logits.float().numpy()
    assert np.max(np.abs(served - reference)) < 0.05 * np.max(np.abs(reference))


def test_fused_experts_stay_in_high_precision_and_are_named_as_not_converted(
    tmp_path: Path,
) -> None:
    """transformers v5's fused experts ((E, 2I, H) gate_up_proj) are not 2-D linear weights:
    they are kept as they are and listed in modules_to_not_convert, so transformers builds
    its plain experts module for them, not the FP8 one that would take them for FP8 values
    without scales."""
    config = transformers.Qwen3MoeConfig(
        **SERVED_WIDTHS, moe_intermediate_size=128, num_experts=4, num_experts_per_tok=2
    )
    _served_fp8(tmp_path, transformers.Qwen3MoeForCausalLM, config, save_original_format=False)
    settings = json.loads((tmp_path / "fp8" / "config.json").read_text())["quantization_config"]
    not_converted = settings["modules_to_not_convert"]
    assert {"model.layers.0.mlp.experts", "model.layers.1.mlp.experts"} <= set(not_converted)
    source, written = suture.open(tmp_path / "hf"), suture.open(tmp_path / "fp8")
    for name in ("gate_up_proj", "down_proj"):
        key = f"model/layers/1/mlp/experts/{name}"
        assert written[key].read().tobytes() == source[key].read().tobytes()
    assert written["model/layers/1/self_attn/q_proj/weight"].dtype == ml_dtypes.float8_e4m3fn
    with torch.device("meta"):
        skeleton = transformers.Qwen3MoeForCausalLM(config)
    fp8 = FineGrainedFP8Config(weight_block_size=(128, 128))
    skeleton = replace_with_fp8_linear(skeleton, not_converted, fp8, pre_quantized=True)
    modules = dict(skeleton.named_modules())
    assert type(modules["model.layers.0.mlp.experts"]).__name__ == "Qwen3MoeExperts"
    assert type(modules["model.layers.0.self_attn.q_proj"]).__name__ == "FP8Linear"
