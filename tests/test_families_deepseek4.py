"""DeepSeek-V4: the deepseek4 recipes on a tiny random DeepseekV4ForCausalLM of transformers,
its tensors named as DeepSeek publishes them (``embed.weight``, ``layers.N.attn.kv_norm.weight``).

Seven layers: two sliding-window ones, then CSA (even) and HCA (odd); the first three routed by
hash. To MaxText the tree has the paths and shapes MaxText 0.2.5's converter writes for
``deepseek4-284b`` (``bench/families.py --maxtext-families --families deepseek4`` compares it
leaf by leaf, and MaxText's model on it with transformers' logits); back, both layouts give the folder bit for bit. The published FP8 layout (UE8M0
``.scale``, FP4 experts) converts dequantized in the same pass, equal to dequantizing first;
its multi-token-prediction layer is left out, said so, and given back by ``--like``.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import suture
from suture import ConfigMismatchError

LAYERS = 7
RATIOS = [0, 0] + [4 if i % 2 == 0 else 128 for i in range(2, LAYERS)]
# transformers' save_pretrained names, and the names DeepSeek publishes
PUBLISHED = {
    "model.embed_tokens.weight": "embed.weight",
    "model.norm.weight": "norm.weight",
    "model.hc_head.hc_fn": "hc_head_fn",
    "model.hc_head.hc_base": "hc_head_base",
    "model.hc_head.hc_scale": "hc_head_scale",
}


def _published(name: str) -> str:
    name = PUBLISHED.get(name, name.replace("model.layers.", "layers.", 1))
    return name.replace(".attn.norm.", ".attn.kv_norm.")  # the attention's, not a compressor's


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The tiny model in the published names, float32, tid2eid as int32 (as published)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.numpy import load_file, save_file

    torch.manual_seed(0)
    config = transformers.DeepseekV4Config(
        vocab_size=64,
        hidden_size=64,
        moe_intermediate_size=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        q_lora_rank=16,
        n_routed_experts=4,
        num_experts_per_tok=2,
        o_groups=2,
        o_lora_rank=16,
        index_n_heads=4,
        index_head_dim=16,
        index_topk=4,
        sliding_window=8,
        compress_ratios=RATIOS,
        qk_rope_head_dim=8,
        num_hash_layers=3,
    )
    model = transformers.DeepseekV4ForCausalLM(config)
    with torch.no_grad():  # norms, biases, sinks and hyper-connection scales off their init
        for name, parameter in model.named_parameters():
            if any(word in name for word in ("norm", "bias", "scale", "base", "sink")):
                parameter.add_(torch.randn_like(parameter) * 0.1)
    root = tmp_path_factory.mktemp("deepseek4")
    model.save_pretrained(root / "saved")
    tensors = {}
    for name, value in load_file(root / "saved" / "model.safetensors").items():
        if name.endswith("tid2eid"):
            rows = np.random.default_rng(len(tensors)).random((value.shape[0], 4))
            value = np.argsort(rows, axis=1)[:, : value.shape[1]].astype(np.int32)  # distinct
        tensors[_published(name)] = value
    out = root / "hf"
    out.mkdir()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text((root / "saved" / "config.json").read_text())
    return out


def _tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


@pytest.fixture(scope="module")
def scanned(folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mt") / "scanned"
    suture.convert(folder, out, recipe="deepseek4:maxtext", progress=False)
    return out


def test_scanned_tree_has_maxtexts_paths_and_shapes(scanned) -> None:
    """The places and shapes MaxText 0.2.5's converter gives deepseek4-284b (this model's sizes):
    three unscanned hash layers, then scanned_blocks of HCA (layers_0) and CSA (layers_1)."""
    flat = suture.open(scanned).flat()
    p, blocks = "params/params/decoder/", "params/params/decoder/scanned_blocks/"
    expected = {
        f"{p}hc_head/hc_fn": (256, 4),
        f"{p}layers_0/mhc_attention/res_beta": (4, 4),
        f"{p}layers_0/mhc_attention/mhc_norm/scale": (256,),
        f"{p}layers_2/self_attention/csa_compressor/indexer/q_proj/kernel": (16, 64),
        f"{p}layers_2/self_attention/o_a_proj/kernel": (2, 64, 16),
        f"{blocks}layers_0/mhc_mlp/res_alpha": (256, 2, 16),
        f"{blocks}layers_0/mhc_mlp/pre_alpha_scale": (1, 2),
        f"{blocks}layers_0/self_attention/hca_compressor/position_bias": (128, 2, 32),
        f"{blocks}layers_1/self_attention/csa_compressor/position_bias": (4, 2, 64),
        f"{blocks}layers_1/self_attention/wq_b/kernel": (16, 2, 4, 32),
        f"{blocks}layers_1/self_attention/wkv/kernel": (64, 2, 1, 32),
        f"{blocks}layers_1/self_attention/sinks": (4, 2),
        f"{blocks}layers_1/mlp/MoeBlock_0/wi_0": (4, 2, 64, 32),
        f"{blocks}layers_1/mlp/MoeBlock_0/gate/kernel": (64, 2, 4),
        "params/MoEBiasVar/decoder/scanned_blocks/layers_0/mlp/MoeBlock_0/gate/bias": (2, 4),
        "params/Tid2EidVar/decoder/layers_2/mlp/MoeBlock_0/tid2eid": (64, 2),
    }
    assert {path: tuple(flat[path].shape) for path in expected} == expected
    assert flat["params/Tid2EidVar/decoder/layers_0/mlp/MoeBlock_0/tid2eid"].dtype == np.int32
    assert not any(
        "compressor" in path for path in flat if "decoder/layers_0/self_attention" in path
    )
    assert not any("hca_compressor" in path for path in flat if "/layers_1/" in path)
    assert not any("params/params/decoder/layers_3" in path for path in flat)


def test_hyper_connections_split_into_three_and_mhc_norm_is_ones(folder, scanned) -> None:
    hf, flat = _tensors(folder), suture.open(scanned)
    fn, base = hf["layers.5.hc_ffn_fn"], hf["layers.5.hc_ffn_base"]  # HCA: block 1, layers_0
    scale = hf["layers.5.hc_ffn_scale"]
    mhc = "params/params/decoder/scanned_blocks/layers_0/mhc_mlp/"

    def block(name):
        return flat[mhc + name].read()[:, 1]

    np.testing.assert_array_equal(block("pre_alpha"), fn[:4].T)
    np.testing.assert_array_equal(block("post_alpha"), fn[4:8].T)
    np.testing.assert_array_equal(block("res_alpha"), fn[8:].T)
    np.testing.assert_array_equal(block("post_beta"), base[4:8])
    np.testing.assert_array_equal(block("res_beta"), base[8:].reshape(4, 4))
    np.testing.assert_array_equal(block("res_alpha_scale"), scale[2:3])
    np.testing.assert_array_equal(flat[mhc + "mhc_norm/scale"].read(), np.ones((256, 2)))
    wo_a = hf["layers.5.attn.wo_a.weight"].reshape(2, 16, 64).transpose(0, 2, 1)
    kernel = flat["params/params/decoder/scanned_blocks/layers_0/self_attention/o_a_proj/kernel"]
    np.testing.assert_array_equal(kernel.read()[:, 1], wo_a)


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_round_trip_is_bit_exact(folder, tmp_path, layout) -> None:
    mt, back = tmp_path / "mt", tmp_path / "back"
    suture.convert(folder, mt, recipe=f"deepseek4:{layout}", progress=False)
    suture.convert(
        mt,
        back,
        recipe=f"deepseek4:{layout}",
        reverse=True,
        config=folder / "config.json",
        format="safetensors",
        progress=False,
    )
    original, returned = _tensors(folder), _tensors(back)
    assert sorted(returned) == sorted(original)
    for name, value in original.items():
        assert returned[name].dtype == value.dtype, name
        assert returned[name].tobytes() == value.tobytes(), name


def test_command_line_reverse_with_like_gives_the_folder_back(folder, scanned, tmp_path) -> None:
    from typer.testing import CliRunner

    from suture.cli import app

    back = tmp_path / "back"
    arguments = ["convert", str(scanned), str(back), "--recipe", "deepseek4:maxtext"]
    done = CliRunner().invoke(
        app, [*arguments, "--reverse", "--like", str(folder), "--no-progress"]
    )
    assert done.exit_code == 0, done.output
    original, returned = _tensors(folder), _tensors(back)
    assert sorted(returned) == sorted(original)
    assert all(returned[name].tobytes() == value.tobytes() for name, value in original.items())
    assert returned["layers.0.ffn.gate.tid2eid"].dtype == np.int32


def test_the_mtp_layer_is_left_out_said_so_and_given_back_with_like(folder, tmp_path) -> None:
    """The published checkpoint's multi-token-prediction layer (mtp.*): MaxText's tree has no
    place for it; left out with a warning naming it, and restored by --reverse --like."""
    from safetensors.numpy import save_file

    from suture.families import LeftOutWarning

    tensors = _tensors(folder)
    rng = np.random.default_rng(5)
    tensors["mtp.0.enorm.weight"] = rng.standard_normal(64).astype(np.float32)
    tensors["mtp.0.e_proj.weight"] = rng.standard_normal((64, 128)).astype(np.float32)
    with_mtp, mt, back = tmp_path / "hf", tmp_path / "mt", tmp_path / "back"
    with_mtp.mkdir()
    save_file(tensors, with_mtp / "model.safetensors", metadata={"format": "pt"})
    (with_mtp / "config.json").write_text((folder / "config.json").read_text())
    with pytest.warns(LeftOutWarning, match=r"leaves out 2 tensor\(s\).*mtp\.0\.e_proj\.weight"):
        suture.convert(with_mtp, mt, recipe="deepseek4:maxtext", progress=False)
    assert not any("mtp" in path for path in suture.open(mt).flat())
    suture.convert(
        mt,
        back,
        recipe="deepseek4:maxtext",
        reverse=True,
        like=with_mtp,
        format="safetensors",
        progress=False,
    )
    returned = _tensors(back)
    assert sorted(returned) == sorted(tensors)
    assert all(returned[name].tobytes() == value.tobytes() for name, value in tensors.items())


def test_v4_pro_layer_pattern_is_refused_naming_the_layer(folder, tmp_path) -> None:
    """transformers' default layer_types (V4-Pro's: two HCA layers first) depart from what
    MaxText's deepseek4 fixes in code: refused before anything is written."""
    config = json.loads((folder / "config.json").read_text())
    config["layer_types"] = ["heavily_compressed_attention"] * 2 + config["layer_types"][2:]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigMismatchError, match=r"'layer_types' makes layer 0"):
        suture.convert(
            folder, tmp_path / "out", recipe="deepseek4:maxtext", config=tmp_path / "config.json"
        )
    assert not (tmp_path / "out").exists()


def test_odd_count_of_scanned_layers_is_refused(folder, tmp_path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(num_hidden_layers=6)
    for field in ("layer_types", "mlp_layer_types"):
        config[field] = config[field][:6]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigMismatchError, match="num_hidden_layers.*whole blocks of two"):
        suture.convert(
            folder, tmp_path / "out", recipe="deepseek4:maxtext", config=tmp_path / "config.json"
        )


# The published layout: FP8 with UE8M0 `.scale` per 128 x 128 block, FP4 experts ------------

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def _fp8(weight: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """E4M3 codes near `weight`, UE8M0 scale bytes per 128 x 128 block, and their float32 value."""
    rows, cols = weight.shape
    scales = rng.integers(120, 128, (-(-rows // 128), -(-cols // 128))).astype(np.uint8)
    factor = np.exp2(scales.astype(np.float32) - 127)
    full = np.repeat(np.repeat(factor, 128, 0), 128, 1)[:rows, :cols]
    codes = (weight / full).astype(ml_dtypes.float8_e4m3fn)
    return codes, scales, codes.astype(np.float32) * full


def _fp4(weight: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """E2M1 nibbles (low first) packed two a byte, a UE8M0 scale per 32 inputs, and the value."""
    rows, cols = weight.shape
    nibbles = rng.integers(0, 16, (rows, cols)).astype(np.uint8)
    scales = rng.integers(118, 128, (rows, cols // 32)).astype(np.uint8)
    value = E2M1[nibbles] * np.repeat(np.exp2(scales.astype(np.float32) - 127), 32, 1)
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4), scales, value


def test_published_fp8_and_fp4_layout_converts_dequantized_in_one_pass(folder, tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.numpy import save_file as save_numpy
    from safetensors.torch import save_file

    rng = np.random.default_rng(3)
    tensors, plain = _tensors(folder), {}
    quantized: dict[str, torch.Tensor] = {}
    for name, value in tensors.items():
        expert = ".ffn.experts." in name and name.endswith(".weight")
        fp8 = name.endswith(".weight") and any(
            f".{part}.weight" in name for part in ("wq_a", "wq_b", "wkv", "wo_a", "wo_b", "w1")
        )
        if expert:
            packed, scales, plain[name] = _fp4(value, rng)
            quantized[name] = torch.from_numpy(packed).view(torch.float4_e2m1fn_x2)
        elif fp8:
            codes, scales, plain[name] = _fp8(value, rng)
            quantized[name] = torch.from_numpy(codes.view(np.uint8)).view(torch.float8_e4m3fn)
        else:
            plain[name] = value
            quantized[name] = torch.from_numpy(value.copy())
            continue
        scale_name = name.removesuffix(".weight") + ".scale"
        quantized[scale_name] = torch.from_numpy(scales).view(torch.float8_e8m0fnu)
    config = json.loads((folder / "config.json").read_text())
    fp8_folder, reference = tmp_path / "fp8", tmp_path / "reference"
    fp8_folder.mkdir()
    reference.mkdir()
    save_file(quantized, fp8_folder / "model.safetensors", metadata={"format": "pt"})
    save_numpy(plain, reference / "model.safetensors", metadata={"format": "pt"})
    (reference / "config.json").write_text(json.dumps(config))
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128],
        "expert_dtype": "fp4",
    }
    (fp8_folder / "config.json").write_text(json.dumps(config))
    one, two = tmp_path / "one", tmp_path / "two"
    recipe = "deepseek4:maxtext"
    suture.convert(fp8_folder, one, recipe=recipe, dequantize=True, dtype="float32", progress=False)
    suture.convert(reference, two, recipe=recipe, dtype="float32", progress=False)
    ours, theirs = suture.open(one).flat(), suture.open(two).flat()
    assert sorted(ours) == sorted(theirs)
    for path, leaf in theirs.items():
        if hasattr(leaf, "read"):
            got, expected = ours[path].read(), leaf.read()
            assert got.dtype == expected.dtype, path
            assert got.tobytes() == expected.tobytes(), path
    assert ours["params/Tid2EidVar/decoder/layers_1/mlp/MoeBlock_0/tid2eid"].dtype == np.int32
    # in bfloat16, as MaxText's dequantize script writes: the hash table stays integer
    three = tmp_path / "three"
    suture.convert(fp8_folder, three, recipe=recipe, dequantize=True, progress=False)
    flat = suture.open(three).flat()
    table = flat["params/Tid2EidVar/decoder/layers_1/mlp/MoeBlock_0/tid2eid"]
    assert table.dtype == np.int32
    assert table.read().tobytes() == tensors["layers.1.ffn.gate.tid2eid"].tobytes()
    assert (
        flat["params/params/decoder/layers_1/self_attention/wq_a/kernel"].dtype.name == "bfloat16"
    )


# The table keys deepseek4 added, in a table of one's own -----------------------------------


def _own_table(tmp_path: Path, change) -> Path:
    from importlib.resources import files

    import yaml

    data = yaml.safe_load(files("suture.families").joinpath("deepseek4.yaml").read_text())
    change(data)
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _leaf_at(data: dict, path: str) -> dict:
    return next(leaf for leaf in data["leaves"] if leaf["maxtext"] == path)


def _no_blocks(data: dict) -> None:
    for key in ("layer_blocks", "layer_blocks_under"):
        del data[key]


def _params_collection(data: dict) -> None:
    _leaf_at(data, "decoder/layers/mlp/MoeBlock_0/tid2eid")["collection"] = "params"


def _sizes_and_parts(data: dict) -> None:
    _leaf_at(data, "decoder/layers/mhc_mlp/pre_alpha")["fused"]["split"]["parts"] = 3


def _rule_not_a_mapping(data: dict) -> None:
    data["layer_rules"]["compress_ratios"] = ["i < 2"]


@pytest.mark.parametrize(
    "change, phrase",
    [
        (_no_blocks, "layer_blocks_from: needs layer_blocks"),
        (_params_collection, "collection: must name a MaxText variable collection other than"),
        (_sizes_and_parts, "sizes gives the parts: no mode or parts beside it"),
        (_rule_not_a_mapping, "layer_rules.compress_ratios: must be a mapping"),
    ],
)
def test_a_table_misusing_the_new_keys_is_refused_naming_the_entry(
    folder, tmp_path, change, phrase
) -> None:
    table = _own_table(tmp_path, change)
    with pytest.raises(suture.SurgeryError, match=phrase.replace(".", r"\.")):
        suture.convert(folder, tmp_path / "out", recipe=str(table), progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        (["hc_mult", "hc_mult", "hc_mult"], r"4 \+ 4 \+ 4 = 12.*24"),
        # 4 - 4 + 24 = 24: the sum alone fits, and the parts would be cut from the wrong rows
        (["hc_mult", "-hc_mult", "hc_mult * hc_mult + 2 * hc_mult"], r"4 \+ -4 \+ 24 = 24"),
    ],
)
def test_split_sizes_that_do_not_fit_the_tensor_name_it_and_both_lengths(
    folder, tmp_path, sizes, message
):
    def resized(data: dict) -> None:
        leaf = _leaf_at(data, "decoder/layers/mhc_attention/res_alpha")
        leaf["fused"]["split"]["sizes"] = sizes

    table = _own_table(tmp_path, resized)
    with pytest.raises(ConfigMismatchError, match=r"'layers\.0\.hc_attn_fn'.*" + message):
        suture.convert(folder, tmp_path / "out", recipe=str(table), progress=False)
    assert not (tmp_path / "out").exists()


def test_listed_by_suture_recipes_with_the_flash_config_checked(tmp_path) -> None:
    """Both layouts are listed; the published Flash config (43 layers, compress_ratios with
    the MTP layer's extra entry) passes the layer-kind rules, and a ratio out of place fails."""
    from typer.testing import CliRunner

    from suture.cli import app
    from suture.families import recipe_names

    assert {"deepseek4:maxtext", "deepseek4:maxtext-unscanned"} <= set(recipe_names())
    ratios = [0, 0] + [4 if i % 2 == 0 else 128 for i in range(2, 43)] + [0]
    config = {
        "model_type": "deepseek_v4",
        "hidden_size": 4096,
        "num_hidden_layers": 43,
        "num_attention_heads": 64,
        "head_dim": 512,
        "q_lora_rank": 1024,
        "o_groups": 8,
        "o_lora_rank": 1024,
        "n_routed_experts": 256,
        "num_hash_layers": 3,
        "compress_ratios": ratios,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = CliRunner().invoke(
        app, ["recipes", "deepseek4:maxtext", "--config", str(tmp_path / "config.json")]
    )
    assert done.exit_code == 0, done.output
    assert "split axis 0 into (8, 1024)" in done.output
    config["compress_ratios"] = [128, *ratios[1:]]  # V4-Pro's first layer
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = CliRunner().invoke(
        app, ["recipes", "deepseek4:maxtext", "--config", str(tmp_path / "config.json")]
    )
    assert done.exit_code != 0
    assert "'compress_ratios' makes layer 0 128" in done.output
