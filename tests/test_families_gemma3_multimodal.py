"""The gemma3:maxtext-multimodal recipe: Gemma 3 whole, its SigLIP tower and projector beside the
language model in MaxText's multimodal tree, both directions.

Tiny random `Gemma3ForConditionalGeneration` models (`save_pretrained`) go to MaxText's layout
and back; the folder written back loads in transformers and gives the same image features. The
tower has MaxText's 4096-row position table (its gemma3 configs build (896 // 14)^2 rows):
here a 64x64 image in patches of 1.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import suture
from suture.families._convert import convert_with_recipe

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

RECIPE = "gemma3:maxtext-multimodal"
TEXT = dict(
    vocab_size=64,
    hidden_size=64,  # the embedding's factor bfloat16(sqrt(64)) = 8: exact both ways
    intermediate_size=32,
    num_hidden_layers=7,  # one period of 6 and one left over
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    query_pre_attn_scalar=16,
    sliding_window=16,
)
VISION = dict(
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=64,
    patch_size=1,  # (64 // 1)^2 = 4096 positions, as MaxText's table
)
TOWER = "params/params/vision_encoder/Gemma3VisionEncoderLayer_0"
HALF_ULP_OF_ONE = np.spacing(np.float32(1)) / 2


def _model(folder, head=False):
    torch.manual_seed(0)
    config = transformers.Gemma3Config(
        text_config=TEXT,
        vision_config={**VISION, "vision_use_head": head},
        mm_tokens_per_image=16,
    )
    model = transformers.Gemma3ForConditionalGeneration(config)
    with torch.no_grad():  # norms and biases away from 1 and 0, so that a mix-up shows
        for name, parameter in model.named_parameters():
            if "norm" in name or "bias" in name or "projection" in name:  # (that one is zeros)
                parameter.add_(torch.randn_like(parameter) * 0.1)
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
        if "norm" in key and "vision_tower" not in key:  # 1 + w and back: half an ulp of 1
            np.testing.assert_allclose(back[key], source[key], rtol=0, atol=HALF_ULP_OF_ONE)
        else:
            np.testing.assert_array_equal(back[key], source[key], err_msg=key)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma3mm")
    model = _model(folder / "hf")
    convert_with_recipe(folder / "hf", folder / "mt", RECIPE, progress=False)
    return folder, model


def test_the_tower_goes_to_maxtexts_multimodal_tree_unscanned(converted):
    folder, _ = converted
    hf = _tensors(folder / "hf")  # transformers 5.24 writes the tower under vision_tower.
    ckpt = suture.open(folder / "mt")
    read = {path: ckpt[path].read() for path in ckpt.paths() if "vision_encoder" in path}
    layer = "vision_tower.encoder.layers.1"
    block = f"{TOWER}/Transformer/encoderblock_1"
    expected = {
        f"{TOWER}/embedding/kernel": hf["vision_tower.embeddings.patch_embedding.weight"].transpose(
            2, 3, 1, 0
        ),
        f"{TOWER}/pos_embedding": hf["vision_tower.embeddings.position_embedding.weight"][None],
        f"{TOWER}/Transformer/encoder_norm/scale": hf["vision_tower.post_layernorm.weight"],
        f"{block}/LayerNorm_0/scale": hf[f"{layer}.layer_norm1.weight"],  # SigLIP's: as stored
        f"{block}/MultiHeadDotProductAttention_0/query/kernel": hf[
            f"{layer}.self_attn.q_proj.weight"
        ].T.reshape(16, 2, 8),
        f"{block}/MultiHeadDotProductAttention_0/key/bias": hf[
            f"{layer}.self_attn.k_proj.bias"
        ].reshape(2, 8),
        f"{block}/MultiHeadDotProductAttention_0/out/kernel": hf[
            f"{layer}.self_attn.out_proj.weight"
        ].T.reshape(2, 8, 16),
        f"{block}/MlpBlockViT_0/Dense_1/kernel": hf[f"{layer}.mlp.fc2.weight"].T,
        "params/params/vision_encoder/VisionEmbedder_0/mm_input_projection/w": hf[
            "multi_modal_projector.mm_input_projection_weight"
        ],  # as stored, not transposed
        "params/params/vision_encoder/VisionEmbedder_0/mm_soft_embedding_norm/scale": hf[
            "multi_modal_projector.mm_soft_emb_norm.weight"
        ]
        + 1,
    }
    for path, value in expected.items():
        np.testing.assert_array_equal(read[path], value, err_msg=path)
    assert read[f"{TOWER}/pos_embedding"].shape == (1, 4096, 16)
    assert len(read) == 5 + 16 * 2 + 2  # the tower, 2 blocks of 16, the projector
    # the language model as gemma3:maxtext writes it: scanned, the period's remainder unscanned
    assert "params/params/decoder/layers/layers_5/mlp/wo/kernel" in ckpt.paths()
    assert "params/params/decoder/layers_remainder/layers_0/mlp/wo/kernel" in ckpt.paths()


def test_back_to_hf_loads_in_transformers_with_the_same_image_features(converted):
    folder, model = converted
    convert_with_recipe(folder / "mt", folder / "back", RECIPE, reverse=True, progress=False)
    back = transformers.Gemma3ForConditionalGeneration.from_pretrained(folder / "back").eval()
    original = {k: v.numpy() for k, v in model.state_dict().items()}
    _assert_same(original, {k: v.numpy() for k, v in back.state_dict().items()})
    pixels = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 3, 64, 64))).float()
    with torch.no_grad():
        expected, got = model.get_image_features(pixels), back.get_image_features(pixels)
    expected = getattr(expected, "pooler_output", expected)
    got = getattr(got, "pooler_output", got)
    assert np.abs(expected.numpy()).max() > 0.1  # features that a wrong tower would change
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=1e-6)


def test_like_writes_the_tower_under_the_original_names(converted):
    folder, _ = converted
    convert_with_recipe(
        folder / "mt", folder / "like", RECIPE, reverse=True, like=folder / "hf", progress=False
    )
    _assert_same(_tensors(folder / "hf"), _tensors(folder / "like"))


FORMS = {  # where folders keep the tower: transformers 5.24's save_pretrained writes vision_tower.
    "published": ("vision_tower.", "vision_tower.vision_model."),  # Google's folders
    "transformers-v5": ("vision_tower.", "model.vision_tower."),  # save_original_format=False
    "maxtext-mapping": ("vision_tower.", "model.vision_tower.vision_model."),  # MaxText's names
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_form_of_the_tower_names_gives_the_same_maxtext_tree(converted, tmp_path, form):
    folder, _ = converted
    old, new = FORMS[form]
    projector = "model." if form != "published" else ""
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    tensors = {}
    for name, value in _tensors(folder / "hf").items():
        if name.startswith(old):
            name = new + name[len(old) :]
        elif name.startswith("multi_modal_projector."):
            name = projector + name
        tensors[name] = value
    save_file(tensors, renamed / "model.safetensors")
    (renamed / "config.json").write_text((folder / "hf" / "config.json").read_text())
    convert_with_recipe(renamed, tmp_path / "mt", RECIPE, progress=False)
    ours, theirs = suture.open(tmp_path / "mt"), suture.open(folder / "mt")
    assert sorted(ours.paths()) == sorted(theirs.paths())
    for path in ours.paths():
        np.testing.assert_array_equal(ours[path].read(), theirs[path].read(), err_msg=path)
    convert_with_recipe(
        tmp_path / "mt", tmp_path / "back", RECIPE, reverse=True, like=renamed, progress=False
    )
    _assert_same(tensors, _tensors(tmp_path / "back"))


def test_siglips_head_is_left_out_and_like_restores_it(tmp_path):
    _model(tmp_path / "hf", head=True)
    source = _tensors(tmp_path / "hf")
    with pytest.warns(suture.families.LeftOutWarning, match=r"vision_model\.head\..* and 10 more"):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", RECIPE, progress=False)
    assert not any("head" in path for path in suture.open(tmp_path / "mt").paths())
    convert_with_recipe(
        tmp_path / "mt",
        tmp_path / "back",
        RECIPE,
        reverse=True,
        like=tmp_path / "hf",
        progress=False,
    )
    _assert_same(source, _tensors(tmp_path / "back"))


def test_a_text_only_folder_or_config_is_refused_naming_the_text_recipe(converted, tmp_path):
    folder, _ = converted
    config = json.loads((folder / "hf" / "config.json").read_text())
    with pytest.raises(suture.families.ConfigMismatchError, match="vision_config.*gemma3:maxtext"):
        convert_with_recipe(
            folder / "hf", tmp_path / "a", RECIPE, config=config["text_config"], progress=False
        )
    text = tmp_path / "text"
    text.mkdir()
    save_file(
        {k: v for k, v in _tensors(folder / "hf").items() if k.startswith("language_model.")},
        text / "model.safetensors",
    )
    (text / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        suture.families.ConfigMismatchError, match="no vision tower.*gemma3:maxtext"
    ):
        convert_with_recipe(text, tmp_path / "b", RECIPE, progress=False)
    convert_with_recipe(text, tmp_path / "textmt", "gemma3:maxtext", progress=False)
    recipe = suture.families.get_recipe(RECIPE)
    with pytest.raises(suture.families.ConfigMismatchError, match="vision_encoder.*gemma3:maxtext"):
        recipe.to_hf(suture.open(tmp_path / "textmt").tree, config)


def test_a_tower_table_of_ones_own_converts_as_the_built_in(converted, tmp_path):
    from importlib.resources import files

    folder, _ = converted
    table = tmp_path / "my_gemma3.yaml"
    table.write_text(files("suture.families").joinpath("gemma3-multimodal.yaml").read_text())
    convert_with_recipe(folder / "hf", tmp_path / "mt", str(table), progress=False)
    ours, theirs = suture.open(tmp_path / "mt"), suture.open(folder / "mt")
    assert sorted(ours.paths()) == sorted(theirs.paths())
    with pytest.raises(suture.RecipeError, match="tower table.*without a layout"):
        convert_with_recipe(
            folder / "hf", tmp_path / "u", f"{table}:maxtext-unscanned", progress=False
        )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.pop("text"), "text: is needed in a tower table"),
        (lambda t: t.update(target="maxtext"), "text: is only in a tower table"),
        (
            lambda t: t["tower"].update(prefixes=["x."]),
            r"'tower' needs.*; got .*'prefixes': \['x\.'\]",
        ),
    ],
)
def test_a_tower_table_is_checked_as_a_whole(edit, message):
    from importlib.resources import files

    import yaml

    from suture.families._schema import checked_table

    table = yaml.safe_load(files("suture.families").joinpath("gemma3-multimodal.yaml").read_text())
    edit(table)
    with pytest.raises(suture.families.RecipeFormatError, match=message):
        checked_table(table, "t.yaml")


def test_the_whole_model_streams_within_a_small_memory_budget(converted, tmp_path):
    folder, _ = converted
    convert_with_recipe(folder / "hf", tmp_path / "mt", RECIPE, max_memory="1MiB", progress=False)
    ours, theirs = suture.open(tmp_path / "mt"), suture.open(folder / "mt")
    assert sorted(ours.paths()) == sorted(theirs.paths())
    for path in ours.paths():
        np.testing.assert_array_equal(ours[path].read(), theirs[path].read(), err_msg=path)
