"""Qwen3.5: the qwen3.5 recipes, proven with transformers' own Qwen3_5Moe classes.

Tiny random models (two cycles of 3 Gated DeltaNet layers and 1 full-attention layer, 4 routed
experts, a shared expert) go to MaxText's layout and back bit for bit, scanned and unscanned,
from the text model (Qwen3_5MoeForCausalLM) and the published multimodal layout
(Qwen3_5MoeForConditionalGeneration: ``model.language_model.``, a vision tower left out and
restored by ``like``), with the experts one per tensor (transformers' save_pretrained) or fused
(the published folders); an FP8 folder converts dequantized in the same pass. The tree has the
paths and shapes of MaxText 0.2.5's converter (QWEN3_5_MAXTEXT_TO_HF_PARAM_MAPPING: layers/layer_k
stacking HF layers k, k+4, ...), and in_proj_qkvz / in_proj_ba are its per-key-head regrouping
(concat_qkvz_and_transpose, concat_ba_and_transpose), written here with numpy as MaxText does.
MaxText's own converter and model on the same kind of folder are bench/_maxtext_families.py's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import suture
from suture import families
from suture.families._convert import convert_with_recipe

from .test_families import (
    _assert_refused,
    _assert_same_tensors,
    _assert_tree,
    _cli_round_trip,
    _cli_shows_family,
    _tensors,
)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

CYCLE, LAYERS = 4, 8
E, HEADS, KV, D, MOE, EXPERTS, V = 32, 4, 2, 8, 16, 4, 64
HK, HV, DK, DV, KERNEL = 2, 4, 8, 8, 4  # linear attention: key and value heads, their sizes
CONFIG = dict(
    vocab_size=V,
    hidden_size=E,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV,
    head_dim=D,
    linear_conv_kernel_dim=KERNEL,
    linear_key_head_dim=DK,
    linear_value_head_dim=DV,
    linear_num_key_heads=HK,
    linear_num_value_heads=HV,
    moe_intermediate_size=MOE,
    shared_expert_intermediate_size=MOE,
    num_experts=EXPERTS,
    num_experts_per_tok=2,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
)
VISION = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=24,
    num_heads=2,
    out_hidden_size=E,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=2,
)


def _model(multimodal: bool = False, dtype=torch.float32, **extra):
    torch.manual_seed(0)
    text = {**CONFIG, **extra}
    if multimodal:
        config = transformers.Qwen3_5MoeConfig(text_config=text, vision_config=VISION)
        model = transformers.Qwen3_5MoeForConditionalGeneration(config)
    else:
        model = transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**text))
    with torch.no_grad():  # no two tensors alike, so that a wrong mapping shows
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    return model.to(dtype).eval()


def _save_model(folder, fused: bool = False, multimodal: bool = False, **extra):
    model = _model(multimodal, **extra)
    model.save_pretrained(folder, save_original_format=not fused)
    return model


@pytest.fixture(scope="module")
def text_folders(tmp_path_factory):
    """The text model saved both ways: experts one per tensor, and fused."""
    root = tmp_path_factory.mktemp("qwen35")
    model = _model()
    model.save_pretrained(root / "per-expert")
    model.save_pretrained(root / "fused", save_original_format=False)
    return root


@pytest.mark.parametrize("fused", [False, True], ids=["per-expert", "fused"])
@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_qwen35_round_trip_is_bit_identical(tmp_path, text_folders, layout, fused):
    hf = text_folders / ("fused" if fused else "per-expert")
    name = f"qwen3.5:{layout}"
    convert_with_recipe(hf, tmp_path / "mt", name, progress=False)
    convert_with_recipe(tmp_path / "mt", tmp_path / "back", name, reverse=True, progress=False)
    _assert_same_tensors(hf, tmp_path / "back", same_config=True)


# MaxText's names per layer, with one layer's shape (QWEN3_5_MAXTEXT_TO_HF_PARAM_MAPPING's names;
# the shapes of MaxText's Qwen3_5DecoderLayer)
SHARED = {
    "input_layernorm/scale": (E,),
    "post_attention_layernorm/scale": (E,),
    "mlp/routed_experts/gate/kernel": (E, EXPERTS),
    "mlp/routed_experts/wi_0": (EXPERTS, E, MOE),
    "mlp/routed_experts/wi_1": (EXPERTS, E, MOE),
    "mlp/routed_experts/wo": (EXPERTS, MOE, E),
    "mlp/shared_expert/wi_0/kernel": (E, MOE),
    "mlp/shared_expert/wi_1/kernel": (E, MOE),
    "mlp/shared_expert/wo/kernel": (MOE, E),
    "mlp/shared_expert_gate/kernel": (E, 1),
}
CONV = 2 * HK * DK + HV * DV
LINEAR = {
    "attention/in_proj_qkvz/kernel": (E, CONV + HV * DV),
    "attention/in_proj_ba/kernel": (E, 2 * HV),
    "attention/conv1d/kernel": (KERNEL, 1, CONV),
    "attention/A_log": (HV,),
    "attention/dt_bias": (HV,),
    "attention/norm/rms_norm/scale": (DV,),
    "attention/out_proj/kernel": (HV * DV, E),
}
FULL = {
    "attention/attention/query/kernel": (E, HEADS, 2 * D),  # the output gate beside the query
    "attention/attention/key/kernel": (E, KV, D),
    "attention/attention/value/kernel": (E, KV, D),
    "attention/attention/out/kernel": (HEADS * D, E),
    "attention/attention/query_norm/scale": (D,),
    "attention/attention/key_norm/scale": (D,),
}


def _expected_shapes(scanned: bool) -> dict[str, tuple[int, ...]]:
    shapes = {
        "token_embedder/embedding": (V, E),
        "decoder/decoder_norm/scale": (E,),
        "decoder/logits_dense/kernel": (E, V),
    }
    for i in range(LAYERS):
        for leaf, shape in {**SHARED, **(FULL if i % CYCLE == CYCLE - 1 else LINEAR)}.items():
            if scanned:  # layer_k stacks HF layers k, k+4 on axis 1 (after the experts' axis)
                stacked = (shape[0], LAYERS // CYCLE, *shape[1:])
                shapes[f"decoder/layers/layer_{i % CYCLE}/{leaf}"] = stacked
            else:
                shapes[f"decoder/layers_{i}/{leaf}"] = shape
    return {f"params/params/{path}": shape for path, shape in shapes.items()}


def _maxtext_qkvz(qkv: np.ndarray, z: np.ndarray) -> np.ndarray:
    """MaxText 0.2.5's concat_qkvz_and_transpose (param_mapping.py), as it is written there."""
    q, k, v = qkv[: HK * DK], qkv[HK * DK : 2 * HK * DK], qkv[2 * HK * DK :]
    per_key = HV // HK
    parts = [
        q.reshape(HK, DK, -1),
        k.reshape(HK, DK, -1),
        v.reshape(HK, per_key * DV, -1),
        z.reshape(HK, per_key * DV, -1),
    ]
    return np.concatenate(parts, axis=1).reshape(-1, qkv.shape[-1]).T


def _maxtext_ba(b: np.ndarray, a: np.ndarray) -> np.ndarray:
    """MaxText 0.2.5's concat_ba_and_transpose."""
    per_key = HV // HK
    joined = np.concatenate([b.reshape(HK, per_key, -1), a.reshape(HK, per_key, -1)], axis=1)
    return joined.reshape(-1, b.shape[-1]).T


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_qwen35_tree_has_maxtexts_paths_shapes_and_regrouping(tmp_path, text_folders, layout):
    """Every leaf where MaxText's converter puts it; layer_k[:, j] is HF layer k + 4j; the
    regrouped projections equal MaxText's own hook functions on the same tensors."""
    hf_folder = text_folders / "fused"
    convert_with_recipe(hf_folder, tmp_path / "mt", f"qwen3.5:{layout}", progress=False)
    scanned = layout == "maxtext"
    ckpt = _assert_tree(tmp_path / "mt", _expected_shapes(scanned))
    hf = _tensors(hf_folder)

    def leaf(layer: int, name: str) -> np.ndarray:
        if not scanned:
            return ckpt[f"params/params/decoder/layers_{layer}/{name}"].read()
        stacked = ckpt[f"params/params/decoder/layers/layer_{layer % CYCLE}/{name}"].read()
        axis = 1 if stacked.ndim > 1 else 0
        return np.take(stacked, layer // CYCLE, axis=axis)

    for layer in range(LAYERS):
        at = f"model.layers.{layer}"
        if layer % CYCLE == CYCLE - 1:
            query = hf[f"{at}.self_attn.q_proj.weight"].T.reshape(E, HEADS, 2 * D)
            np.testing.assert_array_equal(leaf(layer, "attention/attention/query/kernel"), query)
            continue
        attn = f"{at}.linear_attn"
        np.testing.assert_array_equal(
            leaf(layer, "attention/in_proj_qkvz/kernel"),
            _maxtext_qkvz(hf[f"{attn}.in_proj_qkv.weight"], hf[f"{attn}.in_proj_z.weight"]),
        )
        np.testing.assert_array_equal(
            leaf(layer, "attention/in_proj_ba/kernel"),
            _maxtext_ba(hf[f"{attn}.in_proj_b.weight"], hf[f"{attn}.in_proj_a.weight"]),
        )
        np.testing.assert_array_equal(
            leaf(layer, "attention/conv1d/kernel"), hf[f"{attn}.conv1d.weight"].transpose(2, 1, 0)
        )
        gate_up = hf[f"{at}.mlp.experts.gate_up_proj"]
        np.testing.assert_array_equal(
            leaf(layer, "mlp/routed_experts/wi_1"), gate_up[:, MOE:].transpose(0, 2, 1)
        )


def test_multimodal_qwen35_leaves_out_the_vision_tower_and_like_restores_it(tmp_path):
    """The published layout (model.language_model., fused experts, model.visual.*): the language
    model converts, the vision tower is said to be left out, and --reverse --like gives the
    whole folder back bit for bit, in its own expert layout."""
    _save_model(tmp_path / "hf", fused=True, multimodal=True)
    with pytest.warns(families.LeftOutWarning, match=r"leaves out 21 tensor.*model\.visual"):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "qwen3.5:maxtext", progress=False)
    _assert_tree(tmp_path / "mt", _expected_shapes(True))
    convert_with_recipe(
        tmp_path / "mt",
        tmp_path / "back",
        "qwen3.5:maxtext",
        reverse=True,
        like=tmp_path / "hf",
        progress=False,
    )
    _assert_same_tensors(tmp_path / "hf", tmp_path / "back", same_config=True)
    back = transformers.Qwen3_5MoeForConditionalGeneration.from_pretrained(tmp_path / "back")
    assert back is not None


def test_published_qwen35_leaves_out_its_mtp_layer_and_like_restores_it(tmp_path):
    """A published folder also holds the multi-token-prediction layer (mtp.*, outside the
    language model's prefix, mtp_num_hidden_layers 1): MaxText's tree has no place for it and
    transformers' model does not load it, so it is left out with the vision tower, said so, and
    --reverse --like puts it back bit for bit."""
    from safetensors.numpy import save_file

    _save_model(tmp_path / "hf", fused=True, multimodal=True)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 1
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    mtp = {
        "mtp.fc.weight": np.arange(2 * E * E, dtype=np.float32).reshape(E, 2 * E),
        "mtp.norm.weight": np.ones(E, np.float32),
    }
    save_file(mtp, tmp_path / "hf" / "mtp.safetensors")
    with pytest.warns(families.LeftOutWarning, match=r"leaves out 23 tensor.*mtp\.fc\.weight"):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "qwen3.5:maxtext", progress=False)
    _assert_tree(tmp_path / "mt", _expected_shapes(True))
    convert_with_recipe(
        tmp_path / "mt",
        tmp_path / "back",
        "qwen3.5:maxtext",
        reverse=True,
        like=tmp_path / "hf",
        progress=False,
    )
    _assert_same_tensors(tmp_path / "hf", tmp_path / "back", same_config=True)


def test_qwen35_fp8_folder_converts_dequantized_in_the_same_pass(tmp_path):
    """An FP8 folder with block scales, experts one per tensor as Qwen's FP8 releases are
    (transformers' FP8 quantizer on the linear weights): one pass equals transformers'
    dequantization then a plain conversion, both ways."""
    from .test_quantized import cli, quantize_folder, reference_dequantize

    _model(dtype=torch.bfloat16).save_pretrained(tmp_path / "bf16")
    fp8 = quantize_folder(tmp_path / "bf16", tmp_path / "fp8")
    opened = suture.open(fp8)
    qkv = "model/layers/0/linear_attn/in_proj_qkv"
    assert opened[f"{qkv}/weight"].dtype.name == "float8_e4m3fn"
    assert f"{qkv}/weight_scale_inv" in opened.paths()
    dequantized = reference_dequantize(fp8, tmp_path / "dequantized")
    before = {f.name: f.read_bytes() for f in fp8.iterdir()}
    for layout in ("maxtext", "maxtext-unscanned"):
        recipe = ["--recipe", f"qwen3.5:{layout}", "--no-progress"]
        one, two, back = (tmp_path / f"{name}-{layout}" for name in ("one", "two", "back"))
        assert (done := cli("convert", str(fp8), str(one), *recipe)).exit_code == 0, done.output
        done = cli("convert", str(dequantized), str(two), *recipe)
        assert done.exit_code == 0, done.output
        assert cli("diff", str(one), str(two), "--values").exit_code == 0
        done = cli("convert", str(one), str(back), *recipe, "--reverse")
        assert done.exit_code == 0, done.output
        assert cli("diff", str(back), str(dequantized), "--values").exit_code == 0
    assert {f.name: f.read_bytes() for f in fp8.iterdir()} == before  # source untouched


# Configs and folders MaxText's Qwen3.5 cannot hold, refused before any byte is read --------


def _edited_folder(tmp_path, text_folders, edit=None, tensors=None):
    """The fused text folder copied to tmp_path/hf, its config.json edited by `edit`, and
    `tensors` added (in a second shard of its own)."""
    import shutil

    from safetensors.numpy import save_file

    shutil.copytree(text_folders / "fused", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    if edit:
        edit(config)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    if tensors:
        save_file(tensors, tmp_path / "hf" / "extra.safetensors")


def _set(**fields):
    return lambda config: config.update(fields)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (
            _set(model_type="qwen3_5_text"),
            "'model_type' is 'qwen3_5_text'; recipe 'qwen3.5:maxtext' fits 'qwen3_5_moe_text'",
        ),
        (
            _set(layer_types=["linear_attention", "full_attention"] * 4),
            "'layer_types' makes layer 1 'full_attention'.*expects 'linear_attention'",
        ),
        (
            _set(full_attention_interval=2),
            "'full_attention_interval' is 2: MaxText's Qwen3.5 blocks are cycles of 4",
        ),
        (_set(tie_word_embeddings=True), "'tie_word_embeddings' is True: MaxText's Qwen3.5"),
    ],
    ids=["dense", "layer-types", "interval", "tied"],
)
def test_qwen35_refuses_a_config_maxtext_cannot_hold(tmp_path, text_folders, edit, match):
    _edited_folder(tmp_path, text_folders, edit)
    _assert_refused(tmp_path, "qwen3.5:maxtext", match)


def test_qwen35_refuses_a_layer_count_off_the_cycle(tmp_path):
    _save_model(tmp_path / "hf", num_hidden_layers=6)
    _assert_refused(tmp_path, "qwen3.5:maxtext", "'num_hidden_layers' is 6: MaxText scans")


def test_qwen35_refuses_tensors_no_leaf_uses(tmp_path, text_folders):
    """A tensor of a text-only folder that no leaf uses (nothing marks it to leave out): an
    error naming the tensors, not dropped without a word."""
    extra = {"mtp.fc.weight": np.zeros((E, 2 * E), np.float32)}
    _edited_folder(tmp_path, text_folders, tensors=extra)
    _assert_refused(tmp_path, "qwen3.5:maxtext", r"no place for 1 tensor.*mtp\.fc\.weight")


def test_qwen35_refuses_linear_heads_that_do_not_fit_the_tensors(tmp_path, text_folders):
    """Key heads the in_proj_qkv rows do not hold (linear_key_head_dim 4 of 8): refused naming
    the tensors and the parts the config makes."""
    _edited_folder(tmp_path, text_folders, _set(linear_key_head_dim=4))
    _assert_refused(tmp_path, "qwen3.5:maxtext", r"in_proj_qkv.weight.*parts")


def test_cli_lists_qwen35_and_converts_both_ways(tmp_path, text_folders):
    import shutil

    shutil.copytree(text_folders / "per-expert", tmp_path / "hf")
    shown = _cli_shows_family("qwen3.5", tmp_path / "hf" / "config.json")
    assert "QWEN3_5_MAXTEXT_TO_HF_PARAM_MAPPING" in shown
    assert "interleaved by linear_num_key_heads groups on axis 0" in shown
    _cli_round_trip(tmp_path, "qwen3.5:maxtext")


# interleave in a user's table: docs/recipe-tables.md's example, run as it is written --------


def _docs_table(folder, **change):
    """docs/recipe-tables.md's my_llama_qkv.yaml, written to `folder` (its top-level keys
    changed by `change`, its qkv leaf's interleave by `interleave=`)."""
    import re
    import textwrap
    from pathlib import Path

    import yaml

    page = (Path(__file__).parents[1] / "docs" / "recipe-tables.md").read_text()
    (block,) = re.findall(r"```yaml\n(  # file: my_llama_qkv\.yaml\n.*?)  ```", page, re.S)
    data = yaml.safe_load(textwrap.dedent(block))
    if "interleave" in change:
        data["leaves"][3]["interleave"] = change.pop("interleave")
    data.update(change)
    path = folder / "my_llama_qkv.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    folder = tmp_path_factory.mktemp("llama") / "hf"
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_the_docs_interleave_table_converts_both_ways(tmp_path, llama_folder, layout):
    """Each KV head's queries, key and value side by side in one kernel; back bit for bit."""
    table = f"{_docs_table(tmp_path)}:{layout}"
    suture.convert(llama_folder, tmp_path / "mt", recipe=table, progress=False)
    hf = _tensors(llama_folder)
    tree = suture.open(tmp_path / "mt")
    path = "self_attention/qkv/kernel"
    if layout == "maxtext":
        qkv = tree[f"params/params/decoder/layers/{path}"].read()[:, 1]
    else:
        qkv = tree[f"params/params/decoder/layers_1/{path}"].read()
    attn = "model.layers.1.self_attn"
    q, k, v = (hf[f"{attn}.{name}_proj.weight"] for name in "qkv")
    groups = [
        np.concatenate([q[16 * g : 16 * g + 16], k[8 * g : 8 * g + 8], v[8 * g : 8 * g + 8]])
        for g in range(2)
    ]
    np.testing.assert_array_equal(qkv, np.concatenate(groups).T)
    suture.convert(tmp_path / "mt", tmp_path / "back", recipe=table, reverse=True, progress=False)
    _assert_same_tensors(llama_folder, tmp_path / "back")


@pytest.mark.parametrize(
    ("interleave", "phrase"),
    [
        ({"parts": [[8], None, None]}, "interleave.groups: .*|needs groups"),
        ({"groups": 2, "parts": [[8], None]}, r"interleave.parts: needs one entry per hf tensor"),
        ({"groups": 2, "axis": -1}, r"interleave.axis: must be an axis"),
        ({"groups": 2, "stride": 1}, r"interleave: unknown key 'stride'"),
        ({"groups": 2, "parts": "q"}, r"interleave.parts: must be a non-empty list"),
    ],
)
def test_a_table_with_a_wrong_interleave_is_refused_naming_the_entry(tmp_path, interleave, phrase):
    from suture.families._file import family_recipe

    with pytest.raises(families.RecipeFormatError, match=phrase):
        family_recipe(str(_docs_table(tmp_path, interleave=interleave)))


def test_an_interleave_whose_parts_do_not_fit_is_refused_before_writing(tmp_path, llama_folder):
    """Parts the tensors do not hold (the key as long as the query): the tensors and the
    parts are named, nothing is written."""
    wrong = {"groups": "num_key_value_heads", "parts": [["num_attention_heads * head_dim"]] * 2}
    wrong["parts"].append(None)
    table = str(_docs_table(tmp_path, interleave=wrong))
    with pytest.raises(families.ConfigMismatchError, match=r"k_proj.weight.*parts"):
        suture.convert(llama_folder, tmp_path / "mt", recipe=table, progress=False)
    assert not (tmp_path / "mt").exists()


@pytest.mark.parametrize(
    ("hf", "phrase"),
    [
        ("a.{layer}", r"interleave: goes with hf: \[NAME, NAME, \.\.\.\]"),
        (["a.{layer}.{expert}", "b.{layer}.{expert}"], "joins whole tensors: not with 'fused'"),
    ],
)
def test_an_interleave_needs_whole_tensors_to_join(hf, phrase):
    from suture.families._schema import checked_table

    leaf = {"maxtext": "decoder/layers/x", "hf": hf, "interleave": {"groups": 2}}
    table = {"names": ["x"], "description": "d", "follows": "f", "experts": "n", "leaves": [leaf]}
    with pytest.raises(families.RecipeFormatError, match=phrase):
        checked_table(table, "t.yaml")
