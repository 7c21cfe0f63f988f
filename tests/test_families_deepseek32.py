"""DeepSeek-V3.2: the deepseek3.2 recipes, proven with transformers' own DeepseekV32ForCausalLM.

Tiny random models in both of transformers' expert layouts go to MaxText's layout and back bit
for bit, scanned and unscanned; the tree has the paths MaxText 0.2.5's converter
(DEEPSEEK_MAXTEXT_TO_HF_PARAM_MAPPING with its v3.2 indexer keys) names and the shapes its model
(layers/attention_mla.py, Indexer) gives them; an FP8 folder (as V3.2 is published) converts
dequantized in the same pass, equal to the two-pass route; and the MaxText-layout weights, run
through a JAX forward pass written from MaxText's layers, indexer included, give transformers'
logits with the indexer's top-k smaller than the sequence, so that the sparse mask is in play.
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
    _rms_norm,
    _tensors,
    _vary_norms,
)
from .test_families_deepseek2 import _deepseek_tree
from .test_families_moe import _deepseek_logits, _deepseek_moe

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

# V3.2's shape, narrowed: 1 dense layer then MoE layers, query LoRA, an indexer of 8 heads of 16
# (8 rotary) choosing 4 of the 8 tokens of TOKENS
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
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    q_lora_rank=24,
    kv_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    index_n_heads=8,
    index_head_dim=16,
    index_topk=4,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
)


def _model(dtype=torch.float32, **extra) -> object:
    torch.manual_seed(0)
    config = transformers.DeepseekV32Config(**{**CONFIG, **extra})
    config._attn_implementation = "eager"
    model = _vary_norms(transformers.DeepseekV32ForCausalLM(config).eval())  # k_norm's bias too
    with torch.no_grad():  # a router bias that counts
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn_like(buffer) * 0.3)
    return model.to(dtype)


def _save_model(folder, fused: bool = False, **extra) -> object:
    model = _model(**extra)
    model.save_pretrained(folder, save_original_format=not fused)
    return model


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
@pytest.mark.parametrize("fused", [False, True], ids=["per-expert", "fused"])
def test_deepseek32_round_trip_is_bit_identical(tmp_path, layout, fused):
    _save_model(tmp_path / "hf", fused=fused)
    name = f"deepseek3.2:{layout}"
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", name, progress=False)
    convert_with_recipe(
        tmp_path / "mt",
        tmp_path / "back",
        name,
        reverse=True,
        like=tmp_path / "hf",  # the expert layout the source has
        progress=False,
    )
    source = _assert_same_tensors(tmp_path / "hf", tmp_path / "back")
    assert any(".indexer.k_norm.bias" in key for key in source)
    assert transformers.DeepseekV32ForCausalLM.from_pretrained(tmp_path / "back") is not None


def _expected_shapes(scanned: bool) -> dict[str, tuple[int, ...]]:
    """MaxText's tree for CONFIG: the converter's names (its v3 and v3.2 keys), the model's
    shapes (scan axis 1; routed experts and the router bias (experts, layers, ...))."""
    e, h, lora, kv, rope, v, moe, x = 64, 4, 24, 32, 8, 16, 16, 4
    ih, idim = 8, 16
    attention = {
        "pre_self_attention_layer_norm/scale": (e,),
        "post_self_attention_layer_norm/scale": (e,),
        "self_attention/wq_a/kernel": (e, lora),
        "self_attention/q_norm/scale": (lora,),
        "self_attention/wq_b/kernel": (lora, h, 16 + rope),
        "self_attention/wkv_a/kernel": (e, kv + rope),
        "self_attention/kv_norm/scale": (kv,),
        "self_attention/wkv_b/kernel": (kv, h, 16 + v),
        "self_attention/out/kernel": (h, v, e),
        "self_attention/indexer/wq_b/kernel": (lora, ih, idim),
        "self_attention/indexer/wk/kernel": (e, idim),
        "self_attention/indexer/k_norm/scale": (idim,),
        "self_attention/indexer/k_norm/bias": (idim,),
        "self_attention/indexer/weights_proj/kernel": (e, ih),
    }
    block = "DeepSeekMoeBlock_0"
    moe_layer = {
        f"{block}/shared_experts/wi_0/kernel": (e, moe),
        f"{block}/shared_experts/wi_1/kernel": (e, moe),
        f"{block}/shared_experts/wo/kernel": (moe, e),
        f"{block}/MoeBlock_0/gate/kernel": (e, x),
        f"{block}/MoeBlock_0/gate/bias": (x,),  # expert axis first, as the experts'
        f"{block}/MoeBlock_0/wi_0": (x, e, moe),
        f"{block}/MoeBlock_0/wi_1": (x, e, moe),
        f"{block}/MoeBlock_0/wo": (x, moe, e),
    }
    return _deepseek_tree(attention, moe_layer, scanned)


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_deepseek32_tree_has_maxtexts_paths_and_shapes(tmp_path, layout):
    _save_model(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", f"deepseek3.2:{layout}", progress=False)
    ckpt = _assert_tree(tmp_path / "mt", _expected_shapes(layout == "maxtext"))
    hf = _tensors(tmp_path / "hf")
    scanned = layout == "maxtext"

    def leaf(path):  # MoE layer 1, HF layer 2
        tree = "moe_layers" if scanned else "moe_layers_1"
        array = ckpt[f"params/params/decoder/{tree}/self_attention/indexer/{path}"].read()
        return array[:, 1] if scanned else array

    indexer = "model.layers.2.self_attn.indexer"
    # plain transposes, as MaxText's hook reshapes them: heads of [rotary halves, rest] kept
    np.testing.assert_array_equal(
        leaf("wq_b/kernel"), hf[f"{indexer}.wq_b.weight"].T.reshape(24, 8, 16)
    )
    np.testing.assert_array_equal(leaf("wk/kernel"), hf[f"{indexer}.wk.weight"].T)
    np.testing.assert_array_equal(
        leaf("weights_proj/kernel"), hf[f"{indexer}.weights_proj.weight"].T
    )
    np.testing.assert_array_equal(leaf("k_norm/scale"), hf[f"{indexer}.k_norm.weight"])
    np.testing.assert_array_equal(leaf("k_norm/bias"), hf[f"{indexer}.k_norm.bias"])


# FP8, as DeepSeek-V3.2 is published ----------------------------------------------------------


def test_deepseek32_fp8_folder_converts_dequantized_in_the_same_pass(tmp_path):
    """transformers' FP8 quantizer on every linear weight (the indexer's included) but the
    embeddings, norms, LM head and router; one pass equals transformers' dequantization then
    a plain conversion, both ways, through the command line."""
    from .test_quantized import cli, quantize_folder, reference_dequantize

    _model(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    fp8 = quantize_folder(tmp_path / "bf16", tmp_path / "fp8")
    opened = suture.open(fp8)
    indexer = "model/layers/1/self_attn/indexer"
    assert opened[f"{indexer}/wq_b/weight"].dtype.name == "float8_e4m3fn"
    assert f"{indexer}/wq_b/weight_scale_inv" in opened.paths()
    dequantized = reference_dequantize(fp8, tmp_path / "dequantized")
    before = {f.name: f.read_bytes() for f in fp8.iterdir()}
    for layout in ("maxtext", "maxtext-unscanned"):
        recipe = ["--recipe", f"deepseek3.2:{layout}", "--no-progress"]
        one, two, back = (tmp_path / f"{name}-{layout}" for name in ("one", "two", "back"))
        assert (done := cli("convert", str(fp8), str(one), *recipe)).exit_code == 0, done.output
        done = cli("convert", str(dequantized), str(two), *recipe)
        assert done.exit_code == 0, done.output
        assert cli("diff", str(one), str(two), "--values").exit_code == 0
        done = cli("convert", str(one), str(back), *recipe, "--reverse")
        assert done.exit_code == 0, done.output
        assert cli("diff", str(back), str(dequantized), "--values").exit_code == 0
        assert "quantization_config" not in json.loads((back / "config.json").read_text())
    assert {f.name: f.read_bytes() for f in fp8.iterdir()} == before  # source untouched


# Logits: MaxText's DeepSeek-V3.2 layers, indexer included, written in JAX ---------------------


def _indexer(h, attention, config, causal):
    """MaxText's Indexer: which keys each query attends to, (batch, 1, query, key) booleans."""
    heads, dim, rope = config["index_n_heads"], config["index_head_dim"], config["qk_rope_head_dim"]
    eps, p = config["rms_norm_eps"], attention["indexer"]
    low_rank_q = _rms_norm(h @ attention["wq_a"]["kernel"], attention["q_norm"]["scale"], eps)
    q = jnp.einsum("bsr,rhd->bshd", low_rank_q, p["wq_b"]["kernel"])
    k = h @ p["wk"]["kernel"]
    mean = k.mean(-1, keepdims=True)
    variance = jnp.square(k - mean).mean(-1, keepdims=True)
    k = (k - mean) * jax.lax.rsqrt(variance + 1e-6) * p["k_norm"]["scale"] + p["k_norm"]["bias"]
    positions = jnp.arange(h.shape[1])[:, None]
    inv_freq = 1.0 / (config["rope_parameters"]["rope_theta"] ** (jnp.arange(0, rope, 2) / rope))
    cos = jnp.cos(positions * inv_freq)[None, :, None]
    sin = jnp.sin(positions * inv_freq)[None, :, None]

    def rotate(x):  # per head: [rotary halves (not pairs, unlike MLA), rest]
        first, second, rest = x[..., : rope // 2], x[..., rope // 2 : rope], x[..., rope:]
        return jnp.concatenate([first * cos - second * sin, second * cos + first * sin, rest], -1)

    q, k = rotate(q), rotate(k[:, :, None])[:, :, 0]  # the key: one head, shared
    logits = jax.nn.relu(jnp.einsum("bthd,bsd->btsh", q, k))
    weights = (h @ p["weights_proj"]["kernel"]) * heads**-0.5 * dim**-0.5
    score = jnp.where(causal, jnp.einsum("btsh,bth->bts", logits, weights), -jnp.inf)
    top, chosen = jax.lax.top_k(score, config["index_topk"] + 1)
    # no tie at the cut (scores of exactly 0, every head's ReLU at 0, would tie; MaxText keeps
    # the first by position, torch.topk any): the chosen tokens are the same for both
    assert bool(jnp.all((top[..., -2] > top[..., -1]) | jnp.isinf(top[..., -2])))
    chosen = chosen[..., :-1]
    selected = jax.nn.one_hot(chosen, h.shape[1], dtype=bool).any(axis=-2)
    return (causal & selected)[:, None]


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_deepseek32_maxtext_layout_gives_transformers_logits(tmp_path, layout):
    model = _save_model(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", f"deepseek3.2:{layout}", progress=False)
    params = jax.tree.map(jnp.asarray, suture.load(tmp_path / "mt")["params"]["params"])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    tokens, scanned = jnp.asarray(TOKENS), layout == "maxtext"
    ours = _deepseek_logits(
        params, config, tokens, _deepseek_moe, scanned=scanned, mask_of=_indexer
    )
    with torch.no_grad():
        theirs = model(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)
    # the indexer's choice matters here: attending to every earlier token gives other logits
    dense = _deepseek_logits(params, config, tokens, _deepseek_moe, scanned=scanned)
    assert np.max(np.abs(np.asarray(dense) - theirs)) > 1e-2


# Configs MaxText's DeepSeek-V3.2 cannot hold, other families, and the command line -------------


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("q_lora_rank", None, "'q_lora_rank' is 0: no query LoRA .null or 0., where MaxText's"),
        ("tie_word_embeddings", True, "'tie_word_embeddings' is True: MaxText's DeepSeek has"),
        ("attention_bias", True, "'attention_bias' is True: MaxText's DeepSeek attention has no"),
        ("n_shared_experts", 2, "'n_shared_experts' is 2: the recipe maps one shared-experts"),
    ],
)
def test_deepseek32_refuses_a_config_maxtext_cannot_hold(tmp_path, field, value, match):
    _save_model(tmp_path / "hf")
    config_file = tmp_path / "hf" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), field: value}))
    config_text = config_file.read_text()
    _assert_refused(tmp_path, "deepseek3.2:maxtext", match)
    assert config_file.read_text() == config_text


def test_deepseek32_refuses_a_folder_with_its_multi_token_prediction_layer(tmp_path):
    """The published folder holds layer 61, the MTP module, past num_hidden_layers: MaxText's
    tree has no place for it, and converting would lose it silently."""
    model = _model(num_hidden_layers=4)
    model.save_pretrained(tmp_path / "hf")
    config_file = tmp_path / "hf" / "config.json"
    config = json.loads(config_file.read_text())
    config.update(num_hidden_layers=3, num_nextn_predict_layers=1)
    config_file.write_text(json.dumps(config))
    with pytest.raises(families.ConfigMismatchError, match="layer 3 would be lost"):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "deepseek3.2:maxtext", progress=False)
    assert not (tmp_path / "mt").exists()


def test_deepseek32_and_deepseek3_recipes_refuse_each_others_folders(tmp_path):
    _save_model(tmp_path / "v32")
    torch.manual_seed(0)
    v3 = {k: v for k, v in CONFIG.items() if not k.startswith("index_")}
    transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**v3)).save_pretrained(
        tmp_path / "v3"
    )
    with pytest.raises(
        families.ConfigMismatchError, match="'model_type' is 'deepseek_v3'.*fits 'deepseek_v32'"
    ):
        convert_with_recipe(tmp_path / "v3", tmp_path / "mt", "deepseek3.2:maxtext", progress=False)
    with pytest.raises(
        families.ConfigMismatchError, match="'model_type' is 'deepseek_v32'.*fits 'deepseek_v3'"
    ):
        convert_with_recipe(tmp_path / "v32", tmp_path / "mt", "deepseek3:maxtext", progress=False)
    assert not (tmp_path / "mt").exists()


def test_cli_lists_deepseek32_and_converts_both_ways(tmp_path):
    _save_model(tmp_path / "hf", fused=True)
    shown = _cli_shows_family("deepseek3.2", tmp_path / "hf" / "config.json")
    assert "DEEPSEEK_MAXTEXT_TO_HF_PARAM_MAPPING" in shown
    assert "decoder/moe_layers/self_attention/indexer/wq_b/kernel" in shown
    assert "split axis 1 into (8, 16)" in shown
    # fused experts back, as the --like folder has them
    _cli_round_trip(tmp_path, "deepseek3.2:maxtext-unscanned", "--like", str(tmp_path / "hf"))
