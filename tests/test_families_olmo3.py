"""OLMo 3: the olmo3 recipes, proven with transformers' own Olmo3ForCausalLM.

A tiny random model (two cycles of 3 sliding-window layers and 1 full) goes to MaxText's
layout and back bit for bit, scanned and unscanned; the tree has the paths and shapes MaxText
0.2.5's converter (OLMO3_MAXTEXT_TO_HF_PARAM_MAPPING) and its model (Olmo3ScannableBlock) give
it; and the MaxText-layout weights, run through a JAX forward pass written from MaxText's
Olmo3DecoderLayer (post-norms only, query/key norms over the whole projection, sliding window),
give transformers' logits.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import suture
from suture.families._convert import convert_with_recipe

from .test_families import (
    TOKENS,
    _assert_refused,
    _assert_same_tensors,
    _assert_tree,
    _cli_round_trip,
    _cli_shows_family,
    _rms_norm,
    _rope,
    _tensors,
    _vary_norms,
)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

CYCLE = 4  # MaxText's inhomogeneous_layer_cycle_interval for OLMo 3
LAYERS = 8
# head_dim 16; a window of 4 on 8 tokens, so the sliding layers mask something
CONFIG = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    sliding_window=4,
    rms_norm_eps=1e-6,
    pad_token_id=None,
    eos_token_id=None,
)
# MaxText's names per layer (OLMO3_MAXTEXT_TO_HF_PARAM_HOOK_FN's kernel_keys and norm_keys)
KERNELS = [
    "attention/query/kernel",
    "attention/key/kernel",
    "attention/value/kernel",
    "attention/out/kernel",
    "mlp/wi_0/kernel",
    "mlp/wi_1/kernel",
    "mlp/wo/kernel",
]
NORMS = [
    "post_self_attention_layer_norm/scale",
    "post_mlp_layer_norm/scale",
    "attention/query_norm/scale",
    "attention/key_norm/scale",
]


def _save_model(folder, **extra) -> object:
    torch.manual_seed(0)
    model = transformers.Olmo3ForCausalLM(transformers.Olmo3Config(**{**CONFIG, **extra}))
    _vary_norms(model.eval())
    model.save_pretrained(folder)
    return model


def _convert(tmp_path, layout, **extra):
    model = _save_model(tmp_path / "hf", **extra)
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", f"olmo3:{layout}", progress=False)
    return model


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_olmo3_round_trip_is_bit_identical(tmp_path, layout):
    _convert(tmp_path, layout)
    name = f"olmo3:{layout}"
    convert_with_recipe(tmp_path / "mt", tmp_path / "back", name, reverse=True, progress=False)
    _assert_same_tensors(tmp_path / "hf", tmp_path / "back", same_config=True)
    assert transformers.Olmo3ForCausalLM.from_pretrained(tmp_path / "back") is not None


def _expected_shapes(scanned: bool) -> dict[str, tuple[int, ...]]:
    """MaxText's tree for CONFIG: the converter's names, the model's shapes."""
    e, q, kv, d, m, v = 64, 4, 2, 16, 96, 64
    per_layer = {
        "attention/query/kernel": (e, q, d),
        "attention/key/kernel": (e, kv, d),
        "attention/value/kernel": (e, kv, d),
        "attention/out/kernel": (q, d, e),
        "attention/query_norm/scale": (q * d,),  # GlobalRMSNorm: heads * head_dim
        "attention/key_norm/scale": (kv * d,),
        "mlp/wi_0/kernel": (e, m),
        "mlp/wi_1/kernel": (e, m),
        "mlp/wo/kernel": (m, e),
        "post_self_attention_layer_norm/scale": (e,),
        "post_mlp_layer_norm/scale": (e,),
    }
    assert sorted(per_layer) == sorted(KERNELS + NORMS)
    shapes = {
        "token_embedder/embedding": (v, e),
        "decoder/decoder_norm/scale": (e,),
        "decoder/logits_dense/kernel": (e, v),
    }
    for leaf, shape in per_layer.items():
        if scanned:  # Olmo3ScannableBlock's layers_k, scanned on param_scan_axis 1
            stacked = (shape[0], LAYERS // CYCLE, *shape[1:])
            shapes.update({f"decoder/layers/layers_{k}/{leaf}": stacked for k in range(CYCLE)})
        else:
            shapes.update({f"decoder/layers_{i}/{leaf}": shape for i in range(LAYERS)})
    return {f"params/params/{path}": shape for path, shape in shapes.items()}


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_olmo3_tree_has_maxtexts_paths_and_shapes(tmp_path, layout):
    _convert(tmp_path, layout)
    _assert_tree(tmp_path / "mt", _expected_shapes(layout == "maxtext"))


def test_scanned_olmo3_stacks_hf_layers_k_k_plus_4_in_layers_k(tmp_path):
    _convert(tmp_path, "maxtext")
    hf, ckpt = _tensors(tmp_path / "hf"), suture.open(tmp_path / "mt")
    layers = "params/params/decoder/layers"
    for k in range(CYCLE):
        query = ckpt[f"{layers}/layers_{k}/attention/query/kernel"].read()
        norm = ckpt[f"{layers}/layers_{k}/attention/key_norm/scale"].read()
        for slot, layer in enumerate(range(k, LAYERS, CYCLE)):
            source = hf[f"model.layers.{layer}.self_attn.q_proj.weight"]
            # a plain transpose: rotary halves kept, no query scaling in the weights
            np.testing.assert_array_equal(query[:, slot], source.T.reshape(64, 4, 16))
            np.testing.assert_array_equal(
                norm[:, slot], hf[f"model.layers.{layer}.self_attn.k_norm.weight"]
            )


# Logits: MaxText's OLMo 3 decoder, written in JAX ---------------------------------------------


def _olmo3_layer(x, p, config, sliding):
    """Olmo3DecoderLayer: attention and MLP outputs normalized before each residual add."""
    eps, theta = config["rms_norm_eps"], config["rope_parameters"]["full_attention"]["rope_theta"]
    seq = x.shape[1]
    attention = p["attention"]
    q = jnp.einsum("bse,ehd->bshd", x, attention["query"]["kernel"])
    k = jnp.einsum("bse,ehd->bshd", x, attention["key"]["kernel"])
    v = jnp.einsum("bse,ehd->bshd", x, attention["value"]["kernel"])
    # GlobalRMSNorm: over heads * head_dim together
    q = _rms_norm(q.reshape(*q.shape[:2], -1), attention["query_norm"]["scale"], eps).reshape(
        q.shape
    )
    k = _rms_norm(k.reshape(*k.shape[:2], -1), attention["key_norm"]["scale"], eps).reshape(k.shape)
    q, k = _rope(q, theta, interleaved=False), _rope(k, theta, interleaved=False)
    q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)  # query_pre_attn_scalar = head_dim**-0.5
    groups = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    rows, cols = jnp.arange(seq)[:, None], jnp.arange(seq)[None, :]
    mask = cols <= rows
    if sliding:  # MaxText's LOCAL_SLIDING: 0 <= q - k < sliding_window_size
        mask &= rows - cols < config["sliding_window"]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1)
    attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    out = jnp.einsum("bshd,hde->bse", attended, attention["out"]["kernel"])
    x = x + _rms_norm(out, p["post_self_attention_layer_norm"]["scale"], eps)
    mlp = p["mlp"]
    gate = jax.nn.silu(x @ mlp["wi_0"]["kernel"]) * (x @ mlp["wi_1"]["kernel"])
    return x + _rms_norm(gate @ mlp["wo"]["kernel"], p["post_mlp_layer_norm"]["scale"], eps)


def _layer_params(decoder, i, scanned):
    if not scanned:
        return decoder[f"layers_{i}"]
    block = decoder["layers"][f"layers_{i % CYCLE}"]
    return jax.tree.map(lambda a: a[:, i // CYCLE], block)  # the scan axis is 1


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_olmo3_maxtext_layout_gives_transformers_logits(tmp_path, layout):
    model = _convert(tmp_path, layout)
    params = jax.tree.map(jnp.asarray, suture.load(tmp_path / "mt")["params"]["params"])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    decoder = params["decoder"]
    x = params["token_embedder"]["embedding"][jnp.asarray(TOKENS)]
    for i in range(LAYERS):
        p = _layer_params(decoder, i, layout == "maxtext")
        x = _olmo3_layer(x, p, config, sliding=(i % CYCLE) != CYCLE - 1)
    x = _rms_norm(x, decoder["decoder_norm"]["scale"], config["rms_norm_eps"])
    ours = x @ decoder["logits_dense"]["kernel"]
    with torch.no_grad():
        theirs = model(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)


# Configs MaxText's OLMo 3 cannot hold -------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (
            dict(num_hidden_layers=6),
            "'num_hidden_layers' is 6: MaxText scans OLMo 3 layers in cycles of 4",
        ),
        (
            dict(tie_word_embeddings=True),
            "'tie_word_embeddings' is True: MaxText's OLMo 3 has its own",
        ),
        (
            dict(layer_types=["full_attention"] * LAYERS),
            "'layer_types' makes layer 0 'full_attention'.*expects 'sliding_attention'",
        ),
    ],
)
def test_olmo3_refuses_a_config_maxtext_cannot_hold(tmp_path, extra, match):
    _save_model(tmp_path / "hf", **extra)
    _assert_refused(tmp_path, "olmo3:maxtext", match)


def test_cli_lists_olmo3_and_converts_both_ways(tmp_path):
    _save_model(tmp_path / "hf")
    shown = _cli_shows_family("olmo3", tmp_path / "hf" / "config.json")
    assert "OLMO3_MAXTEXT_TO_HF_PARAM_MAPPING" in shown
    assert "decoder/layers/attention/query_norm/scale" in shown
    _cli_round_trip(tmp_path, "olmo3:maxtext-unscanned")
