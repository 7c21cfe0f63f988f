"""Quantized exports in compressed-tensors' formats: W4A16, W8A16, NVFP4A16, FP8_DYNAMIC.

The reference is compressed-tensors 0.20 itself, run here on the same bfloat16 model: the
scales as its ``calculate_qparams`` computes them from each group's min and max (what
llm-compressor's min-max observer gives it; NVFP4's global scale from ``generate_gparam``,
the smallest of the fused q/k/v and gate/up projections', as llm-compressor shares it),
then ``ModelCompressor.compress_model`` and ``update_config``. llm-compressor itself cannot
be installed beside transformers 5.24 (its releases pin transformers <= 5.17 and an older
compressed-tensors), so its ``oneshot`` is not run here. transformers then loads suture's
folder through its compressed-tensors integration.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the reference is compressed-tensors' torch code")
ct = pytest.importorskip("compressed_tensors", reason="the reference (the dev extra)")
# ruff: noqa: E402
import transformers
from compressed_tensors.compressors import BaseCompressor, ModelCompressor
from compressed_tensors.quantization import (
    QuantizationConfig,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam
from safetensors.torch import load_file

import suture
from suture._quant.ct_scheme import ct_scheme

SCHEMES = [("W4A16", None), ("W8A16", None), ("NVFP4A16", None), ("FP8_DYNAMIC", None)]
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny bfloat16 Llama, with a zero group, a -0 and tiny negatives in its weights."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=128,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        q = model.model.layers[0].self_attn.q_proj.weight
        q[0, :128] = 0
        q[1, 3] = -0.0
        q[2, :8] = -1e-6  # next to larger values: NVFP4 rounds them to -0
        model.model.layers[1].mlp.up_proj.weight.mul_(8)  # gate/up scales differ
    folder = tmp_path_factory.mktemp("ct") / "bf16"
    model.save_pretrained(folder)
    return folder


def reference(folder: Path, name: str, group_size: int | None, out: Path) -> dict:
    """compressed-tensors' own route: its tensors (name -> torch tensor) and config."""
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    scheme = preset_name_to_scheme(name, ["Linear"])
    if group_size is not None:
        scheme.weights.group_size = group_size
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    apply_quantization_config(model, config, show_progress=False)
    modules = {n: m for n, m in model.named_modules() if getattr(m, "quantization_scheme", None)}
    global_scales = {
        n: generate_gparam(m.weight.amin(), m.weight.amax())
        for n, m in modules.items()
        if m.quantization_scheme.weights.strategy == "tensor_group"
    }
    for fused in FUSED:
        for n in [n for n in global_scales if n.endswith(fused[0])]:
            names = [n[: -len(fused[0])] + f for f in fused]
            shared = torch.stack([global_scales[x] for x in names]).min().reshape(1)
            global_scales.update(dict.fromkeys(names, shared))
    with torch.no_grad():
        for n, m in modules.items():
            args, w = m.quantization_scheme.weights, m.weight
            if args.group_size:
                grouped = w.unflatten(-1, (w.shape[-1] // args.group_size, args.group_size))
                low, high = grouped.amin(-1), grouped.amax(-1)
            else:
                low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
            shared = global_scales.get(n)
            if shared is not None:
                m.weight_global_scale.copy_(shared)
            scale, zero = calculate_qparams(low, high, args, global_scale=shared)
            m.weight_scale.copy_(scale)
            m.weight_zero_point.copy_(zero)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    out.mkdir()
    (out / "config.json").write_text("{}")
    compressor.update_config(str(out))
    tensors = {k: v for k, v in model.state_dict().items()}
    return {"tensors": tensors, "config": json.loads((out / "config.json").read_text())}


def stored(folder: Path) -> dict:
    tensors: dict = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def raw(tensor) -> bytes:
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


@pytest.mark.parametrize(("name", "group_size"), [*SCHEMES, ("w4a16", 32)])
def test_export_bytes_and_config_equal_compressed_tensors(
    model_folder: Path, tmp_path: Path, name: str, group_size: int | None
) -> None:
    out = tmp_path / "out"
    suture.convert(
        model_folder, out, quantize=name, group_size=group_size, max_memory="2MiB", progress=False
    )
    expected = reference(model_folder, name.upper(), group_size, tmp_path / "ref")
    written = stored(out)
    assert sorted(written) == sorted(expected["tensors"])
    for key, tensor in expected["tensors"].items():
        assert written[key].dtype == tensor.dtype, key
        assert written[key].shape == tensor.shape, key
        assert raw(written[key]) == raw(tensor), key
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    ignore = config.pop("ignore")
    assert {**config, "ignore": ["lm_head"]} == {**expected["config"]["quantization_config"]}
    assert sorted(ignore) == ["lm_head", "model.embed_tokens"]  # the 2-D weights kept


def test_nvfp4_global_scale_is_shared_by_fused_projections(
    model_folder: Path, tmp_path: Path
) -> None:
    suture.convert(model_folder, tmp_path / "out", quantize="nvfp4a16", progress=False)
    written = stored(tmp_path / "out")
    layer = "model.layers.1"
    blocks = dict(zip(FUSED, ("self_attn", "mlp"), strict=True))
    scale = {
        p: written[f"{layer}.{blocks[f]}.{p}.weight_global_scale"].item() for f in FUSED for p in f
    }
    assert scale["q_proj"] == scale["k_proj"] == scale["v_proj"]
    assert scale["gate_proj"] == scale["up_proj"] != scale["q_proj"]
    assert written[f"{layer}.self_attn.o_proj.weight_global_scale"].dtype == torch.float32
    codes = written["model.layers.0.self_attn.q_proj.weight_packed"][2, :4].numpy()
    assert ((codes & 0xF) == 8).all() and ((codes >> 4) == 8).all()  # -0: sign bit, zero


# The logits' relative RMS error from the unquantized model's. A weight's rounding error is
# up to half a step: 1/255 of a group's range for INT8, 1/15 for INT4, 2**-4 of a value for
# FP8 E4M3, and E2M1's steps are coarser still; on this random model, whose 14 projections
# each add their error to the residual stream, the logits' error is about 2.6 times a
# projection's (measured in bfloat16: W8A16 0.022, FP8_DYNAMIC 0.099, W4A16 0.32, NVFP4A16 0.27).
TOLERANCE = {"W8A16": 0.04, "FP8_DYNAMIC": 0.2, "W4A16": 0.6, "NVFP4A16": 0.6}


@pytest.mark.parametrize(("name", "group_size"), SCHEMES)
def test_transformers_loads_each_export(
    model_folder: Path, tmp_path: Path, name: str, group_size: int | None
) -> None:
    out = tmp_path / "out"
    suture.convert(model_folder, out, quantize=name, progress=False)
    tokens = torch.arange(32).reshape(1, 32)
    plain = transformers.AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.bfloat16)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    with torch.no_grad():
        want, got = plain(tokens).logits.float(), loaded(tokens).logits.float()
    error = float((got - want).norm() / want.norm())
    print(f"{name}: relative RMS error of the logits {error:.4f}")
    assert error < TOLERANCE[name], error
    assert not torch.equal(got, want)  # it did quantize
    # the weights transformers loaded are compressed-tensors' decompression of suture's
    scheme = preset_name_to_scheme(name, ["Linear"])
    compressor = BaseCompressor.load_from_registry(scheme_format(name))
    written = stored(out)
    module = "model.layers.0.self_attn.q_proj"
    state = {k[len(module) + 1 :]: v for k, v in written.items() if k.startswith(module + ".")}
    weight = compressor.decompress(state, scheme)["weight"]
    linear = loaded.get_submodule(module)
    assert raw(linear.weight.to(weight.dtype)) == raw(weight)


def scheme_format(name: str) -> str:
    return ct_scheme(name, None).format


def test_cli_quantize_with_group_size(model_folder: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from suture.cli import app

    out = tmp_path / "out"
    args = ["convert", str(model_folder), str(out), "--quantize", "w8a16", "--group-size", "32"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["config_groups"]["group_0"]["weights"]["group_size"] == 32
    assert stored(out)["model.layers.0.mlp.down_proj.weight_scale"].shape == (256, 16)


@pytest.mark.parametrize(("name", "group_size"), [s for s in SCHEMES if s[0] != "FP8_DYNAMIC"])
def test_suture_reads_its_export_as_compressed_tensors_decompresses_it(
    model_folder: Path, tmp_path: Path, name: str, group_size: int | None
) -> None:
    """compressed-tensors' decompressor computes in the scales' dtype (bfloat16 here): suture's
    bfloat16 read is the same bytes."""
    out = tmp_path / "out"
    suture.convert(model_folder, out, quantize=name, progress=False)
    back = suture.open(out, dequantize=True, dequantize_dtype="bfloat16")
    scheme = preset_name_to_scheme(name, ["Linear"])
    compressor = BaseCompressor.load_from_registry(scheme_format(name))
    written = stored(out)
    for module in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
        state = {k[len(module) + 1 :]: v for k, v in written.items() if k.startswith(module + ".")}
        expected = compressor.decompress(state, scheme)["weight"]
        assert expected.dtype == torch.bfloat16
        got = back[module.replace(".", "/") + "/weight"].read()
        assert got.tobytes() == expected.view(torch.int16).numpy().tobytes(), module


def test_fp8_dynamic_export_is_not_read_back_dequantized_yet(model_folder: Path, tmp_path: Path):
    """suture writes FP8_DYNAMIC (compressed-tensors' float-quantized format) but does not read
    it dequantized: a clear refusal naming the format, not a wrong value."""
    out = tmp_path / "out"
    suture.convert(model_folder, out, quantize="FP8_DYNAMIC", progress=False)
    with pytest.raises(suture.UnsupportedError, match="format 'float-quantized'"):
        suture.open(out, dequantize=True)
