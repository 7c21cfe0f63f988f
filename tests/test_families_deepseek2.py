"""DeepSeek-V2: the deepseek2 recipes, proven with transformers' own DeepseekV2ForCausalLM.

Tiny random models (V2-Lite's plain query projection, and V2's query LoRA) in both of
transformers' expert layouts go to MaxText's layout and back bit for bit, scanned and
unscanned; the tree has the paths MaxText 0.2.5's converter (DEEPSEEK_MAXTEXT_TO_HF_PARAM_MAPPING,
model deepseek2-16b) names and the shapes its model gives them; and the MaxText-layout weights,
run through a JAX forward pass written from MaxText's DeepSeek layers (multi-head latent
attention, softmax routing, shared experts), give transformers' logits.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import suture
from suture import families
from suture.families._convert import convert_with_recipe

from .test_families import (
    TOKENS,
    _assert_refused,
    _assert_same_tensors,
    _assert_tree,
    _cli_round_trip,
    _cli_shows_family,
    _tensors,
    _vary_norms,
)
from .test_families_moe import _deepseek_logits, _routed_and_shared

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

# V2-Lite's shape, narrowed: 1 dense layer then MoE layers, no query LoRA, 2 shared experts
CONFIG = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=16,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=2,
    first_k_dense_replace=1,
    q_lora_rank=None,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    routed_scaling_factor=1.0,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
)
LORA = dict(q_lora_rank=24)  # V2 (236B)'s query path: q_a, its norm, q_b


def _save_model(folder, fused: bool = False, **extra) -> object:
    torch.manual_seed(0)
    config = transformers.DeepseekV2Config(**{**CONFIG, **extra})
    model = _vary_norms(transformers.DeepseekV2ForCausalLM(config).eval())
    model.save_pretrained(folder, save_original_format=not fused)
    return model


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
@pytest.mark.parametrize(
    ("fused", "extra"), [(False, {}), (True, {}), (False, LORA)], ids=["lite", "fused", "q-lora"]
)
def test_deepseek2_round_trip_is_bit_identical(tmp_path, layout, fused, extra):
    _save_model(tmp_path / "hf", fused=fused, **extra)
    name = f"deepseek2:{layout}"
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", name, progress=False)
    convert_with_recipe(
        tmp_path / "mt",
        tmp_path / "back",
        name,
        reverse=True,
        like=tmp_path / "hf",  # the expert layout the source has
        progress=False,
    )
    _assert_same_tensors(tmp_path / "hf", tmp_path / "back")
    assert transformers.DeepseekV2ForCausalLM.from_pretrained(tmp_path / "back") is not None


def _expected_shapes(scanned: bool) -> dict[str, tuple[int, ...]]:
    """MaxText's tree for CONFIG: the converter's names (its v2 keys, no router bias: MaxText's
    deepseek2-16b has routed_bias false), the model's shapes (scan axis 1, experts first)."""
    e, h, qk, kv, rope, v, moe, x = 64, 4, 24, 32, 8, 16, 16, 4
    attention = {
        "pre_self_attention_layer_norm/scale": (e,),
        "post_self_attention_layer_norm/scale": (e,),
        "self_attention/query/kernel": (e, h, qk),
        "self_attention/wkv_a/kernel": (e, kv + rope),
        "self_attention/kv_norm/scale": (kv,),
        "self_attention/wkv_b/kernel": (kv, h, 16 + v),
        "self_attention/out/kernel": (h, v, e),
    }
    block = "DeepSeekMoeBlock_0"
    moe_layer = {
        f"{block}/shared_experts/wi_0/kernel": (e, 2 * moe),
        f"{block}/shared_experts/wi_1/kernel": (e, 2 * moe),
        f"{block}/shared_experts/wo/kernel": (2 * moe, e),
        f"{block}/MoeBlock_0/gate/kernel": (e, x),
        f"{block}/MoeBlock_0/wi_0": (x, e, moe),
        f"{block}/MoeBlock_0/wi_1": (x, e, moe),
        f"{block}/MoeBlock_0/wo": (x, moe, e),
    }
    return _deepseek_tree(attention, moe_layer, scanned)


def _deepseek_tree(attention, moe, scanned: bool) -> dict[str, tuple[int, ...]]:
    """MaxText's tree for 1 dense then 2 MoE layers of CONFIG's sizes (hidden 64, MLP 96, 64
    tokens): `attention` in every layer, `moe` in the MoE layers; scanned, each leaf's layer
    axis is 1 (after the experts' axis, for the routed experts and the router bias)."""
    e, m = 64, 96
    dense = {**attention, "mlp/wi_0/kernel": (e, m), "mlp/wi_1/kernel": (e, m)}
    dense["mlp/wo/kernel"] = (m, e)
    shapes = {
        "token_embedder/embedding": (64, e),
        "decoder/decoder_norm/scale": (e,),
        "decoder/logits_dense/kernel": (e, 64),
    }
    for tree, count, leaves in (
        ("dense_layers", 1, dense),
        ("moe_layers", 2, {**attention, **moe}),
    ):
        for leaf, shape in leaves.items():
            if scanned:
                shapes[f"decoder/{tree}/{leaf}"] = (shape[0], count, *shape[1:])
            else:
                shapes.update({f"decoder/{tree}_{i}/{leaf}": shape for i in range(count)})
    return {f"params/params/{path}": shape for path, shape in shapes.items()}


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_deepseek2_tree_has_maxtexts_paths_and_shapes(tmp_path, layout):
    _save_model(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", f"deepseek2:{layout}", progress=False)
    ckpt = _assert_tree(tmp_path / "mt", _expected_shapes(layout == "maxtext"))
    hf = _tensors(tmp_path / "hf")
    scanned = layout == "maxtext"
    query = ckpt[
        f"params/params/decoder/{'moe_layers' if scanned else 'moe_layers_1'}"
        "/self_attention/query/kernel"
    ].read()
    # MoE layer 1 is HF layer 2; a plain transpose: rotary pairs kept, no query scaling
    np.testing.assert_array_equal(
        query[:, 1] if scanned else query,
        hf["model.layers.2.self_attn.q_proj.weight"].T.reshape(64, 4, 24),
    )


def test_deepseek2_with_query_lora_takes_v3s_query_leaves(tmp_path):
    _save_model(tmp_path / "hf", **LORA)
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "deepseek2:maxtext", progress=False)
    paths = suture.open(tmp_path / "mt").paths()
    attention = "params/params/decoder/dense_layers/self_attention"
    assert f"{attention}/wq_a/kernel" in paths and f"{attention}/q_norm/scale" in paths
    assert f"{attention}/wq_b/kernel" in paths and f"{attention}/query/kernel" not in paths


# Logits: MaxText's DeepSeek-V2 layers, written in JAX -----------------------------------------


def _moe(h, block, config):
    """Softmax scores, top-k, weights not renormalized (routed_score_func softmax)."""
    scores = jax.nn.softmax(h @ block["MoeBlock_0"]["gate"]["kernel"], axis=-1)
    weights, chosen = jax.lax.top_k(scores, config["num_experts_per_tok"])
    return _routed_and_shared(h, block, chosen, weights * config["routed_scaling_factor"])


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_deepseek2_maxtext_layout_gives_transformers_logits(tmp_path, layout):
    """Multi-head latent attention with V2-Lite's plain query projection, softmax routing."""
    model = _save_model(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", f"deepseek2:{layout}", progress=False)
    params = jax.tree.map(jnp.asarray, suture.load(tmp_path / "mt")["params"]["params"])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    ours = _deepseek_logits(params, config, jnp.asarray(TOKENS), _moe, scanned=layout == "maxtext")
    with torch.no_grad():
        theirs = model(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)


# Configs MaxText's DeepSeek-V2 cannot hold, and the command line --------------------------------


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (
            dict(attention_bias=True),
            "'attention_bias' is True: MaxText's DeepSeek attention has no",
        ),
        (dict(tie_word_embeddings=True), "'tie_word_embeddings' is True: MaxText's DeepSeek has"),
    ],
)
def test_deepseek2_refuses_a_config_maxtext_cannot_hold(tmp_path, extra, match):
    _save_model(tmp_path / "hf", **extra)
    _assert_refused(tmp_path, "deepseek2:maxtext", match)


def test_deepseek2_recipe_refuses_a_deepseek3_folder_naming_the_model_type(tmp_path):
    torch.manual_seed(0)
    v3 = {k: v for k, v in CONFIG.items() if k != "q_lora_rank"}
    transformers.DeepseekV3ForCausalLM(
        transformers.DeepseekV3Config(**v3, q_lora_rank=24, n_group=1, topk_group=1)
    ).save_pretrained(tmp_path / "hf")
    with pytest.raises(
        families.ConfigMismatchError, match="'model_type' is 'deepseek_v3'.*fits 'deepseek_v2'"
    ):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "deepseek2:maxtext", progress=False)
    assert not (tmp_path / "mt").exists()


def test_deepseek3_recipe_on_a_v2_lite_folder_names_the_model_type_first(tmp_path):
    """V2-Lite has no query LoRA (`q_lora_rank: null`), a field the deepseek3 table reads:
    the error names the family (the `require:` fields are checked before any other)."""
    _save_model(tmp_path / "hf")
    with pytest.raises(
        families.ConfigMismatchError, match="'model_type' is 'deepseek_v2'.*fits 'deepseek_v3'"
    ):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "deepseek3:maxtext", progress=False)
    assert not (tmp_path / "mt").exists()


def test_cli_lists_deepseek2_and_converts_both_ways(tmp_path):
    _save_model(tmp_path / "hf", fused=True)
    shown = _cli_shows_family("deepseek2", tmp_path / "hf" / "config.json")
    assert "DEEPSEEK_MAXTEXT_TO_HF_PARAM_MAPPING" in shown
    assert "decoder/moe_layers/self_attention/query/kernel" in shown
    assert "wq_a" not in shown  # V2-Lite: no query LoRA
    # fused experts back, as the --like folder has them
    _cli_round_trip(tmp_path, "deepseek2:maxtext", "--like", str(tmp_path / "hf"))
