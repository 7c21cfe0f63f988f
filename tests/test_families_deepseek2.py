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

from .test_families import TOKENS, _rms_norm, _tensors

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
    model = transformers.DeepseekV2ForCausalLM(config).eval()
    with torch.no_grad():  # non-trivial norms, so that a wrong mapping shows
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
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
    source, back = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert sorted(source) == sorted(back)
    for key in source:
        assert source[key].dtype == back[key].dtype, key
        np.testing.assert_array_equal(source[key], back[key], err_msg=key)
    assert transformers.DeepseekV2ForCausalLM.from_pretrained(tmp_path / "back") is not None


def _expected_shapes(scanned: bool) -> dict[str, tuple[int, ...]]:
    """MaxText's tree for CONFIG: the converter's names (its v2 keys, no router bias: MaxText's
    deepseek2-16b has routed_bias false), the model's shapes (scan axis 1, experts first)."""
    e, h, qk, kv, rope, v, m, moe, x = 64, 4, 24, 32, 8, 16, 96, 16, 4
    attention = {
        "pre_self_attention_layer_norm/scale": (e,),
        "post_self_attention_layer_norm/scale": (e,),
        "self_attention/query/kernel": (e, h, qk),
        "self_attention/wkv_a/kernel": (e, kv + rope),
        "self_attention/kv_norm/scale": (kv,),
        "self_attention/wkv_b/kernel": (kv, h, 16 + v),
        "self_attention/out/kernel": (h, v, e),
    }
    dense = {**attention, "mlp/wi_0/kernel": (e, m), "mlp/wi_1/kernel": (e, m)}
    dense["mlp/wo/kernel"] = (m, e)
    block = "DeepSeekMoeBlock_0"
    moe_layer = {
        **attention,
        f"{block}/shared_experts/wi_0/kernel": (e, 2 * moe),
        f"{block}/shared_experts/wi_1/kernel": (e, 2 * moe),
        f"{block}/shared_experts/wo/kernel": (2 * moe, e),
        f"{block}/MoeBlock_0/gate/kernel": (e, x),
    }
    experts = {
        f"{block}/MoeBlock_0/wi_0": (x, e, moe),
        f"{block}/MoeBlock_0/wi_1": (x, e, moe),
        f"{block}/MoeBlock_0/wo": (x, moe, e),
    }
    shapes = {
        "token_embedder/embedding": (64, e),
        "decoder/decoder_norm/scale": (e,),
        "decoder/logits_dense/kernel": (e, 64),
    }
    for tree, count, leaves in (("dense_layers", 1, dense), ("moe_layers", 2, moe_layer)):
        for leaf, shape in leaves.items():
            if scanned:
                shapes[f"decoder/{tree}/{leaf}"] = (shape[0], count, *shape[1:])
            else:
                shapes.update({f"decoder/{tree}_{i}/{leaf}": shape for i in range(count)})
    for leaf, shape in experts.items():
        if scanned:  # (experts, layers, ...)
            shapes[f"decoder/moe_layers/{leaf}"] = (shape[0], 2, *shape[1:])
        else:
            shapes.update({f"decoder/moe_layers_{i}/{leaf}": shape for i in range(2)})
    return {f"params/params/{path}": shape for path, shape in shapes.items()}


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_deepseek2_tree_has_maxtexts_paths_and_shapes(tmp_path, layout):
    _save_model(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", f"deepseek2:{layout}", progress=False)
    ckpt = suture.open(tmp_path / "mt")
    expected = _expected_shapes(layout == "maxtext")
    assert sorted(p for p in ckpt.paths() if p != "step") == sorted(expected)
    for path, shape in expected.items():
        assert tuple(ckpt[path].shape) == shape, path
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


def _mla(h, p, config, mask):
    """MaxText's multi-head latent attention with V2-Lite's plain query projection."""
    eps, nope, rope = config["rms_norm_eps"], config["qk_nope_head_dim"], config["qk_rope_head_dim"]
    q = jnp.einsum("bse,ehd->bshd", h, p["query"]["kernel"])
    compressed = h @ p["wkv_a"]["kernel"]
    latent, k_rot = (
        compressed[..., : config["kv_lora_rank"]],
        compressed[..., config["kv_lora_rank"] :],
    )
    kv = jnp.einsum(
        "bsr,rhd->bshd", _rms_norm(latent, p["kv_norm"]["scale"], eps), p["wkv_b"]["kernel"]
    )
    k_nope, value = kv[..., :nope], kv[..., nope:]
    positions = jnp.arange(h.shape[1])[:, None]
    inv_freq = 1.0 / (config["rope_parameters"]["rope_theta"] ** (jnp.arange(0, rope, 2) / rope))
    cos = jnp.cos(positions * inv_freq)[None, :, None]
    sin = jnp.sin(positions * inv_freq)[None, :, None]

    def rotate(x):  # MaxText's rope_interleave: pairs (x0, x1), (x2, x3), ...
        first, second = x[..., 0::2], x[..., 1::2]
        return jnp.stack([first * cos - second * sin, second * cos + first * sin], -1).reshape(
            x.shape
        )

    q = jnp.concatenate([q[..., :nope], rotate(q[..., nope:])], axis=-1)
    k_rot = jnp.broadcast_to(rotate(k_rot[:, :, None]), k_nope.shape[:-1] + (rope,))
    k = jnp.concatenate([k_nope, k_rot], axis=-1)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (nope + rope) ** -0.5
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1)
    attended = jnp.einsum("bhqk,bkhd->bqhd", weights, value)
    return jnp.einsum("bshd,hde->bse", attended, p["out"]["kernel"])


def _moe(h, block, config):
    """Softmax scores, top-k, weights not renormalized (routed_score_func softmax)."""
    router = block["MoeBlock_0"]
    scores = jax.nn.softmax(h @ router["gate"]["kernel"], axis=-1)
    weights, chosen = jax.lax.top_k(scores, config["num_experts_per_tok"])
    weights = weights * config["routed_scaling_factor"]
    hidden = jax.nn.silu(jnp.einsum("bse,xem->bsxm", h, router["wi_0"])) * jnp.einsum(
        "bse,xem->bsxm", h, router["wi_1"]
    )
    outputs = jnp.einsum("bsxm,xme->bsxe", hidden, router["wo"])
    routed = (jnp.take_along_axis(outputs, chosen[..., None], axis=2) * weights[..., None]).sum(2)
    shared = block["shared_experts"]
    gated = jax.nn.silu(h @ shared["wi_0"]["kernel"]) * (h @ shared["wi_1"]["kernel"])
    return routed + gated @ shared["wo"]["kernel"]


def _layer(decoder, tree, index, scanned):
    if not scanned:
        return decoder[f"{tree}_{index}"]
    # the scan axis is 1; the routed experts are (experts, layers, ...): also axis 1
    return jax.tree.map(lambda a: a[:, index] if a.ndim > 1 else a, decoder[tree])


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_deepseek2_maxtext_layout_gives_transformers_logits(tmp_path, layout):
    model = _save_model(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", f"deepseek2:{layout}", progress=False)
    params = jax.tree.map(jnp.asarray, suture.load(tmp_path / "mt")["params"]["params"])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    decoder, eps = params["decoder"], config["rms_norm_eps"]
    tokens = jnp.asarray(TOKENS)
    mask = jnp.tril(jnp.ones((tokens.shape[1],) * 2, bool))
    x = params["token_embedder"]["embedding"][tokens]
    dense = config["first_k_dense_replace"]
    for i in range(config["num_hidden_layers"]):
        tree, index = ("dense_layers", i) if i < dense else ("moe_layers", i - dense)
        p = _layer(decoder, tree, index, layout == "maxtext")
        h = _rms_norm(x, p["pre_self_attention_layer_norm"]["scale"], eps)
        x = x + _mla(h, p["self_attention"], config, mask)
        h = _rms_norm(x, p["post_self_attention_layer_norm"]["scale"], eps)
        if i < dense:
            mlp = p["mlp"]
            gated = jax.nn.silu(h @ mlp["wi_0"]["kernel"]) * (h @ mlp["wi_1"]["kernel"])
            x = x + gated @ mlp["wo"]["kernel"]
        else:
            x = x + _moe(h, p["DeepSeekMoeBlock_0"], config)
    ours = _rms_norm(x, decoder["decoder_norm"]["scale"], eps) @ decoder["logits_dense"]["kernel"]
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
    source = _tensors(tmp_path / "hf")
    with pytest.raises(families.ConfigMismatchError, match=match):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "deepseek2:maxtext", progress=False)
    assert not (tmp_path / "mt").exists()
    assert all(np.array_equal(source[k], v) for k, v in _tensors(tmp_path / "hf").items())


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
    from typer.testing import CliRunner

    from suture.cli import app

    runner = CliRunner()
    listed = runner.invoke(app, ["recipes"])
    assert listed.exit_code == 0
    assert "deepseek2:maxtext " in listed.output
    assert "deepseek2:maxtext-unscanned" in listed.output
    _save_model(tmp_path / "hf", fused=True)
    shown = runner.invoke(
        app, ["recipes", "deepseek2:maxtext", "--config", str(tmp_path / "hf" / "config.json")]
    )
    assert shown.exit_code == 0, shown.output
    assert "DEEPSEEK_MAXTEXT_TO_HF_PARAM_MAPPING" in shown.output
    assert "decoder/moe_layers/self_attention/query/kernel" in shown.output
    assert "wq_a" not in shown.output  # V2-Lite: no query LoRA
    common = ["--recipe", "deepseek2:maxtext", "--no-progress"]
    forward = runner.invoke(app, ["convert", str(tmp_path / "hf"), str(tmp_path / "mt"), *common])
    assert forward.exit_code == 0, forward.output
    back = runner.invoke(
        app,
        [
            "convert",
            str(tmp_path / "mt"),
            str(tmp_path / "back"),
            *common,
            "--reverse",
            "--like",
            str(tmp_path / "hf"),
        ],
    )
    assert back.exit_code == 0, back.output
    source, restored = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert sorted(source) == sorted(restored)  # fused experts, as the --like folder has them
    assert all(np.array_equal(source[k], restored[k]) for k in source)
