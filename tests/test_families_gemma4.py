"""Gemma 4: the gemma4 recipes, proven with transformers' own Gemma4ForCausalLM (and
Gemma4ForConditionalGeneration for a multimodal folder).

Tiny random models, MoE (26B-A4B's shape: a shared expert, fused routed experts, a router
with its scale and per-expert scale) and dense (31B's), with two blocks of 5 local layers and
1 global layer whose head size and key-value heads are their own and whose keys are its
values, go to MaxText's layout and back bit for bit, scanned and unscanned; the tree has the
paths and shapes of MaxText 0.2.5's model (Gemma4ScannableBlock under
decoder/scanned_blocks: local_layers nested (blocks, local), global_layer on the scan axis),
each HF layer in its place. MaxText's own converter and model on the same folders are
bench/_maxtext_families.py's run.
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
    _cli_round_trip,
    _cli_shows_family,
    _tensors,
)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

E, HEADS, KV, D, GLOBAL_D, GLOBAL_KV, MLP, MOE, EXPERTS, V = 64, 4, 2, 16, 32, 1, 32, 16, 4, 64
TEXT = dict(
    vocab_size=V,
    hidden_size=E,
    intermediate_size=MLP,
    num_hidden_layers=12,
    num_attention_heads=HEADS,
    num_key_value_heads=KV,
    head_dim=D,
    global_head_dim=GLOBAL_D,
    num_global_key_value_heads=GLOBAL_KV,
    attention_k_eq_v=True,
    hidden_size_per_layer_input=0,
    sliding_window=8,
)
MOE_TEXT = dict(
    TEXT, enable_moe_block=True, num_experts=EXPERTS, top_k_experts=2, moe_intermediate_size=MOE
)
SCANNED = "params/params/decoder/scanned_blocks"


def _perturbed(model):
    torch.manual_seed(0)
    with torch.no_grad():  # no two tensors alike, so that a wrong mapping shows
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.add_(torch.randn_like(buffer) * 0.1)
    return model


def _save(folder, **text):
    torch.manual_seed(0)
    config = transformers.Gemma4TextConfig(**text)
    model = _perturbed(transformers.Gemma4ForCausalLM(config).eval())
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("moe") / "hf"
    _save(folder, **MOE_TEXT)
    return folder


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dense") / "hf"
    _save(folder, **TEXT)
    return folder


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
@pytest.mark.parametrize("model", ["moe", "dense"])
def test_gemma4_round_trip(tmp_path, request, model, layout):
    hf = request.getfixturevalue(model)
    name = f"gemma4:{layout}"
    convert_with_recipe(hf, tmp_path / "mt", name, progress=False)
    convert_with_recipe(tmp_path / "mt", tmp_path / "back", name, reverse=True, progress=False)
    _assert_same_tensors(hf, tmp_path / "back")


def test_scanned_gemma4_nests_the_local_layers_of_each_block_and_stacks_the_global_ones(
    tmp_path, moe
):
    convert_with_recipe(moe, tmp_path / "mt", "gemma4:maxtext", progress=False)
    ckpt = suture.open(tmp_path / "mt")
    hf = _tensors(moe)
    local, glob = f"{SCANNED}/local_layers", f"{SCANNED}/global_layer"
    shapes = {
        f"{local}/self_attention/query/kernel": (E, 2, 5, HEADS, D),
        f"{local}/self_attention/key/kernel": (E, 2, 5, KV, D),
        f"{local}/self_attention/value/kernel": (E, 2, 5, KV, D),
        f"{local}/self_attention/out/kernel": (HEADS, 2, 5, D, E),
        f"{local}/self_attention/query_norm/scale": (D, 2, 5),
        f"{glob}/self_attention/query/kernel": (E, 2, HEADS, GLOBAL_D),
        f"{glob}/self_attention/key/kernel": (E, 2, GLOBAL_KV, GLOBAL_D),
        f"{glob}/self_attention/out/kernel": (HEADS, 2, GLOBAL_D, E),
        f"{glob}/self_attention/key_norm/scale": (GLOBAL_D, 2),
        f"{local}/mlp/moe_block/MoeBlock_0/wi_0": (EXPERTS, 2, 5, E, MOE),
        f"{glob}/mlp/moe_block/MoeBlock_0/wo": (EXPERTS, 2, MOE, E),
        f"{glob}/mlp/moe_block/MoeBlock_0/gate/kernel": (E, 2, EXPERTS),
        f"{local}/mlp/moe_block/MoeBlock_0/per_expert_scale": (EXPERTS, 2, 5),
        f"{glob}/mlp/moe_block/shared_experts/wi_1/kernel": (E, 2, MLP),
        f"{local}/mlp/pre_forward_scale_2": (E, 2, 5),
        f"{local}/layer_scalar": (1, 2, 5),
        f"{glob}/post_ffw_norm/scale": (E, 2),
    }
    for path, shape in shapes.items():
        assert ckpt[path].shape == shape, path
    assert f"{glob}/self_attention/value/kernel" not in ckpt.paths()  # keys are values
    assert not any("/layers/" in path or "remainder" in path for path in ckpt.paths())
    # HF layer 6b + p at [:, b, p]; the global layer 6b + 5 at [:, b]
    query = ckpt[f"{local}/self_attention/query/kernel"].read()
    np.testing.assert_array_equal(
        query[:, 1, 3], hf["model.layers.9.self_attn.q_proj.weight"].T.reshape(E, HEADS, D)
    )
    key = ckpt[f"{glob}/self_attention/key/kernel"].read()
    np.testing.assert_array_equal(
        key[:, 1], hf["model.layers.11.self_attn.k_proj.weight"].T.reshape(E, GLOBAL_KV, GLOBAL_D)
    )
    gate_up = hf["model.layers.7.experts.gate_up_proj"]  # (experts, 2 x moe, hidden)
    wi_1 = ckpt[f"{local}/mlp/moe_block/MoeBlock_0/wi_1"].read()
    np.testing.assert_array_equal(wi_1[:, 1, 1], gate_up[:, MOE:].transpose(0, 2, 1))
    np.testing.assert_array_equal(
        ckpt[f"{glob}/mlp/moe_block/MoeBlock_0/per_expert_scale"].read()[:, 0],
        hf["model.layers.5.router.per_expert_scale"],
    )
    np.testing.assert_array_equal(  # norms as stored (not 1 + w)
        ckpt[f"{local}/pre_ffw_norm/scale"].read()[:, 0, 2],
        hf["model.layers.2.pre_feedforward_layernorm.weight"],
    )
    np.testing.assert_array_equal(
        ckpt[f"{glob}/layer_scalar"].read()[:, 1], hf["model.layers.11.layer_scalar"]
    )


def test_unscanned_gemma4_has_one_subtree_per_layer_with_its_kinds_shapes(tmp_path, dense):
    convert_with_recipe(dense, tmp_path / "mt", "gemma4:maxtext-unscanned", progress=False)
    ckpt = suture.open(tmp_path / "mt")
    decoder = "params/params/decoder"
    assert ckpt[f"{decoder}/layers_4/self_attention/query/kernel"].shape == (E, HEADS, D)
    assert ckpt[f"{decoder}/layers_5/self_attention/query/kernel"].shape == (E, HEADS, GLOBAL_D)
    assert ckpt[f"{decoder}/layers_11/self_attention/out/kernel"].shape == (HEADS, GLOBAL_D, E)
    assert f"{decoder}/layers_11/self_attention/value/kernel" not in ckpt.paths()
    assert ckpt[f"{decoder}/layers_10/self_attention/value/kernel"].shape == (E, KV, D)
    assert ckpt[f"{decoder}/layers_3/mlp/wi_0/kernel"].shape == (E, MLP)
    assert not any("moe_block" in path for path in ckpt.paths())


def test_the_embedding_is_multiplied_by_float32_sqrt_hidden_and_divided_back(tmp_path):
    """hidden 48: sqrt(48) is no power of two, and no bfloat16 (Gemma 3 rounds it: 6.9375)."""
    _save(tmp_path / "hf", **{**TEXT, "hidden_size": 48, "num_hidden_layers": 6})
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "gemma4:maxtext", progress=False)
    source = _tensors(tmp_path / "hf")["model.embed_tokens.weight"]
    factor = np.float32(np.sqrt(48))
    embedding = suture.open(tmp_path / "mt")["params/params/token_embedder/embedding"].read()
    np.testing.assert_array_equal(embedding, source * factor)  # MaxText's hook, in float32
    convert_with_recipe(
        tmp_path / "mt", tmp_path / "back", "gemma4:maxtext", reverse=True, progress=False
    )
    back = _tensors(tmp_path / "back")["model.embed_tokens.weight"]
    np.testing.assert_array_equal(back, embedding / factor)  # MaxText's inverse
    np.testing.assert_allclose(back, source, rtol=2**-23, atol=0)


def test_keys_apart_from_values_give_the_global_layers_a_value_kernel(tmp_path):
    _save(tmp_path / "hf", **{**TEXT, "attention_k_eq_v": False, "num_hidden_layers": 6})
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "gemma4:maxtext", progress=False)
    ckpt = suture.open(tmp_path / "mt")
    # without keys = values, transformers gives global layers the local KV head count
    assert ckpt[f"{SCANNED}/global_layer/self_attention/value/kernel"].shape == (E, 1, KV, GLOBAL_D)
    convert_with_recipe(
        tmp_path / "mt", tmp_path / "back", "gemma4:maxtext", reverse=True, progress=False
    )
    _assert_same_tensors(tmp_path / "hf", tmp_path / "back")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    with pytest.raises(families.ConfigMismatchError, match="value/kernel.*attention_k_eq_v"):
        convert_with_recipe(
            tmp_path / "mt",
            tmp_path / "again",
            "gemma4:maxtext",
            reverse=True,
            config={**config, "attention_k_eq_v": True},
            progress=False,
        )


def test_a_published_config_naming_the_global_sizes_converts_alike(tmp_path, dense):
    """transformers 5.24 writes per_layer_config; the published configs global_head_dim and
    num_global_key_value_heads: both read the same."""
    config = json.loads((dense / "config.json").read_text())
    assert "per_layer_config" in config and "global_head_dim" not in config
    published = {key: value for key, value in config.items() if key != "per_layer_config"}
    published.update(global_head_dim=GLOBAL_D, num_global_key_value_heads=GLOBAL_KV)
    convert_with_recipe(dense, tmp_path / "a", "gemma4:maxtext", progress=False)
    convert_with_recipe(dense, tmp_path / "b", "gemma4:maxtext", config=published, progress=False)
    a, b = suture.open(tmp_path / "a"), suture.open(tmp_path / "b")
    assert sorted(a.paths()) == sorted(b.paths())
    for path in a.paths():
        if path != "step":
            np.testing.assert_array_equal(a[path].read(), b[path].read(), err_msg=path)


def test_multimodal_gemma4_leaves_out_the_vision_tower_and_like_restores_it(tmp_path):
    vision = transformers.Gemma4VisionConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        position_embedding_size=64,
    )
    text = {**TEXT, "num_hidden_layers": 6}
    config = transformers.Gemma4Config(text_config=text, vision_config=vision.to_dict())
    torch.manual_seed(0)
    _perturbed(transformers.Gemma4ForConditionalGeneration(config)).save_pretrained(
        tmp_path / "hf", save_original_format=False
    )
    source = _tensors(tmp_path / "hf")
    with pytest.warns(families.LeftOutWarning, match="leaves out .* tensor.*--like"):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "gemma4:maxtext", progress=False)
    ckpt = suture.open(tmp_path / "mt")
    assert not any("vision" in path for path in ckpt.paths())
    np.testing.assert_array_equal(
        ckpt[f"{SCANNED}/local_layers/mlp/wo/kernel"].read()[:, 0, 4],
        source["model.language_model.layers.4.mlp.down_proj.weight"].T,
    )
    convert_with_recipe(
        tmp_path / "mt",
        tmp_path / "back",
        "gemma4:maxtext",
        reverse=True,
        like=tmp_path / "hf",
        progress=False,
    )
    _assert_same_tensors(tmp_path / "hf", tmp_path / "back")


# configs the recipe cannot write, refused before any byte is read ----------------------------


def test_a_layer_count_leaving_a_remainder_is_refused_both_ways(tmp_path):
    """8 layers: transformers makes layer 7 full attention (global shapes: it has no v_proj),
    where MaxText's remainder block (layers_remainder/local_layers) holds local layers only."""
    _save(tmp_path / "hf", **{**TEXT, "num_hidden_layers": 8, "layer_types": None})
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["layer_types"][7] == "full_attention"
    phrase = "'num_hidden_layers' is 8: transformers makes a Gemma 4's last layer full attention"
    _assert_refused(tmp_path, "gemma4:maxtext", phrase)
    _assert_refused(tmp_path, "gemma4:maxtext-unscanned", phrase)
    with pytest.raises(families.ConfigMismatchError, match=phrase):
        families.get_recipe("gemma4:maxtext").to_hf({}, config)


@pytest.mark.parametrize(
    ("change", "phrase"),
    [
        (
            dict(hidden_size_per_layer_input=16),
            "'hidden_size_per_layer_input' is 16: this Gemma 4 has per-layer embeddings "
            r"\(E2B, E4B\): convert it with the gemma4-small recipes",
        ),
        (dict(num_kv_shared_layers=2), "'num_kv_shared_layers' is 2: .*gemma4-small"),
        (
            dict(layer_types=(["sliding_attention"] * 4 + ["full_attention"] * 2) * 2),
            "'layer_types' makes layer 4 'full_attention'; recipe 'gemma4:maxtext' expects "
            "'sliding_attention'",
        ),
        (dict(tie_word_embeddings=False), "'tie_word_embeddings' is False"),
        (
            dict(model_type="gemma3_text"),
            "'model_type' is 'gemma3_text'; recipe 'gemma4:maxtext' fits 'gemma4_text'",
        ),
        (
            dict(per_layer_config={"5": {"head_dim": 32}, "11": {"head_dim": 64}}),
            "gives layer 5 head_dim=32 and layer 11 head_dim=64, both 'full_attention' layers",
        ),
        (dict(enable_moe_block=True, num_experts=1), "'num_experts' is 1: MaxText's Gemma 4"),
    ],
)
def test_configs_the_recipe_cannot_write_are_refused_naming_the_field(
    tmp_path, dense, change, phrase
):
    config = json.loads((dense / "config.json").read_text())
    with pytest.raises(families.ConfigMismatchError, match=phrase):
        convert_with_recipe(
            dense, tmp_path / "mt", "gemma4:maxtext", config={**config, **change}, progress=False
        )
    assert not (tmp_path / "mt").exists()


def test_a_global_value_projection_the_config_says_is_the_key_is_refused(tmp_path, dense):
    """A folder holding tensors no leaf uses is an error, not silently dropped."""
    from safetensors.numpy import save_file

    folder = tmp_path / "hf"
    folder.mkdir()
    tensors = _tensors(dense)
    tensors["model.layers.5.self_attn.v_proj.weight"] = tensors[
        "model.layers.5.self_attn.k_proj.weight"
    ]
    save_file(tensors, folder / "model.safetensors")
    (folder / "config.json").write_text((dense / "config.json").read_text())
    _assert_refused(
        tmp_path, "gemma4:maxtext", r"v_proj.weight.* for N = 0-10\): layer 5 would be lost"
    )


def test_cli_lists_gemma4_and_converts_both_ways(tmp_path, moe):
    shown = _cli_shows_family("gemma4", moe / "config.json")
    assert "GEMMA4_MAXTEXT_TO_HF_PARAM_MAPPING" in shown
    assert "multiply by sqrt(hidden_size) = 8" in shown
    (tmp_path / "hf").symlink_to(moe)
    _cli_round_trip(tmp_path, "gemma4:maxtext-unscanned")
