"""The qwen3-omni:maxtext-unscanned and :maxtext recipes: Qwen3-Omni's thinker whole (the text
MoE, the vision tower with its deepstack mergers, the audio encoder) in MaxText's multimodal tree,
both directions, the talker and code2wav left out and restored by ``--like``.

A tiny random `Qwen3OmniMoeForConditionalGeneration` (`save_pretrained`, speech output on, so
its folder holds ``talker.*`` and ``code2wav.*`` as published ones do) goes to MaxText's layout
and back; the folder written back loads in transformers and gives the same image features,
audio features and thinker logits.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file

import suture
from suture._errors import ConfigMismatchError, SurgeryError
from suture.families._convert import convert_with_recipe
from suture.families._multimodal import LeftOutWarning

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

UNSCANNED = "qwen3-omni:maxtext-unscanned"
SCANNED = "qwen3-omni:maxtext"
TEXT = dict(
    vocab_size=128,
    hidden_size=24,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    moe_intermediate_size=8,
    num_experts=4,
    num_experts_per_tok=2,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 1e6,
        "mrope_section": [1, 1, 2],
        "interleaved": True,
    },
)
VISION = dict(
    depth=3,
    hidden_size=32,
    intermediate_size=48,
    num_heads=4,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=2,
    out_hidden_size=24,
    num_position_embeddings=16,
    deepstack_visual_indexes=[0, 2],
)
AUDIO = dict(
    num_mel_bins=16,
    encoder_layers=2,
    encoder_attention_heads=4,
    encoder_ffn_dim=40,
    d_model=32,
    output_dim=24,
    downsample_hidden_size=8,
    max_source_positions=64,
    n_window=50,  # transformers 5.24 counts 13 frames per 100-frame chunk: 50 only
    n_window_infer=100,
    conv_chunksize=50,
)
SPEECH = dict(  # the talker and code2wav, as small as their configs allow
    talker_config=dict(
        text_config=dict(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            moe_intermediate_size=8,
            num_experts=2,
            num_experts_per_tok=1,
            shared_expert_intermediate_size=8,
        ),
        code_predictor_config=dict(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            num_code_groups=2,
        ),
        thinker_hidden_size=24,
        accept_hidden_layer=1,
        num_code_groups=2,
        spatial_merge_size=2,  # transformers 5.24's talker reads it and its config lacks it
    ),
    code2wav_config=dict(
        codebook_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        num_quantizers=2,
        decoder_dim=16,
        upsample_rates=[2, 2],
        upsampling_ratios=[2, 2],
        sliding_window=8,
    ),
)
ROOT = "params/params"
VISUAL = f"{ROOT}/vision_encoder/Qwen3OmniMoeVisionEncoder_0"
PROJECTOR = f"{ROOT}/vision_encoder/Qwen3OmniMoeVisionProjector_0/merger"
AUDIO_ENCODER = f"{ROOT}/audio_encoder/Qwen3OmniAudioEncoder_0"
AUDIO_PROJECTOR = f"{ROOT}/audio_encoder/Qwen3OmniAudioProjector_0"


def _model(folder, deepstack=(0, 2)):
    torch.manual_seed(0)
    config = transformers.Qwen3OmniMoeConfig(
        thinker_config=dict(
            text_config=TEXT,
            vision_config={**VISION, "deepstack_visual_indexes": list(deepstack)},
            audio_config=AUDIO,
        ),
        enable_audio_output=True,
        **SPEECH,
    )
    model = transformers.Qwen3OmniMoeForConditionalGeneration(config)
    with torch.no_grad():  # norms and biases away from 1 and 0, so that a mix-up shows
        for name, parameter in model.named_parameters():
            if "norm" in name or "bias" in name or "ln_" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(folder)
    return model.eval()


def _tensors(folder) -> dict[str, np.ndarray]:
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def _read(folder) -> dict[str, np.ndarray]:
    ckpt = suture.open(folder)
    return {path: ckpt[path].read() for path in ckpt.paths() if path != "step"}


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    root = tmp_path_factory.mktemp("omni")
    model = _model(root / "hf")
    with pytest.warns(LeftOutWarning) as caught:
        convert_with_recipe(root / "hf", root / "mt", UNSCANNED, progress=False)
    return root, model, [str(warning.message) for warning in caught]


def test_the_thinker_goes_to_maxtexts_multimodal_tree(omni):
    root, _, _ = omni
    hf, read = _tensors(root / "hf"), _read(root / "mt")
    qkv, block = "thinker.visual.blocks.1.attn.qkv", f"{VISUAL}/blocks_1/attn/attn"
    audio, layer = "thinker.audio_tower", f"{AUDIO_ENCODER}/layers_1"
    expected = {
        f"{ROOT}/decoder/logits_dense/kernel": hf["thinker.lm_head.weight"].T,
        f"{ROOT}/token_embedder/embedding": hf["thinker.model.embed_tokens.weight"],
        f"{ROOT}/decoder/layers_1/moe_block/wi_1": np.stack(
            [hf[f"thinker.model.layers.1.mlp.experts.{e}.up_proj.weight"].T for e in range(4)]
        ),
        f"{VISUAL}/patch_embed/proj/kernel": hf["thinker.visual.patch_embed.proj.weight"].transpose(
            2, 3, 4, 1, 0
        ),
        f"{block}/key/kernel": hf[f"{qkv}.weight"][32:64].T.reshape(32, 4, 8),
        f"{block}/value/bias": hf[f"{qkv}.bias"][64:].reshape(4, 8),
        f"{VISUAL}/merger_1/ln_q/scale": hf["thinker.visual.merger_list.1.ln_q.weight"],
        f"{VISUAL}/merger_1/mlp_2/kernel": hf["thinker.visual.merger_list.1.mlp.2.weight"].T,
        f"{PROJECTOR}/mlp_0/bias": hf["thinker.visual.merger.mlp.0.bias"],
        f"{AUDIO_ENCODER}/conv2d1/kernel": hf[f"{audio}.conv2d1.weight"].transpose(2, 3, 1, 0),
        f"{AUDIO_ENCODER}/conv2d3/bias": hf[f"{audio}.conv2d3.bias"],
        f"{AUDIO_ENCODER}/conv_out/kernel": hf[f"{audio}.conv_out.weight"].T,
        f"{layer}/self_attention_audio/query/kernel": hf[
            f"{audio}.layers.1.self_attn.q_proj.weight"
        ].T.reshape(32, 4, 8),
        f"{layer}/self_attention_audio/value/bias": hf[
            f"{audio}.layers.1.self_attn.v_proj.bias"
        ].reshape(4, 8),
        f"{layer}/self_attention_audio/out/kernel": hf[
            f"{audio}.layers.1.self_attn.out_proj.weight"
        ].T.reshape(4, 8, 32),
        f"{layer}/input_layer_norm/bias": hf[f"{audio}.layers.1.self_attn_layer_norm.bias"],
        f"{layer}/post_attention_layer_norm/scale": hf[f"{audio}.layers.1.final_layer_norm.weight"],
        f"{layer}/AudioMLP/wo/kernel": hf[f"{audio}.layers.1.fc2.weight"].T,
        f"{AUDIO_ENCODER}/layernorm_post/scale": hf[f"{audio}.ln_post.weight"],
        f"{AUDIO_PROJECTOR}/proj2/kernel": hf[f"{audio}.proj2.weight"].T,
    }
    for path, value in expected.items():
        np.testing.assert_array_equal(read[path], value, err_msg=path)
    assert read[f"{AUDIO_ENCODER}/conv2d2/kernel"].shape == (3, 3, 8, 8)
    assert f"{AUDIO_ENCODER}/conv_out/bias" not in read  # conv_out has none
    towers = [path for path in read if "_encoder/" in path]
    thinker_towers = [name for name in hf if name.startswith(("thinker.visual.", f"{audio}."))]
    # one leaf per tensor, but q, k and v: three leaves each of the fused qkv weight and bias
    assert len(towers) == len(thinker_towers) + 3 * 4
    assert not any("talker" in path or "code2wav" in path for path in read)


def test_the_talker_and_code2wav_are_left_out_with_their_counts(omni):
    root, _, messages = omni
    hf = _tensors(root / "hf")
    talker = sum(name.startswith("talker.") for name in hf)
    code2wav = sum(name.startswith("code2wav.") for name in hf)
    assert talker and code2wav
    (message,) = messages
    assert f"leaves out {talker + code2wav} tensor(s)" in message
    assert "talker." in message and f"and {talker - 1} more" in message
    assert "code2wav." in message and f"and {code2wav - 1} more" in message
    assert "--reverse --like ORIGINAL" in message


def _outputs(model):
    thinker = model.thinker
    rng = np.random.default_rng(0)
    pixels = torch.from_numpy(rng.standard_normal((16, 3 * 2 * 4 * 4))).float()
    grid = torch.tensor([[1, 4, 4]])  # one frame of 4 x 4 patches, merged 2 x 2
    mel = torch.from_numpy(rng.standard_normal((1, 16, 150))).float()
    mask = torch.ones((1, 150), dtype=torch.long)
    ids = torch.from_numpy(rng.integers(0, 128, (1, 7)))
    with torch.no_grad():
        image = thinker.get_image_features(pixels, grid)
        audio = thinker.get_audio_features(mel, feature_attention_mask=mask)
        logits = thinker(input_ids=ids).logits
    parts = [*image.pooler_output, *(f for feat in image.deepstack_features for f in feat)]
    parts += [audio.last_hidden_state, logits]
    return [part.numpy() for part in parts]


def test_back_to_hf_like_the_original_loads_with_the_same_features_and_logits(omni):
    root, model, _ = omni
    back = root / "back"
    convert_with_recipe(
        root / "mt", back, UNSCANNED, reverse=True, like=root / "hf", progress=False
    )
    source, written = _tensors(root / "hf"), _tensors(back)
    assert sorted(written) == sorted(source)  # the talker and code2wav restored
    for name, value in source.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
    loaded = type(model).from_pretrained(back).eval()
    expected, got = _outputs(model), _outputs(loaded)
    assert len(expected) == 1 + 2 + 2  # image, 2 deepstack features, audio, logits
    assert all(np.abs(part).max() > 0.1 for part in expected)  # that a wrong tower changes
    for one, other in zip(expected, got, strict=True):
        np.testing.assert_array_equal(other, one)


def test_back_to_hf_without_like_writes_the_thinker(omni):
    root, _, _ = omni
    convert_with_recipe(root / "mt", root / "thinker", UNSCANNED, reverse=True, progress=False)
    source, written = _tensors(root / "hf"), _tensors(root / "thinker")
    assert sorted(written) == sorted(name for name in source if name.startswith("thinker."))
    for name, value in written.items():
        np.testing.assert_array_equal(value, source[name], err_msg=name)


def test_a_scanned_recipe_refuses_deepstack_naming_the_unscanned_one(omni):
    root, _, _ = omni
    with pytest.raises(ConfigMismatchError, match=r"deepstack.*qwen3-omni:maxtext-unscanned"):
        convert_with_recipe(root / "hf", root / "never", SCANNED, progress=False)
    assert not (root / "never").exists()


def test_a_config_without_the_audio_encoders_is_refused_naming_it(omni, tmp_path):
    root, _, _ = omni
    folder = tmp_path / "hf"
    folder.mkdir()
    for file in (root / "hf").iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    del config["thinker_config"]["audio_config"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigMismatchError, match=r"thinker_config\.audio_config"):
        convert_with_recipe(folder, tmp_path / "mt", UNSCANNED, progress=False)
    assert not (tmp_path / "mt").exists()


def test_the_language_model_alone_leaves_the_towers_out_and_back(omni):
    root, _, _ = omni
    with pytest.warns(LeftOutWarning, match=r"thinker\.visual\..*thinker\.audio_tower\."):
        convert_with_recipe(
            root / "hf", root / "text-mt", "qwen3-omni-text:maxtext", progress=False
        )
    read = _read(root / "text-mt")
    assert not any("_encoder/" in path for path in read)
    assert read[f"{ROOT}/decoder/layers/moe_block/wo"].shape == (4, 2, 8, 24)  # scanned
    convert_with_recipe(
        root / "text-mt",
        root / "text-back",
        "qwen3-omni-text:maxtext",
        reverse=True,
        like=root / "hf",
        progress=False,
    )
    source, written = _tensors(root / "hf"), _tensors(root / "text-back")
    assert sorted(written) == sorted(source)
    for name, value in source.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)


def test_a_model_without_deepstack_converts_scanned_and_back(tmp_path):
    _model(tmp_path / "hf", deepstack=())
    with pytest.warns(LeftOutWarning, match="talker"):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", SCANNED, progress=False)
    read = _read(tmp_path / "mt")
    assert read[f"{ROOT}/decoder/layers/moe_block/wi_0"].shape == (4, 2, 24, 8)  # scan axis 1
    assert not any("merger_" in path for path in read)
    assert f"{AUDIO_ENCODER}/layers_1/AudioMLP/wi/kernel" in read  # the towers unscanned
    convert_with_recipe(
        tmp_path / "mt",
        tmp_path / "back",
        SCANNED,
        reverse=True,
        like=tmp_path / "hf",
        progress=False,
    )
    source, back = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert sorted(source) == sorted(back)
    for key, value in source.items():
        np.testing.assert_array_equal(back[key], value, err_msg=key)


def test_tied_embeddings_follow_the_thinker_config(omni, tmp_path):
    root, _, _ = omni
    folder = tmp_path / "hf"
    folder.mkdir()
    for file in (root / "hf").iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    config = json.loads((folder / "config.json").read_text())
    assert config["thinker_config"]["tie_word_embeddings"] is False
    config["thinker_config"]["tie_word_embeddings"] = True  # beside text_config, not in it
    (folder / "config.json").write_text(json.dumps(config))
    with (
        pytest.warns(LeftOutWarning),
        pytest.raises(SurgeryError, match=r"no place for 1 tensor.*lm_head\.weight"),
    ):
        convert_with_recipe(folder, tmp_path / "mt", UNSCANNED, progress=False)
