"""Kimi K2.x on MaxText's DeepSeek tree (``kimi-k2:maxtext``): INT4 experts in one pass.

Kimi K2-Thinking, K2.5 and K2.6 publish DeepSeek-V3's architecture with their routed experts
packed by compressed-tensors (INT4, symmetric, a bfloat16 scale per 32 inputs); K2.5 and K2.6
keep the causal LM under ``language_model.`` beside a vision tower, and the quantization config
in ``text_config``. Tiny random DeepseekV3 models (save_pretrained) get their experts packed by
compressed-tensors' own compressor; converting the packed folder in one pass must equal
converting the folder its decompressor gives, both directions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors", reason="the dev extra")
# ruff: noqa: E402

from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from suture import families
from suture.cli import app
from suture.families._convert import convert_with_recipe

TEXT = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    first_k_dense_replace=1,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    q_lora_rank=32,
    kv_lora_rank=16,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)
WEIGHTS = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=32)
# as Kimi-K2-Thinking's config.json has it: the routed experts only
QUANTIZATION = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": WEIGHTS.model_dump(),
            "input_activations": None,
            "output_activations": None,
        }
    },
    "ignore": [
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|down)_proj.*",
    ],
    "kv_cache_scheme": None,
}
EXPERT = ".mlp.experts."


def cli(*args: str):
    return CliRunner().invoke(app, [str(arg) for arg in args])


def ok(*args: str) -> str:
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return result.output


def convert(source: Path, out: Path) -> None:
    convert_with_recipe(source, out, "kimi-k2:maxtext", dequantize=True, progress=False)


def int4_experts(weights: dict) -> tuple[dict, dict]:
    """`weights` with each routed expert packed by compressed-tensors (bfloat16 scales), and
    with each expert as its decompressor gives it back (bfloat16)."""
    scheme = QuantizationScheme(targets=["Linear"], weights=WEIGHTS)
    packed, plain = {}, {}
    for name, weight in weights.items():
        if EXPERT not in name:
            packed[name] = plain[name] = weight
            continue
        grouped = weight.float().reshape(weight.shape[0], -1, 32)
        scale = (grouped.abs().amax(-1) / 7).clamp(min=1e-4).to(torch.bfloat16)
        compressed = PackedQuantizationCompressor.compress(
            {"weight": weight.float(), "weight_scale": scale}, scheme
        )
        module = name[: -len(".weight")]
        packed.update({f"{module}.{key}": value for key, value in compressed.items()})
        as_float = {**compressed, "weight_scale": compressed["weight_scale"].float()}
        value = PackedQuantizationCompressor.decompress(as_float, scheme)["weight"]
        plain[name] = value.to(torch.bfloat16)
    return packed, plain


def write(folder: Path, tensors: dict, config: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors")
    return folder


@pytest.fixture(scope="module")
def kimi(tmp_path_factory) -> dict[str, Path]:
    """A K2-Thinking-like folder (INT4 experts, model_type kimi_k2), the folder
    compressed-tensors' decompressor gives, and a K2.5-like multimodal folder of the same
    language model, with a vision tower made by transformers' Kimi_K25 model."""
    root = tmp_path_factory.mktemp("kimi")
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**TEXT))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or "bias" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    model.to(torch.bfloat16).save_pretrained(root / "bf16")
    weights = load_file(root / "bf16" / "model.safetensors")
    assert any(EXPERT in name and name.endswith(".gate_proj.weight") for name in weights)
    saved = json.loads((root / "bf16" / "config.json").read_text())
    kimi_config = {**saved, "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"]}
    packed, plain = int4_experts(weights)
    folders = {
        "int4": write(root / "int4", packed, {**kimi_config, "quantization_config": QUANTIZATION}),
        "plain": write(root / "plain", plain, kimi_config),
    }
    vision = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        pos_emb_height=4,
        pos_emb_width=4,
        pos_emb_time=2,
    )
    config = transformers.Kimi_K25Config(text_config=TEXT, vision_config=vision)
    multimodal = transformers.Kimi_K25ForConditionalGeneration(config).to(torch.bfloat16)
    # as published (transformers' kimi_k25 conversion mapping reads these names back)
    tower = {
        name.removeprefix("model."): value.detach().clone()
        for name, value in multimodal.state_dict().items()
        if name.startswith(("model.vision_tower.", "model.mm_projector."))
    }
    assert tower
    published = {**tower, **{f"language_model.{name}": value for name, value in packed.items()}}
    k25 = config.to_dict()
    k25["text_config"] = {**kimi_config, "quantization_config": QUANTIZATION}
    k25["tie_word_embeddings"] = False
    folders["k25"] = write(root / "k25", published, k25)
    return folders


def test_kimi_k2_is_a_built_in_name_of_the_deepseek3_table() -> None:
    names = families.recipe_names()
    assert {"kimi-k2:maxtext", "kimi-k2:maxtext-unscanned"} <= set(names)
    assert families.get_recipe("kimi-k2:maxtext").leaves == (
        families.get_recipe("deepseek3:maxtext").leaves
    )


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_int4_experts_convert_in_one_pass_equal_to_the_decompressed_folder(
    kimi, tmp_path: Path, layout: str
) -> None:
    recipe = f"kimi-k2:{layout}"
    ok("convert", kimi["int4"], tmp_path / "one", "--recipe", recipe, "--dequantize")
    ok("convert", kimi["plain"], tmp_path / "two", "--recipe", recipe)
    ok("diff", tmp_path / "one", tmp_path / "two", "--values")
    ok("convert", tmp_path / "one", tmp_path / "back", "--recipe", recipe, "--reverse")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "kimi_k2"
    ok("diff", tmp_path / "back", kimi["plain"], "--values")
    back = load_file(tmp_path / "back" / "model.safetensors")
    assert all(value.dtype == torch.bfloat16 for value in back.values())
    assert not any(name.endswith(("weight_packed", "weight_scale")) for name in back)


def test_a_packed_expert_read_unpacked_would_differ(kimi, tmp_path: Path) -> None:
    """The test can fail: the plain folder's experts are not the INT4 folder's packed words."""
    plain = load_file(kimi["plain"] / "model.safetensors")
    packed = load_file(kimi["int4"] / "model.safetensors")
    name = "model.layers.1.mlp.experts.2.down_proj"
    assert packed[f"{name}.weight_packed"].dtype == torch.int32
    assert packed[f"{name}.weight_packed"].shape == (64, 4)  # 32 inputs, 8 a word
    assert plain[f"{name}.weight"].shape == (64, 32)


def test_k25_language_model_converts_and_the_vision_tower_is_left_out_and_said_so(
    kimi, tmp_path: Path
) -> None:
    ok("convert", kimi["int4"], tmp_path / "text", "--recipe", "kimi-k2:maxtext", "--dequantize")
    with pytest.warns(families.LeftOutWarning, match=r"vision_tower\..* and \d+ more; mm_proj"):
        convert(kimi["k25"], tmp_path / "mm")
    ok("diff", tmp_path / "mm", tmp_path / "text", "--values")

    # back, published names; --like gives the vision tower back and the config loses its INT4
    ok("convert", tmp_path / "mm", tmp_path / "back", "--recipe", "kimi-k2:maxtext", "--reverse")
    back = load_file(tmp_path / "back" / "model.safetensors")
    plain = load_file(kimi["plain"] / "model.safetensors")
    assert back.keys() == {f"language_model.{name}" for name in plain}
    for name, value in plain.items():
        assert torch.equal(back[f"language_model.{name}"], value), name
    ok(
        "convert",
        tmp_path / "mm",
        tmp_path / "full",
        "--recipe",
        "kimi-k2:maxtext",
        "--reverse",
        "--like",
        kimi["k25"],
    )
    full = load_file(tmp_path / "full" / "model.safetensors")
    source = load_file(kimi["k25"] / "model.safetensors")
    for name, value in source.items():
        if name.startswith(("vision_tower.", "mm_projector.")):
            assert torch.equal(full[name], value), name
    assert {name for name in full if not name.startswith("language_model.")} == {
        name for name in source if not name.startswith("language_model.")
    }
    config = json.loads((tmp_path / "full" / "config.json").read_text())
    assert config["model_type"] == "kimi_k25"
    assert "quantization_config" not in config["text_config"]


def test_k25_in_transformers_v5_names_converts_the_same(kimi, tmp_path: Path) -> None:
    """transformers v5 writes K2.5 as model.language_model., model.vision_tower., lm_head."""
    source = load_file(kimi["k25"] / "model.safetensors")
    renamed = {}
    for name, value in source.items():
        if name.startswith("language_model.model."):
            name = "model.language_model." + name.removeprefix("language_model.model.")
        elif name.startswith("language_model."):
            name = name.removeprefix("language_model.")
        else:
            name = "model." + name
        renamed[name] = value
    config = json.loads((kimi["k25"] / "config.json").read_text())
    v5 = write(tmp_path / "v5", renamed, config)
    with pytest.warns(families.LeftOutWarning, match="vision_tower"):
        convert(kimi["k25"], tmp_path / "published")
    with pytest.warns(families.LeftOutWarning, match=r"model\.vision_tower"):
        convert(v5, tmp_path / "ours")
    ok("diff", tmp_path / "ours", tmp_path / "published", "--values")


@pytest.mark.parametrize("causal", [[1], "language_model.", [""]])
def test_causal_lm_prefixes_outside_the_schema_are_an_error(causal) -> None:
    from suture.families._tables import _parse

    leaf = {"maxtext": "decoder/layers/w", "hf": "model.layers.{layer}.w"}
    language_model = {"config": "text_config", "prefixes": ["x."], "causal_lm_prefixes": causal}
    data = {"follows": "x", "description": "x", "source_file": "mine.yaml", "leaves": [leaf]}
    with pytest.raises(families.RecipeFormatError, match="causal_lm_prefixes"):
        _parse("mine", {**data, "language_model": language_model}, True)
