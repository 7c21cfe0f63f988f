"""The gemma4:maxtext-multimodal recipe: Gemma 4 whole, its vision tower and projector beside the
language model in MaxText's multimodal tree, both directions.

Tiny random `Gemma4ForConditionalGeneration` models (`save_pretrained`; the language model one
block of 5 local and 1 global layer, MoE as 26B-A4B and dense as 31B; a 2-layer vision tower)
go to MaxText's layout and back; the folder written back loads in transformers and gives the
same image features. MaxText's own converter and model on such a folder are
bench/_maxtext_multimodal.py's run.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

import suture
from suture.families._convert import convert_with_recipe

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

RECIPE = "gemma4:maxtext-multimodal"
TEXT = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=32,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    hidden_size_per_layer_input=0,
    sliding_window=8,
)
MOE = dict(TEXT, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16)
VISION = dict(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=16,
    position_embedding_size=64,
    patch_size=4,
    pooling_kernel_size=3,
)
TOWER = "params/params/vision_encoder/Gemma4VisionEncoderLayer_0"
PROJECTOR = "params/params/vision_encoder/Gemma4VisionProjector_0"


def _model(folder, text=MOE, **vision):
    config = transformers.Gemma4Config(text_config=text, vision_config={**VISION, **vision})
    torch.manual_seed(0)
    model = transformers.Gemma4ForConditionalGeneration(config)
    with torch.no_grad():  # no two tensors alike, so that a wrong mapping shows
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
        for name, buffer in model.named_buffers():
            if name.endswith(("layer_scalar", "std_scale", "std_bias")):
                buffer.add_(torch.randn_like(buffer) * 0.1)
            elif name.endswith(("input_min", "output_min")):
                buffer.fill_(-3.0)
            elif name.endswith(("input_max", "output_max")):
                buffer.fill_(3.0)
    model.save_pretrained(folder)
    return model.eval()


def _tensors(folder) -> dict[str, np.ndarray]:
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def _assert_same(source, back):
    assert sorted(source) == sorted(back)
    for key in source:
        np.testing.assert_array_equal(back[key], source[key], err_msg=key)


def _image_features(model, seed=0):
    """Soft tokens of one random 24x24 image: 36 patches of 4x4x3, pooled 3x3 into 4."""
    pixels = torch.from_numpy(np.random.default_rng(seed).random((1, 36, 48))).float()
    x, y = np.meshgrid(np.arange(6), np.arange(6))
    positions = torch.from_numpy(np.stack([x, y], -1).reshape(1, 36, 2)).long()
    with torch.no_grad():
        out = model.get_image_features(pixels, positions).pooler_output
    return torch.cat(list(out)).numpy()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma4mm")
    model = _model(folder / "hf", standardize=True)
    convert_with_recipe(folder / "hf", folder / "mt", RECIPE, progress=False)
    return folder, model


def test_the_tower_goes_to_maxtexts_multimodal_tree_unscanned(converted):
    folder, _ = converted
    hf = _tensors(folder / "hf")
    ckpt = suture.open(folder / "mt")
    read = {path: ckpt[path].read() for path in ckpt.paths() if "vision_encoder" in path}
    layer, block = "model.vision_tower.encoder.layers.1", f"{TOWER}/layer_1"
    expected = {
        f"{TOWER}/vision_entry/input_projection/kernel": hf[
            "model.vision_tower.patch_embedder.input_proj.weight"
        ].T,
        f"{TOWER}/vision_entry/pos_emb_param": hf[
            "model.vision_tower.patch_embedder.position_embedding_table"
        ].transpose(1, 0, 2),
        f"{TOWER}/std_scale": hf["model.vision_tower.std_scale"],
        f"{TOWER}/std_bias": hf["model.vision_tower.std_bias"],
        f"{PROJECTOR}/projection/kernel": hf["model.embed_vision.embedding_projection.weight"].T,
        f"{block}/attention/query/kernel": hf[f"{layer}.self_attn.q_proj.linear.weight"].T.reshape(
            32, 2, 16
        ),
        f"{block}/attention/value/kernel": hf[f"{layer}.self_attn.v_proj.linear.weight"].T.reshape(
            32, 2, 16
        ),
        f"{block}/attention/out/kernel": hf[f"{layer}.self_attn.o_proj.linear.weight"].T.reshape(
            2, 16, 32
        ),
        f"{block}/attention/key_norm/scale": hf[f"{layer}.self_attn.k_norm.weight"],  # as stored
        f"{block}/pre_ffw_norm/scale": hf[f"{layer}.pre_feedforward_layernorm.weight"],
        f"{block}/mlp/wi_1/kernel": hf[f"{layer}.mlp.up_proj.linear.weight"].T,
        f"{block}/mlp/wo/kernel": hf[f"{layer}.mlp.down_proj.linear.weight"].T,
    }
    for path, value in expected.items():
        np.testing.assert_array_equal(read[path], value, err_msg=path)
    assert read[f"{TOWER}/vision_entry/pos_emb_param"].shape == (64, 2, 32)
    assert len(read) == 4 + 13 * 2 + 1  # the tower's entry and std, 2 layers of 13, the projector
    # the language model as gemma4:maxtext writes it: one scanned block of 5 local, 1 global
    scanned = "params/params/decoder/scanned_blocks"
    np.testing.assert_array_equal(
        ckpt[f"{scanned}/local_layers/mlp/moe_block/shared_experts/wo/kernel"].read()[:, 0, 4],
        hf["model.language_model.layers.4.mlp.down_proj.weight"].T,
    )


def test_the_language_model_is_as_gemma4_maxtext_writes_it(converted, tmp_path):
    folder, _ = converted
    with pytest.warns(suture.families.LeftOutWarning, match="model.embed_vision"):
        convert_with_recipe(folder / "hf", tmp_path / "text", "gemma4:maxtext", progress=False)
    text, whole = suture.open(tmp_path / "text"), suture.open(folder / "mt")
    assert sorted(text.paths()) == sorted(p for p in whole.paths() if "vision_encoder" not in p)
    for path in text.paths():
        np.testing.assert_array_equal(text[path].read(), whole[path].read(), err_msg=path)


def test_back_to_hf_loads_in_transformers_with_the_same_image_features(converted):
    folder, model = converted
    convert_with_recipe(folder / "mt", folder / "back", RECIPE, reverse=True, progress=False)
    _assert_same(_tensors(folder / "hf"), _tensors(folder / "back"))
    back = transformers.Gemma4ForConditionalGeneration.from_pretrained(folder / "back").eval()
    expected, got = _image_features(model), _image_features(back)
    assert np.abs(expected).max() > 0.1  # features that a wrong tower would change
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("text", [MOE, TEXT], ids=["26b-moe", "31b-dense"])
def test_without_standardize_the_std_leaves_are_made_and_dropped_back(tmp_path, text):
    model = _model(tmp_path / "hf", text=text)
    assert "model.vision_tower.std_scale" not in _tensors(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", RECIPE, max_memory="1MiB", progress=False)
    ckpt = suture.open(tmp_path / "mt")
    assert ckpt[f"{TOWER}/std_scale"].read().tolist() == [1.0] * 32  # changes nothing, as
    assert ckpt[f"{TOWER}/std_bias"].read().tolist() == [0.0] * 32  # HF without standardize
    convert_with_recipe(tmp_path / "mt", tmp_path / "back", RECIPE, reverse=True, progress=False)
    _assert_same(_tensors(tmp_path / "hf"), _tensors(tmp_path / "back"))
    back = transformers.Gemma4ForConditionalGeneration.from_pretrained(tmp_path / "back").eval()
    np.testing.assert_array_equal(_image_features(back), _image_features(model))


def test_a_made_std_leaf_of_another_width_is_refused_on_the_way_back(tmp_path):
    _model(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    recipe = suture.families.get_recipe(RECIPE)
    flat = suture.flatten(recipe.to_maxtext(suture.open(tmp_path / "hf").tree, config))
    flat[f"{TOWER}/std_scale"] = np.ones(31, np.float32)
    with pytest.raises(suture.families.ConfigMismatchError, match=r"std_scale' has shape \(31,\)"):
        recipe.to_hf(suture.unflatten(flat), config)


def test_clipped_linears_bounds_are_left_out_and_like_restores_them(tmp_path):
    _model(tmp_path / "hf", use_clipped_linears=True)
    source = _tensors(tmp_path / "hf")
    bounds = [name for name in source if name.endswith("input_min")]
    assert len(bounds) == 2 * 7  # q, k, v, o, gate, up, down in each of 2 layers
    with pytest.warns(suture.families.LeftOutWarning, match=r"input_max and 55 more.*--like"):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", RECIPE, progress=False)
    assert not any(path.endswith(("_min", "_max")) for path in suture.open(tmp_path / "mt").paths())
    convert_with_recipe(
        tmp_path / "mt",
        tmp_path / "back",
        RECIPE,
        reverse=True,
        like=tmp_path / "hf",
        progress=False,
    )
    _assert_same(source, _tensors(tmp_path / "back"))
    # without --like, transformers makes the bounds infinite: no clipping, as MaxText's tower
    convert_with_recipe(tmp_path / "mt", tmp_path / "bare", RECIPE, reverse=True, progress=False)
    assert not any(name.endswith(("_min", "_max")) for name in _tensors(tmp_path / "bare"))
    bare = transformers.Gemma4ForConditionalGeneration.from_pretrained(tmp_path / "bare")
    bounds = {n: b for n, b in bare.named_buffers() if n.endswith(("input_min", "output_max"))}
    assert len(bounds) == 28 and all(torch.isinf(b).all() for b in bounds.values())


@pytest.mark.parametrize(
    ("vision", "message"),
    [
        (dict(num_key_value_heads=1), "as many key-value heads as query heads"),
        (dict(head_dim=8), "heads of hidden_size // num_attention_heads"),
    ],
)
def test_a_tower_maxtext_does_not_build_is_refused(tmp_path, vision, message):
    _model(tmp_path / "hf", **vision)
    with pytest.raises(suture.families.ConfigMismatchError, match=message):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", RECIPE, progress=False)
    assert not (tmp_path / "mt").exists()


def test_a_text_only_folder_is_refused_naming_the_text_recipe(tmp_path):
    torch.manual_seed(0)
    transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**TEXT)).save_pretrained(
        tmp_path / "hf"
    )
    with pytest.raises(suture.families.ConfigMismatchError, match="vision_config.*gemma4:maxtext"):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", RECIPE, progress=False)


# leaves sharing a path under conditions that exclude each other -------------------------------


@pytest.mark.parametrize(
    ("first", "second", "exclusive"),
    [
        ("standardize", "not standardize", True),
        ("not (a and b)", "a and b", True),
        ("( a and  b )", "not(a and b)", True),
        ("not a or b", "a or b", False),  # (not a) or b: both hold where b does
        ("not a or(b)", "a or(b)", False),  # the same, spelt without a space
        ("not a<b", "(a < b)", True),  # not binds looser than a comparison
        ("not -a", "-a", True),
        ("not a", "not a", False),
        ("a", "b", False),
        (None, "not a", False),
    ],
)
def test_conditions_that_exclude_each_other(first, second, exclusive):
    from suture.families._shared_targets import exclusive_conditions

    assert exclusive_conditions(first, second) is exclusive
    assert exclusive_conditions(second, first) is exclusive


def test_two_leaves_on_one_path_need_conditions_that_exclude_each_other():
    from importlib.resources import files

    import yaml

    from suture.families._schema import checked_table

    table = yaml.safe_load(files("suture.families").joinpath("gemma4-multimodal.yaml").read_text())
    checked_table(table, "t.yaml")
    made = next(leaf for leaf in table["leaves"] if "make" in leaf)
    made["when"] = "standardize"
    with pytest.raises(suture.families.RecipeFormatError, match="one would overwrite the other"):
        checked_table(table, "t.yaml")
    made["when"] = "not standardize"  # a third leaf: excluded by the first, not by the second
    table["leaves"].append({**made, "make": {"fill": 2.0, "shape": ["hidden_size"]}})
    with pytest.raises(suture.families.RecipeFormatError, match="one would overwrite the other"):
        checked_table(table, "t.yaml")
