"""The qwen3.5:maxtext-multimodal recipe: Qwen3.5 whole, its vision tower and final merger beside
the language model (as qwen3.5:maxtext writes it) in MaxText's multimodal tree, both directions.

A tiny random `Qwen3_5MoeForConditionalGeneration` (`save_pretrained`) goes to MaxText's layout and
back; the folder written back loads in transformers and gives the same image features.
"""

from __future__ import annotations

import numpy as np
import pytest

import suture
from suture.families._convert import convert_with_recipe

from .test_families_qwen35 import _model

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

RECIPE = "qwen3.5:maxtext-multimodal"
ENCODER = "params/params/vision_encoder/Qwen3_5MoeVisionEncoder_0"
PROJECTOR = "params/params/vision_encoder/Qwen3_5MoeVisionProjector_0/merger"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen35mm")
    model = _model(multimodal=True)
    model.save_pretrained(folder / "hf")
    convert_with_recipe(folder / "hf", folder / "mt", RECIPE, progress=False)
    return folder, model


def _tensors(folder) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def test_the_tower_goes_beside_the_scanned_language_model(converted):
    folder, _ = converted
    hf = _tensors(folder / "hf")
    ckpt = suture.open(folder / "mt")
    read = {path: ckpt[path].read() for path in ckpt.paths() if "vision_encoder" in path}
    qkv = "model.visual.blocks.0.attn.qkv"
    expected = {
        f"{ENCODER}/patch_embed/proj/kernel": hf["model.visual.patch_embed.proj.weight"].transpose(
            2, 3, 4, 1, 0
        ),
        f"{ENCODER}/pos_embed_interpolate/pos_embed": hf["model.visual.pos_embed.weight"],
        f"{ENCODER}/blocks_0/attn/attn/value/kernel": hf[f"{qkv}.weight"][32:].T.reshape(16, 2, 8),
        f"{ENCODER}/blocks_0/attn/attn/key/bias": hf[f"{qkv}.bias"][16:32].reshape(2, 8),
        f"{PROJECTOR}/mlp_2/kernel": hf["model.visual.merger.linear_fc2.weight"].T,
    }
    for path, value in expected.items():
        np.testing.assert_array_equal(read[path], value, err_msg=path)
    assert len(read) == 3 + 16 + 6  # embeddings, one block, the final merger
    assert "params/params/decoder/layers/layer_3/mlp/routed_experts/wo" in ckpt.paths()


def test_back_to_hf_loads_in_transformers_with_the_same_image_features(converted):
    folder, model = converted
    convert_with_recipe(folder / "mt", folder / "back", RECIPE, reverse=True, progress=False)
    assert sorted(_tensors(folder / "back")) == sorted(_tensors(folder / "hf"))
    back = type(model).from_pretrained(folder / "back").eval()
    original = {k: v.numpy() for k, v in model.state_dict().items()}
    for key, value in back.state_dict().items():
        np.testing.assert_array_equal(value.numpy(), original[key], err_msg=key)
    pixels = torch.from_numpy(np.random.default_rng(0).standard_normal((16, 3 * 2 * 4 * 4))).float()
    grid = torch.tensor([[1, 4, 4]])
    with torch.no_grad():
        expected, got = (
            model.get_image_features(pixels, grid),
            back.get_image_features(pixels, grid),
        )
    expected = getattr(expected, "pooler_output", expected)
    got = getattr(got, "pooler_output", got)
    expected = torch.cat(list(expected)) if isinstance(expected, list | tuple) else expected
    got = torch.cat(list(got)) if isinstance(got, list | tuple) else got
    assert np.abs(expected.numpy()).max() > 0.1  # features that a wrong tower would change
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
