"""The qwen3-vl:maxtext and :maxtext-unscanned recipes: Qwen3-VL (dense) and Qwen3-VL-MoE whole,
the language model beside the vision tower, its deepstack mergers and final merger in MaxText's
multimodal tree, both directions.

Tiny random `Qwen3VLForConditionalGeneration` and `Qwen3VLMoeForConditionalGeneration` models
(`save_pretrained`) go to MaxText's layout and back; the folder written back loads in
transformers and gives the same image features. The MoE folder is also rewritten with its
experts as the published folders store them (the last two axes swapped): both read the same.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import suture
from suture._errors import ConfigMismatchError
from suture.families._convert import convert_with_recipe

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

UNSCANNED = "qwen3-vl:maxtext-unscanned"
SCANNED = "qwen3-vl:maxtext"
VISION = dict(
    depth=3,
    hidden_size=32,
    intermediate_size=48,
    num_heads=4,
    out_hidden_size=24,
    patch_size=4,
    temporal_patch_size=2,
    spatial_merge_size=2,
    num_position_embeddings=16,
    deepstack_visual_indexes=[0, 2],
)
TEXT = dict(
    vocab_size=128,
    hidden_size=24,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]},
)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)  # 2I=16 != hidden 24
ENCODER = "params/params/vision_encoder/Qwen3VLVisionEncoder_0"
PROJECTOR = "params/params/vision_encoder/Qwen3VLVisionProjector_0/merger"
EXPERTS = ("gate_up_proj", "down_proj")


def _model(folder, moe=False, deepstack=(0, 2)):
    torch.manual_seed(0)
    vision = {**VISION, "deepstack_visual_indexes": list(deepstack)}
    if moe:
        config = transformers.Qwen3VLMoeConfig(vision_config=vision, text_config={**TEXT, **MOE})
        model = transformers.Qwen3VLMoeForConditionalGeneration(config)
    else:
        config = transformers.Qwen3VLConfig(vision_config=vision, text_config=TEXT)
        model = transformers.Qwen3VLForConditionalGeneration(config)
    with torch.no_grad():  # norms and biases away from 1 and 0, so that a mix-up shows
        for name, parameter in model.named_parameters():
            if "norm" in name or "bias" in name or "experts" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(folder)
    return model.eval()


def _tensors(folder) -> dict[str, np.ndarray]:
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def _published(saved, folder):
    """`saved` (a MoE folder as transformers 5.24 writes it) with its experts as published."""
    folder.mkdir()
    for file in saved.iterdir():
        if file.suffix != ".safetensors":
            (folder / file.name).write_bytes(file.read_bytes())
    tensors = {
        name: np.ascontiguousarray(value.transpose(0, 2, 1)) if name.endswith(EXPERTS) else value
        for name, value in _tensors(saved).items()
    }
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def _read(folder) -> dict[str, np.ndarray]:
    ckpt = suture.open(folder)
    return {path: ckpt[path].read() for path in ckpt.paths() if path != "step"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3vl")
    models = {"dense": _model(root / "dense"), "moe": _model(root / "moe", moe=True)}
    _published(root / "moe", root / "moe-published")
    for name in ("dense", "moe", "moe-published"):
        convert_with_recipe(root / name, root / f"{name}-mt", UNSCANNED, progress=False)
    return root, models


def test_the_tower_goes_to_maxtexts_multimodal_tree_unscanned(folders):
    root, _ = folders
    hf, read = _tensors(root / "dense"), _read(root / "dense-mt")
    block, qkv = f"{ENCODER}/blocks_1/attn/attn", "model.visual.blocks.1.attn.qkv"
    expected = {
        f"{ENCODER}/patch_embed/proj/kernel": hf["model.visual.patch_embed.proj.weight"].transpose(
            2, 3, 4, 1, 0
        ),
        f"{ENCODER}/pos_embed_interpolate/pos_embed": hf["model.visual.pos_embed.weight"],
        f"{block}/query/kernel": hf[f"{qkv}.weight"][:32].T.reshape(32, 4, 8),
        f"{block}/key/kernel": hf[f"{qkv}.weight"][32:64].T.reshape(32, 4, 8),
        f"{block}/value/bias": hf[f"{qkv}.bias"][64:].reshape(4, 8),
        f"{block}/out/kernel": hf["model.visual.blocks.1.attn.proj.weight"].T.reshape(4, 8, 32),
        f"{ENCODER}/blocks_2/mlp_out/kernel": hf["model.visual.blocks.2.mlp.linear_fc2.weight"].T,
        f"{ENCODER}/merger_1/ln_q/scale": hf["model.visual.deepstack_merger_list.1.norm.weight"],
        f"{PROJECTOR}/mlp_0/kernel": hf["model.visual.merger.linear_fc1.weight"].T,
        f"{PROJECTOR}/ln_q/bias": hf["model.visual.merger.norm.bias"],
        "params/params/decoder/layers_1/mlp/wo/kernel": hf[
            "model.language_model.layers.1.mlp.down_proj.weight"
        ].T,
        "params/params/decoder/logits_dense/kernel": hf["lm_head.weight"].T,
    }
    for path, value in expected.items():
        np.testing.assert_array_equal(read[path], value, err_msg=path)
    assert read[f"{ENCODER}/merger_0/ln_q/scale"].shape == (32 * 2 * 2,)  # hidden x merge^2
    assert read[f"{PROJECTOR}/ln_q/scale"].shape == (32,)
    tower = [path for path in read if "vision_encoder" in path]
    assert len(tower) == 3 + 3 * 16 + 2 * 6 + 6  # embeddings, 3 blocks, 2 deepstack, final


def test_moe_experts_as_published_and_as_saved_give_one_tree(folders):
    root, _ = folders
    saved, published = _read(root / "moe-mt"), _read(root / "moe-published-mt")
    assert sorted(saved) == sorted(published)
    for path in saved:
        np.testing.assert_array_equal(saved[path], published[path], err_msg=path)
    hf = _tensors(root / "moe-published")
    layer = "model.language_model.layers.1.mlp.experts"
    gate_up = hf[f"{layer}.gate_up_proj"]  # (E, H, 2I): halves of the last axis, no transpose
    assert gate_up.shape == (4, 24, 16)
    moe = "params/params/decoder/layers_1/moe_block"
    np.testing.assert_array_equal(saved[f"{moe}/wi_0"], gate_up[:, :, :8])
    np.testing.assert_array_equal(saved[f"{moe}/wi_1"], gate_up[:, :, 8:])
    np.testing.assert_array_equal(saved[f"{moe}/wo"], hf[f"{layer}.down_proj"])
    assert "params/params/decoder/layers_1/mlp/wi_0/kernel" not in saved  # no dense MLP


def _features(model, pixels, grid):
    with torch.no_grad():
        out = model.get_image_features(pixels, grid)
    found = getattr(out, "pooler_output", None)
    parts = [found] if found is not None else []
    parts += list(getattr(out, "deepstack_features", None) or [])
    if not parts:  # a tuple (embeddings, deepstack features)
        parts = [out[0], *out[1]]
    flat = []
    for part in parts:
        flat += list(part) if isinstance(part, list | tuple) else [part]
    return [part.numpy() for part in flat]


@pytest.mark.parametrize("name", ["dense", "moe", "moe-published"])
def test_back_to_hf_loads_in_transformers_with_the_same_image_features(folders, name):
    root, models = folders
    model = models["moe" if name.startswith("moe") else "dense"]
    back = root / f"{name}-back"
    convert_with_recipe(root / f"{name}-mt", back, UNSCANNED, reverse=True, progress=False)
    written = _tensors(back)
    if name != "dense":  # the experts as published: the order transformers' loader converts
        assert written["model.language_model.layers.0.mlp.experts.gate_up_proj"].shape == (
            4,
            24,
            16,
        )
    assert sorted(written) == sorted(_tensors(root / name))
    loaded = type(model).from_pretrained(back).eval()
    original = {k: v.numpy() for k, v in model.state_dict().items()}
    for key, value in loaded.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), original[key], err_msg=key)
    rng = np.random.default_rng(0)
    pixels = torch.from_numpy(rng.standard_normal((16, 3 * 2 * 4 * 4))).float()
    grid = torch.tensor([[1, 4, 4]])  # one frame of 4 x 4 patches, merged 2 x 2
    expected, got = _features(model, pixels, grid), _features(loaded, pixels, grid)
    assert len(expected) == 3  # the merged features and the 2 deepstack features
    assert np.abs(expected[0]).max() > 0.1  # features that a wrong tower would change
    for one, other in zip(expected, got, strict=True):
        np.testing.assert_array_equal(other, one)


def test_a_scanned_recipe_refuses_deepstack_naming_the_unscanned_one(folders):
    root, _ = folders
    with pytest.raises(ConfigMismatchError, match=r"deepstack.*qwen3-vl:maxtext-unscanned"):
        convert_with_recipe(root / "dense", root / "never", SCANNED, progress=False)
    assert not (root / "never").exists()
    with pytest.raises(ConfigMismatchError, match=r"qwen3-vl:maxtext-unscanned"):
        convert_with_recipe(
            root / "dense-mt", root / "never", SCANNED, reverse=True, progress=False
        )


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_a_model_without_deepstack_converts_scanned_and_back(tmp_path, moe):
    _model(tmp_path / "hf", moe=moe, deepstack=())
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", SCANNED, progress=False)
    read = _read(tmp_path / "mt")
    if moe:  # experts and layers on the two leading axes
        assert read["params/params/decoder/layers/moe_block/wi_0"].shape == (4, 2, 24, 8)
        assert read["params/params/decoder/layers/moe_block/wo"].shape == (4, 2, 8, 24)
    else:
        assert read["params/params/decoder/layers/mlp/wo/kernel"].shape == (40, 2, 24)  # axis 1
    assert not any("merger_" in path for path in read)
    assert f"{ENCODER}/blocks_2/ln1/scale" in read  # the tower unscanned all the same
    convert_with_recipe(tmp_path / "mt", tmp_path / "back", SCANNED, reverse=True, progress=False)
    source, back = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert sorted(source) == sorted(back)
    for key, value in source.items():
        if key.endswith(("experts.gate_up_proj", "experts.down_proj")):
            value = value.transpose(0, 2, 1)  # saved (E, 2I, H), written back as published
        np.testing.assert_array_equal(back[key], value, err_msg=key)


def test_tied_embeddings_follow_the_outer_config(tmp_path):
    _model(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["tie_word_embeddings"] is False  # the outer one; text_config's may differ
    config["text_config"]["tie_word_embeddings"] = True
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", UNSCANNED, progress=False)
    assert "params/params/decoder/logits_dense/kernel" in suture.open(tmp_path / "mt").paths()


def test_moe_experts_whose_shape_cannot_tell_the_order_are_refused(tmp_path, monkeypatch):
    monkeypatch.setitem(MOE, "moe_intermediate_size", 12)  # 2 x 12 = hidden 24: square
    _model(tmp_path / "hf", moe=True)
    with pytest.raises(
        ConfigMismatchError, match=r"gate_up_proj' has shape \(4, 24, 24\).*cannot tell"
    ):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", UNSCANNED, progress=False)
    assert not (tmp_path / "mt").exists()


def test_back_like_a_saved_folder_writes_the_experts_in_its_order(folders):
    root, _ = folders
    back = root / "moe-back-like"
    convert_with_recipe(
        root / "moe-published-mt", back, UNSCANNED, reverse=True, like=root / "moe", progress=False
    )
    source, written = _tensors(root / "moe"), _tensors(back)
    assert sorted(source) == sorted(written)
    for key, value in source.items():  # (E, 2I, H) and (E, H, I), as save_pretrained wrote them
        np.testing.assert_array_equal(written[key], value, err_msg=key)


@pytest.mark.parametrize(
    "spec",
    [
        {"shape": ["a", "b"], "also_permuted": [0, 1]},  # the same order
        {"shape": ["a", "b"], "also_permuted": [1, 0], "extra": 1},
        ["a", "b"],
    ],
)
def test_a_stored_order_that_is_not_one_says_what_it_got(spec):
    from suture.families._stored_order import parse_stored

    with pytest.raises(suture.families.RecipeFormatError, match=r"leaves\[3\]\.stored.*; got "):
        parse_stored(spec, "leaves[3].stored")
