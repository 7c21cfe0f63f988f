"""Mixture-of-experts and biased families: qwen3-moe, mixtral and qwen2.5 recipes.

Tiny random models made with transformers (`save_pretrained`, in both of its expert layouts:
one tensor per expert as published checkpoints store them, and transformers v5's fused 3-D
experts) go to MaxText's layout and back bit for bit, scanned and unscanned; the MaxText-layout
weights run through a JAX forward pass written from MaxText's MoE block (router softmax,
top-k, gated experts), whose logits match transformers' own.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import suture
from suture import LazyArray, families
from suture.families._convert import convert_with_recipe
from suture.families._experts import FusedSource

from .test_families import TOKENS, _assert_same_tensors, _rms_norm, _rope, _tensors

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

BASE = dict(
    vocab_size=64,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
)  # head_dim 16: Mixtral's query scale 1/4 is exact

MODELS = {
    "qwen3-moe": lambda: transformers.Qwen3MoeForCausalLM(
        transformers.Qwen3MoeConfig(
            **BASE,
            head_dim=16,
            intermediate_size=96,
            moe_intermediate_size=24,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
        )
    ),
    "mixtral": lambda: transformers.MixtralForCausalLM(
        transformers.MixtralConfig(
            **BASE, intermediate_size=48, num_local_experts=4, num_experts_per_tok=2
        )
    ),
    "qwen2.5": lambda: transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(**BASE, intermediate_size=96)
    ),
    "deepseek3": lambda: transformers.DeepseekV3ForCausalLM(
        transformers.DeepseekV3Config(
            **{**BASE, "num_hidden_layers": 3, "num_key_value_heads": 4},
            intermediate_size=32,
            moe_intermediate_size=16,
            n_shared_experts=1,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
        )
    ),
}


def _save_model(family: str, folder, fused: bool = False) -> object:
    torch.manual_seed(0)
    model = MODELS[family]().eval()
    with torch.no_grad():  # non-trivial norms and biases, so that a wrong mapping shows
        for name, parameter in model.named_parameters():
            if "norm" in name or "bias" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(folder, save_original_format=not fused)
    return model


# Both directions, bit for bit -----------------------------------------------------------------


@pytest.mark.parametrize("family", ["qwen3-moe", "mixtral", "deepseek3"])
@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
@pytest.mark.parametrize("fused", [False, True], ids=["per-expert", "fused"])
def test_moe_round_trip_is_bit_identical_in_the_source_layout(tmp_path, family, layout, fused):
    model = _save_model(family, tmp_path / "hf", fused=fused)
    name = f"{family}:{layout}"
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", name, progress=False)
    convert_with_recipe(tmp_path / "mt", tmp_path / "back", name, reverse=True, progress=False)
    _assert_same_tensors(tmp_path / "hf", tmp_path / "back")  # in the expert layout the source had
    reloaded = type(model).from_pretrained(tmp_path / "back")
    for (key, theirs), ours in zip(
        model.state_dict().items(), reloaded.state_dict().values(), strict=True
    ):
        assert torch.equal(theirs, ours), key


def test_qwen25_round_trip_is_bit_identical(tmp_path):
    _save_model("qwen2.5", tmp_path / "hf")
    for layout in ("maxtext", "maxtext-unscanned"):
        name = f"qwen2.5:{layout}"
        convert_with_recipe(tmp_path / "hf", tmp_path / layout, name, progress=False)
        back = tmp_path / f"{layout}-back"
        convert_with_recipe(tmp_path / layout, back, name, reverse=True, progress=False)
        source, restored = _tensors(tmp_path / "hf"), _tensors(back)
        assert sorted(source) == sorted(restored)
        for key in source:
            np.testing.assert_array_equal(source[key], restored[key], err_msg=key)


# Where MaxText puts experts, router and biases ------------------------------------------------


@pytest.mark.parametrize("fused", [False, True], ids=["per-expert", "fused"])
def test_qwen3_moe_experts_lead_and_the_router_is_on_the_scan_axis(tmp_path, fused):
    _save_model("qwen3-moe", tmp_path / "per-expert")
    _save_model("qwen3-moe", tmp_path / "hf", fused=fused)
    hf = _tensors(tmp_path / "per-expert")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "qwen3-moe:maxtext", progress=False)
    ckpt = suture.open(tmp_path / "mt")
    moe = "params/params/decoder/layers/moe_block"
    wi_0, wi_1, wo = (ckpt[f"{moe}/{w}"].read() for w in ("wi_0", "wi_1", "wo"))
    gate = ckpt[f"{moe}/gate/kernel"].read()
    assert wi_0.shape == (4, 2, 64, 24) and wo.shape == (4, 2, 24, 64)  # (experts, layers, ...)
    assert gate.shape == (64, 2, 4)  # (embed, layers, experts)
    for layer in range(2):
        prefix = f"model.layers.{layer}.mlp"
        np.testing.assert_array_equal(gate[:, layer], hf[f"{prefix}.gate.weight"].T)
        for e in range(4):
            expert = f"{prefix}.experts.{e}"
            np.testing.assert_array_equal(wi_0[e, layer], hf[f"{expert}.gate_proj.weight"].T)
            np.testing.assert_array_equal(wi_1[e, layer], hf[f"{expert}.up_proj.weight"].T)
            np.testing.assert_array_equal(wo[e, layer], hf[f"{expert}.down_proj.weight"].T)
    recorded = ckpt.custom_metadata["suture.family"]["experts"]
    assert recorded == ("fused" if fused else "per-expert")


def test_unscanned_moe_layers_hold_experts_on_axis_0(tmp_path):
    _save_model("mixtral", tmp_path / "hf")
    hf = _tensors(tmp_path / "hf")
    convert_with_recipe(
        tmp_path / "hf", tmp_path / "mt", "mixtral:maxtext-unscanned", progress=False
    )
    ckpt = suture.open(tmp_path / "mt")
    wo = ckpt["params/params/decoder/layers_1/MoeBlock_0/wo"].read()
    assert wo.shape == (4, 48, 64)
    np.testing.assert_array_equal(
        wo[3], hf["model.layers.1.block_sparse_moe.experts.3.w2.weight"].T
    )
    gate = ckpt["params/params/decoder/layers_1/MoeBlock_0/gate/kernel"].read()
    np.testing.assert_array_equal(gate, hf["model.layers.1.block_sparse_moe.gate.weight"].T)


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_deepseek3_dense_and_moe_layers_go_to_their_subtrees(tmp_path, layout):
    """Shapes are MaxText's own model's (deepseek2-16b with V3's settings); values checked one
    by one against the HF tensors, as MaxText's param_mapping.py pairs them."""
    _save_model("deepseek3", tmp_path / "hf")
    hf = _tensors(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", f"deepseek3:{layout}", progress=False)
    ckpt = suture.open(tmp_path / "mt")
    scanned = layout == "maxtext"

    def leaf(tree, index, path):  # MaxText layer `index` of subtree `tree`
        if scanned:
            array = ckpt[f"params/params/decoder/{tree}/{path}"].read()
            return array[:, index]  # the scan axis
        return ckpt[f"params/params/decoder/{tree}_{index}/{path}"].read()

    if scanned:
        shapes = {
            "dense_layers/self_attention/wq_b/kernel": (32, 1, 4, 24),
            "dense_layers/self_attention/wkv_b/kernel": (16, 1, 4, 32),
            "moe_layers/self_attention/out/kernel": (4, 2, 16, 64),
            "moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/gate/kernel": (64, 2, 4),
            "moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/gate/bias": (4, 2),
            "moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/wi_0": (4, 2, 64, 16),
            "moe_layers/DeepSeekMoeBlock_0/shared_experts/wo/kernel": (16, 2, 64),
        }
        for path, shape in shapes.items():
            assert ckpt[f"params/params/decoder/{path}"].shape == shape, path
    np.testing.assert_array_equal(
        leaf("dense_layers", 0, "self_attention/wkv_b/kernel"),
        hf["model.layers.0.self_attn.kv_b_proj.weight"].T.reshape(16, 4, 32),
    )
    np.testing.assert_array_equal(
        leaf("dense_layers", 0, "mlp/wo/kernel"), hf["model.layers.0.mlp.down_proj.weight"].T
    )
    moe = "DeepSeekMoeBlock_0"
    np.testing.assert_array_equal(  # MoE layer 1 is HF layer 2
        leaf("moe_layers", 1, f"{moe}/MoeBlock_0/gate/bias"),
        hf["model.layers.2.mlp.gate.e_score_correction_bias"],
    )
    np.testing.assert_array_equal(
        leaf("moe_layers", 1, f"{moe}/shared_experts/wi_1/kernel"),
        hf["model.layers.2.mlp.shared_experts.up_proj.weight"].T,
    )
    np.testing.assert_array_equal(
        leaf("moe_layers", 0, "self_attention/wq_b/kernel"),
        hf["model.layers.1.self_attn.q_b_proj.weight"].T.reshape(32, 4, 24),
    )
    experts = ckpt[
        f"params/params/decoder/{'moe_layers' if scanned else 'moe_layers_1'}/{moe}/MoeBlock_0/wo"
    ].read()
    expert_3 = experts[3, 1] if scanned else experts[3]
    np.testing.assert_array_equal(expert_3, hf["model.layers.2.mlp.experts.3.down_proj.weight"].T)


def test_qwen25_biases_split_into_heads(tmp_path):
    _save_model("qwen2.5", tmp_path / "hf")
    hf = _tensors(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "qwen2.5:maxtext", progress=False)
    ckpt = suture.open(tmp_path / "mt")
    bias = ckpt["params/params/decoder/layers/self_attention/key/bias"].read()
    assert bias.shape == (2, 2, 16)  # (kv heads, layers, head_dim)
    np.testing.assert_array_equal(
        bias[:, 1], hf["model.layers.1.self_attn.k_proj.bias"].reshape(2, 16)
    )


def test_reverse_like_writes_the_layout_the_like_folder_shows(tmp_path):
    model = _save_model("qwen3-moe", tmp_path / "hf")
    _save_model("qwen3-moe", tmp_path / "fused", fused=True)
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "qwen3-moe:maxtext", progress=False)
    convert_with_recipe(
        tmp_path / "mt",
        tmp_path / "back",
        "qwen3-moe:maxtext",
        reverse=True,
        like=tmp_path / "fused",
        progress=False,
    )
    fused, back = _tensors(tmp_path / "fused"), _tensors(tmp_path / "back")
    assert sorted(fused) == sorted(back)
    assert "model.layers.0.mlp.experts.gate_up_proj" in back
    for key in fused:
        np.testing.assert_array_equal(fused[key], back[key], err_msg=key)
    reloaded = type(model).from_pretrained(tmp_path / "back")
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), reloaded.state_dict().values(), strict=True)
    )


def test_checkpoint_without_either_expert_layout_names_both(tmp_path):
    _save_model("qwen3-moe", tmp_path / "hf")
    tensors = {
        key: value for key, value in _tensors(tmp_path / "hf").items() if "experts" not in key
    }
    suture.save(tensors, tmp_path / "bare.safetensors", progress=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    with pytest.raises(families.ConfigMismatchError, match="experts.0.gate_proj.*gate_up_proj"):
        convert_with_recipe(
            tmp_path / "bare.safetensors",
            tmp_path / "mt",
            "qwen3-moe:maxtext",
            config=config,
            progress=False,
        )


def test_recipe_table_shows_expert_stacking_and_the_fused_source(tmp_path):
    _save_model("qwen3-moe", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    rows = {
        m: ops for m, _, ops in families.get_recipe("qwen3-moe:maxtext").operations_table(config)
    }
    assert rows["decoder/layers/moe_block/wi_1"].startswith(
        "experts on axis 0, or fused model.layers.{layer}.mlp.experts.gate_up_proj part 1 of 2"
    )
    assert "qwen3-moe:maxtext-unscanned" in families.recipe_names()
    assert "mixtral:maxtext" in families.recipe_names()


# The fused-tensor operations ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["halves", "interleaved"])
@pytest.mark.parametrize("axis", [1, 2])
def test_fused_parts_join_back_exactly(mode, axis):
    fused = LazyArray.from_array(np.random.default_rng(0).normal(size=(3, 6, 4)).astype(np.float32))
    if axis == 2:
        fused = LazyArray.from_array(np.moveaxis(fused.read(), 1, 2))
    sources = [FusedSource("w", axis, mode, part, 2) for part in range(2)]
    per_expert = [[source.take(fused, e) for e in range(3)] for source in sources]
    whole = [source.take(fused, None) for source in sources]
    for e in range(3):  # one expert's part is that expert's slice of the whole part
        for part in range(2):
            np.testing.assert_array_equal(per_expert[part][e].read(), whole[part].read()[e])
    first = whole[0].read()
    expected = (
        np.take(fused.read(), range(first.shape[axis]), axis=axis)
        if mode == "halves"
        else np.take(fused.read(), range(0, fused.shape[axis], 2), axis=axis)
    )
    np.testing.assert_array_equal(first, expected)
    np.testing.assert_array_equal(sources[0].join(whole).read(), fused.read())


# A forward pass written from MaxText's model definition, on the MaxText layout -----------------


def _moe(h, block, layer, config):
    """MaxText's routed MoE block: softmax router, top-k, renormalized, gated experts."""
    take = lambda w: w[:, layer] if w.ndim == 4 else w  # noqa: E731  (experts, layers, ...)
    router = h @ block["gate"]["kernel"][:, layer]
    probabilities = jax.nn.softmax(router.astype(jnp.float32), axis=-1)
    weights, chosen = jax.lax.top_k(probabilities, config["num_experts_per_tok"])
    if config.get("norm_topk_prob", True):
        weights = weights / weights.sum(-1, keepdims=True)
    wi_0, wi_1, wo = take(block["wi_0"]), take(block["wi_1"]), take(block["wo"])
    hidden = jax.nn.silu(jnp.einsum("bse,xem->bsxm", h, wi_0)) * jnp.einsum(
        "bse,xem->bsxm", h, wi_1
    )
    outputs = jnp.einsum("bsxm,xme->bsxe", hidden, wo)  # every expert, then pick
    picked = jnp.take_along_axis(outputs, chosen[..., None], axis=2)
    return (picked * weights[..., None]).sum(axis=2)


def _logits(params, config, tokens, *, moe_block, qk_norm, biases, runtime_query_scale):
    decoder, eps = params["decoder"], config["rms_norm_eps"]
    theta = (config.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    layers = decoder["layers"]
    x = params["token_embedder"]["embedding"][tokens]
    seq = tokens.shape[1]
    mask = jnp.tril(jnp.ones((seq, seq), bool))
    for i in range(config["num_hidden_layers"]):
        attention = jax.tree.map(lambda a, i=i: a[:, i], layers["self_attention"])
        h = _rms_norm(x, layers["pre_self_attention_layer_norm"]["scale"][:, i], eps)
        projected = {}
        for part in ("query", "key", "value"):
            projected[part] = jnp.einsum("bse,ehd->bshd", h, attention[part]["kernel"])
            if biases:
                projected[part] = projected[part] + attention[part]["bias"]
        q, k, v = projected["query"], projected["key"], projected["value"]
        if qk_norm:
            q = _rms_norm(q, attention["query_norm"]["scale"], eps)
            k = _rms_norm(k, attention["key_norm"]["scale"], eps)
        q, k = _rope(q, theta, False), _rope(k, theta, False)
        if runtime_query_scale:
            q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
        groups = q.shape[2] // k.shape[2]
        k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        weights = jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1)
        attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        x = x + jnp.einsum("bshd,hde->bse", attended, attention["out"]["kernel"])
        h = _rms_norm(x, layers["post_self_attention_layer_norm"]["scale"][:, i], eps)
        if moe_block is not None:
            x = x + _moe(h, layers[moe_block], i, config)
        else:
            mlp = jax.tree.map(lambda a, i=i: a[:, i], layers["mlp"])
            gate = jax.nn.silu(h @ mlp["wi_0"]["kernel"]) * (h @ mlp["wi_1"]["kernel"])
            x = x + gate @ mlp["wo"]["kernel"]
    x = _rms_norm(x, decoder["decoder_norm"]["scale"], eps)
    return x @ decoder["logits_dense"]["kernel"]


@pytest.mark.parametrize(
    ("family", "moe_block", "qk_norm", "biases", "runtime_query_scale"),
    [
        ("qwen3-moe", "moe_block", True, False, True),
        ("mixtral", "MoeBlock_0", False, False, False),
        ("qwen2.5", None, False, True, True),
    ],
)
def test_maxtext_layout_gives_transformers_logits(
    tmp_path, family, moe_block, qk_norm, biases, runtime_query_scale
):
    model = _save_model(family, tmp_path / "hf", fused=family != "qwen2.5")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", f"{family}:maxtext", progress=False)
    params = jax.tree.map(jnp.asarray, suture.load(tmp_path / "mt")["params"]["params"])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    ours = _logits(
        params,
        config,
        jnp.asarray(TOKENS),
        moe_block=moe_block,
        qk_norm=qk_norm,
        biases=biases,
        runtime_query_scale=runtime_query_scale,
    )
    with torch.no_grad():
        theirs = model(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)


def test_cli_lists_the_moe_recipes_and_reverses_into_the_like_layout(tmp_path):
    from typer.testing import CliRunner

    from suture.cli import app

    runner = CliRunner()
    listed = runner.invoke(app, ["recipes"])
    assert listed.exit_code == 0
    for name in ("qwen2.5:maxtext ", "qwen3-moe:maxtext-unscanned", "mixtral:maxtext "):
        assert name in listed.output
    _save_model("mixtral", tmp_path / "fused", fused=True)
    _save_model("mixtral", tmp_path / "hf")
    forward = ["convert", str(tmp_path / "fused"), str(tmp_path / "mt"), "--no-progress"]
    assert runner.invoke(app, [*forward, "--recipe", "mixtral:maxtext"]).exit_code == 0
    back = runner.invoke(
        app,
        [
            "convert",
            str(tmp_path / "mt"),
            str(tmp_path / "back"),
            "--recipe",
            "mixtral:maxtext",
            "--reverse",
            "--like",
            str(tmp_path / "hf"),
            "--no-progress",
        ],
    )
    assert back.exit_code == 0, back.output
    per_expert, restored = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert sorted(per_expert) == sorted(restored)
    assert all(np.array_equal(per_expert[k], restored[k]) for k in per_expert)


# One tensor larger than the budget ------------------------------------------------------------

BIG_DRIVER = r"""
import json, sys
# loaded before the baseline, as RSS_DRIVER does: their code is not bytes in flight (the
# conversion loaded TensorStore's 15 to 20 MiB of it inside the measured span)
import ml_dtypes, numpy, tensorstore
import suture
from suture.families._convert import convert_with_recipe

def status(field):
    with open("/proc/self/status") as f:
        line = next(l for l in f if l.startswith(field + ":"))
    return int(line.split()[1]) * 1024

with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")  # the peak RSS starts again from here
baseline = status("VmRSS")
result = convert_with_recipe(
    sys.argv[1], sys.argv[2], "qwen3-moe:maxtext", max_memory="128MiB", progress=False
)
print(json.dumps({"growth": status("VmHWM") - baseline, "in_flight": result.peak_in_flight}))
"""


def test_a_stacked_expert_leaf_of_1_gib_is_written_within_a_128_mib_budget(tmp_path):
    """(experts, layers, embed, mlp) = (128, 2, 1024, 1024) float32 = 1 GiB per expert weight,
    3 GiB of experts in all, converted by a fresh process under max_memory="128MiB": its peak
    RSS grows by at most the budget plus 64 MiB."""
    import os
    import subprocess
    import sys

    from safetensors.numpy import save_file

    from .test_budget import RSS_SLACK

    hidden, mlp, experts, layers, heads = 1024, 1024, 128, 2, 4
    config = dict(
        model_type="qwen3_moe",
        architectures=["Qwen3MoeForCausalLM"],
        vocab_size=64,
        hidden_size=hidden,
        head_dim=16,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        num_hidden_layers=layers,
        num_experts=experts,
        num_experts_per_tok=2,
        moe_intermediate_size=mlp,
        intermediate_size=mlp,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    source = tmp_path / "hf"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    block = rng.standard_normal((mlp, hidden), dtype=np.float32)  # 4 MiB, reused: cheap to make
    small = {
        "model.embed_tokens.weight": rng.standard_normal((64, hidden), dtype=np.float32),
        "model.norm.weight": np.ones(hidden, np.float32),
    }
    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        for name, shape in {
            "self_attn.q_proj.weight": (heads * 16, hidden),
            "self_attn.k_proj.weight": (heads * 16, hidden),
            "self_attn.v_proj.weight": (heads * 16, hidden),
            "self_attn.o_proj.weight": (hidden, heads * 16),
            "self_attn.q_norm.weight": (16,),
            "self_attn.k_norm.weight": (16,),
            "mlp.gate.weight": (experts, hidden),
            "input_layernorm.weight": (hidden,),
            "post_attention_layernorm.weight": (hidden,),
        }.items():
            small[f"{prefix}.{name}"] = rng.standard_normal(shape, dtype=np.float32)
        for half, part in enumerate(("gate_proj", "up_proj", "down_proj")):
            shard = {
                f"{prefix}.mlp.experts.{e}.{part}.weight": np.roll(block, e + half, axis=0)
                for e in range(experts)
            }
            save_file(shard, str(source / f"experts-{layer}-{part}.safetensors"))
    save_file(small, str(source / "rest.safetensors"))
    environment = {**os.environ, "SUTURE_TUNE_ALLOCATOR": "1"}
    done = subprocess.run(
        [sys.executable, "-c", BIG_DRIVER, str(source), str(tmp_path / "mt")],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["in_flight"] <= 128 << 20
    assert report["growth"] <= (128 << 20) + RSS_SLACK, report["growth"] >> 20
    wi_0 = suture.open(tmp_path / "mt")["params/params/decoder/layers/moe_block/wi_0"]
    assert wi_0.shape == (experts, layers, hidden, mlp) and wi_0.nbytes == 1 << 30
    np.testing.assert_array_equal(wi_0[5, 1].read(), np.roll(block, 5, axis=0).T)


# gpt-oss: published fused experts, split by even and odd columns ------------------------------


def _gpt_oss(folder):
    torch.manual_seed(0)
    config = transformers.GptOssConfig(
        **{**BASE, "num_hidden_layers": 4},
        head_dim=16,
        intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=16,  # longer than the test's tokens: every layer sees them all
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
    )
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or "bias" in name or "sinks" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_gpt_oss_round_trip_is_bit_identical(tmp_path, layout):
    model = _gpt_oss(tmp_path / "hf")
    name = f"gpt-oss:{layout}"
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", name, progress=False)
    convert_with_recipe(tmp_path / "mt", tmp_path / "back", name, reverse=True, progress=False)
    source, back = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert sorted(source) == sorted(back)
    for key in source:
        np.testing.assert_array_equal(source[key], back[key], err_msg=key)
    reloaded = type(model).from_pretrained(tmp_path / "back")
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), reloaded.state_dict().values(), strict=True)
    )


def test_gpt_oss_pairs_layers_and_splits_gate_up_by_even_and_odd_columns(tmp_path):
    """Shapes are MaxText's own model's (gpt-oss-20b narrowed); values as MaxText's
    param_mapping.py pairs them (wi_0 = gate_up[..., ::2], wi_1 = gate_up[..., 1::2])."""
    _gpt_oss(tmp_path / "hf")
    hf = _tensors(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "gpt-oss:maxtext", progress=False)
    ckpt = suture.open(tmp_path / "mt")
    block = "params/params/decoder/layers/layers_1"  # HF layers 1 and 3 (full attention)
    shapes = {
        "GptOssAttention/query/kernel": (64, 2, 4, 16),
        "GptOssAttention/key/bias": (2, 2, 16),
        "GptOssAttention/out/bias": (64, 2),
        "GptOssAttention/sinks": (4, 2),
        "GptOssMlp/gate/kernel": (64, 2, 4),
        "GptOssMlp/wi_0": (4, 2, 64, 32),
        "GptOssMlp/wi_1_bias": (4, 2, 32),
        "GptOssMlp/wo": (4, 2, 32, 64),
    }
    for path, shape in shapes.items():
        assert ckpt[f"{block}/{path}"].shape == shape, path
    gate_up = hf["model.layers.3.mlp.experts.gate_up_proj"]
    np.testing.assert_array_equal(ckpt[f"{block}/GptOssMlp/wi_0"].read()[:, 1], gate_up[..., ::2])
    np.testing.assert_array_equal(ckpt[f"{block}/GptOssMlp/wi_1"].read()[:, 1], gate_up[..., 1::2])
    bias = hf["model.layers.3.mlp.experts.gate_up_proj_bias"]
    np.testing.assert_array_equal(
        ckpt[f"{block}/GptOssMlp/wi_1_bias"].read()[:, 1], bias[..., 1::2]
    )
    np.testing.assert_array_equal(
        ckpt[f"{block}/GptOssAttention/sinks"].read()[:, 1], hf["model.layers.3.self_attn.sinks"]
    )


# Llama 4: MoE and dense layers interleaved in a cycle of 4 ------------------------------------


def _llama4(folder, step):
    torch.manual_seed(0)
    config = transformers.Llama4TextConfig(
        **{**BASE, "num_hidden_layers": 8},
        head_dim=16,
        intermediate_size=32,
        intermediate_size_mlp=48,
        num_local_experts=4,
        num_experts_per_tok=1,
        interleave_moe_layer_step=step,
    )
    model = transformers.Llama4ForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("step", [1, 2], ids=["scout", "maverick"])
@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_llama4_round_trip_is_bit_identical(tmp_path, step, layout):
    model = _llama4(tmp_path / "hf", step)
    name = f"llama4:{layout}"
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", name, progress=False)
    convert_with_recipe(tmp_path / "mt", tmp_path / "back", name, reverse=True, progress=False)
    source, back = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert sorted(source) == sorted(back)
    for key in source:
        np.testing.assert_array_equal(source[key], back[key], err_msg=key)
    assert type(model).from_pretrained(tmp_path / "back") is not None


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_llama4_places_dense_and_moe_blocks_by_position_in_the_cycle(tmp_path, layout):
    """Maverick-like (every other layer MoE): shapes are MaxText's own model's
    (llama4-17b-128e narrowed); values as MaxText's standalone scripts place them."""
    _llama4(tmp_path / "hf", 2)
    hf = _tensors(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", f"llama4:{layout}", progress=False)
    ckpt = suture.open(tmp_path / "mt")
    moe, scanned = "Llama4MoEBlock_0", layout == "maxtext"
    blocks = {p.split("/")[3 + scanned] for p in ckpt.paths() if "/layers" in p}
    assert blocks == (
        {f"layers_{k}" for k in range(4)} if scanned else {f"layers_{i}" for i in range(8)}
    )
    mlp_at = "layers/layers_2" if scanned else "layers_6"
    moe_at = "layers/layers_3" if scanned else "layers_7"
    assert not any(f"{mlp_at}/{moe}" in p or f"{moe_at}/mlp/" in p for p in ckpt.paths())
    wi_1 = ckpt[f"params/params/decoder/{moe_at}/{moe}/MoeBlock_0/wi_1"].read()
    gate = ckpt[f"params/params/decoder/{moe_at}/{moe}/MoeBlock_0/gate/kernel"].read()
    wo = ckpt[f"params/params/decoder/{mlp_at}/mlp/wo/kernel"].read()
    if scanned:  # layers_3 holds HF layers 3 and 7; layers_2 holds 2 and 6
        assert wi_1.shape == (4, 2, 64, 32) and gate.shape == (64, 2, 4)
        wi_1, gate, wo = wi_1[:, 1], gate[:, 1], wo[:, 1]
    gate_up = hf["model.layers.7.feed_forward.experts.gate_up_proj"]  # (experts, hidden, 2 x mlp)
    np.testing.assert_array_equal(wi_1, gate_up[..., 32:])
    np.testing.assert_array_equal(gate, hf["model.layers.7.feed_forward.router.weight"].T)
    np.testing.assert_array_equal(wo, hf["model.layers.6.feed_forward.down_proj.weight"].T)


# DeepSeek-V3: multi-head latent attention and sigmoid routing, on the MaxText layout ----------


def _mla(h, p, config, mask):
    """Multi-head latent attention from MaxText's layout (rotary pairs, as DeepSeek stores them),
    with a query LoRA (wq_a, q_norm, wq_b) or V2-Lite's plain query projection."""
    eps, nope, rope = config["rms_norm_eps"], config["qk_nope_head_dim"], config["qk_rope_head_dim"]
    if "query" in p:
        q = jnp.einsum("bse,ehd->bshd", h, p["query"]["kernel"])
    else:
        q = jnp.einsum(
            "bsr,rhd->bshd",
            _rms_norm(h @ p["wq_a"]["kernel"], p["q_norm"]["scale"], eps),
            p["wq_b"]["kernel"],
        )
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
    cos, sin = (
        jnp.cos(positions * inv_freq)[None, :, None],
        jnp.sin(positions * inv_freq)[None, :, None],
    )

    def rotate(x):  # pairs (x0, x1), (x2, x3) rotated, written back as halves like transformers
        first, second = x[..., 0::2], x[..., 1::2]
        return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)

    q = jnp.concatenate([q[..., :nope], rotate(q[..., nope:])], axis=-1)
    k_rot = jnp.broadcast_to(rotate(k_rot[:, :, None]), k_nope.shape[:-1] + (rope,))
    k = jnp.concatenate([k_nope, k_rot], axis=-1)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (nope + rope) ** -0.5
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1)
    attended = jnp.einsum("bhqk,bkhd->bqhd", weights, value)
    return jnp.einsum("bshd,hde->bse", attended, p["out"]["kernel"])


def _deepseek_moe(h, block, config):
    """Sigmoid scores, top-k chosen with the score-correction bias, weighted without it."""
    router = block["MoeBlock_0"]
    scores = jax.nn.sigmoid(h @ router["gate"]["kernel"])
    _, chosen = jax.lax.top_k(scores + router["gate"]["bias"], config["num_experts_per_tok"])
    weights = jnp.take_along_axis(scores, chosen, axis=-1)
    weights = weights / (weights.sum(-1, keepdims=True) + 1e-20) * config["routed_scaling_factor"]
    return _routed_and_shared(h, block, chosen, weights)


def _routed_and_shared(h, block, chosen, weights):
    """DeepSeekMoeBlock's output: the `chosen` routed experts by `weights`, plus the shared ones."""
    router = block["MoeBlock_0"]
    hidden = jax.nn.silu(jnp.einsum("bse,xem->bsxm", h, router["wi_0"])) * jnp.einsum(
        "bse,xem->bsxm", h, router["wi_1"]
    )
    outputs = jnp.einsum("bsxm,xme->bsxe", hidden, router["wo"])
    routed = (jnp.take_along_axis(outputs, chosen[..., None], axis=2) * weights[..., None]).sum(2)
    shared = block["shared_experts"]
    gated = jax.nn.silu(h @ shared["wi_0"]["kernel"]) * (h @ shared["wi_1"]["kernel"])
    return routed + gated @ shared["wo"]["kernel"]


def _deepseek_logits(params, config, tokens, moe, *, scanned=False, mask_of=None):
    """MaxText's DeepSeek decoder: dense layers, then MoE layers whose block `moe(h, block,
    config)` computes; `mask_of(h, attention, config, causal)`, if given, a layer's mask."""
    decoder, eps = params["decoder"], config["rms_norm_eps"]
    causal = jnp.tril(jnp.ones((tokens.shape[1],) * 2, bool))
    x = params["token_embedder"]["embedding"][tokens]
    dense = config["first_k_dense_replace"]
    for i in range(config["num_hidden_layers"]):
        tree, index = ("dense_layers", i) if i < dense else ("moe_layers", i - dense)
        if scanned:  # every leaf has its layers on axis 1, the experts' and the router bias's too
            p = jax.tree.map(lambda a, index=index: a[:, index], decoder[tree])
        else:
            p = decoder[f"{tree}_{index}"]
        h = _rms_norm(x, p["pre_self_attention_layer_norm"]["scale"], eps)
        attention = p["self_attention"]
        mask = causal if mask_of is None else mask_of(h, attention, config, causal)
        x = x + _mla(h, attention, config, mask)
        h = _rms_norm(x, p["post_self_attention_layer_norm"]["scale"], eps)
        if i < dense:
            mlp = p["mlp"]
            gated = jax.nn.silu(h @ mlp["wi_0"]["kernel"]) * (h @ mlp["wi_1"]["kernel"])
            x = x + gated @ mlp["wo"]["kernel"]
        else:
            x = x + moe(h, p["DeepSeekMoeBlock_0"], config)
    return _rms_norm(x, decoder["decoder_norm"]["scale"], eps) @ decoder["logits_dense"]["kernel"]


def test_deepseek3_maxtext_layout_gives_transformers_logits(tmp_path):
    model = _save_model("deepseek3", tmp_path / "per-expert")
    with torch.no_grad():  # a score-correction bias that changes which experts are chosen
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(torch.randn_like(buffer) * 0.3)
    model.save_pretrained(tmp_path / "hf")
    convert_with_recipe(
        tmp_path / "hf", tmp_path / "mt", "deepseek3:maxtext-unscanned", progress=False
    )
    params = jax.tree.map(jnp.asarray, suture.load(tmp_path / "mt")["params"]["params"])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    ours = _deepseek_logits(params, config, jnp.asarray(TOKENS), _deepseek_moe)
    with torch.no_grad():
        theirs = model(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)


# Tables that do not follow the schema ---------------------------------------------------------


@pytest.mark.parametrize(
    ("leaf", "top", "message"),
    [
        (
            {"maxtext": "decoder/layers/w", "hf": "m.{layer}.experts.{expert}.w"},
            {},
            "needs a layer placeholder beside it and a top-level 'experts'",
        ),
        (
            {
                "maxtext": "decoder/layers/w",
                "hf": "m.{layer}.w",
                "fused": {"hf": "m.{layer}.f", "split": {"axis": 1, "part": 2}},
            },
            {},
            "split part 2 is not one of 2 parts",
        ),
        (
            {"maxtext": "decoder/layers/w", "hf": "m.{layer}.w", "fused": {"split": {}}},
            {},
            "'fused' needs",
        ),
        (
            {"maxtext": "decoder/layers/w", "hf": "m.{layer}.w"},
            {"language_model": {"prefixes": ["x."]}},
            "'language_model' needs",
        ),
    ],
)
def test_a_table_outside_the_schema_is_an_error_naming_the_leaf(leaf, top, message):
    from suture.families._tables import _parse

    data = {"follows": "x", "description": "x", "source_file": "mine.yaml", "leaves": [leaf], **top}
    with pytest.raises(families.RecipeFormatError, match=message):
        _parse("mine", data, True)


def _gpt_oss_layer(x, p, config, mask):
    """One gpt-oss layer from MaxText's layout: biased attention with per-head sinks, then
    top-k of the biased router logits, softmax over the chosen, clamped SwiGLU experts."""
    eps, attention, mlp = config["rms_norm_eps"], p["GptOssAttention"], p["GptOssMlp"]
    h = _rms_norm(x, p["pre_self_attention_layer_norm"]["scale"], eps)
    q, k, v = (
        jnp.einsum("bse,ehd->bshd", h, attention[part]["kernel"]) + attention[part]["bias"]
        for part in ("query", "key", "value")
    )
    theta = config["rope_parameters"]["rope_theta"]
    q, k = _rope(q, theta, False), _rope(k, theta, False)
    groups = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    scores = jnp.where(mask, scores, -1e30)
    sinks = jnp.broadcast_to(attention["sinks"][None, :, None, None], scores.shape[:-1] + (1,))
    weights = jax.nn.softmax(jnp.concatenate([scores, sinks], axis=-1), axis=-1)[..., :-1]
    attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    x = (
        x
        + jnp.einsum("bshd,hde->bse", attended, attention["out"]["kernel"])
        + attention["out"]["bias"]
    )
    h = _rms_norm(x, p["post_self_attention_layer_norm"]["scale"], eps)
    logits = h @ mlp["gate"]["kernel"] + mlp["gate"]["bias"]
    top, chosen = jax.lax.top_k(logits, config["num_experts_per_tok"])
    weights = jax.nn.softmax(top, axis=-1)
    limit, alpha = config["swiglu_limit"], config.get("swiglu_alpha", 1.702)
    gate = jnp.einsum("bse,xem->bsxm", h, mlp["wi_0"]) + mlp["wi_0_bias"]
    up = jnp.einsum("bse,xem->bsxm", h, mlp["wi_1"]) + mlp["wi_1_bias"]
    gate, up = jnp.minimum(gate, limit), jnp.clip(up, -limit, limit)
    hidden = (up + 1) * gate * jax.nn.sigmoid(gate * alpha)
    outputs = jnp.einsum("bsxm,xme->bsxe", hidden, mlp["wo"]) + mlp["wo_bias"]
    picked = jnp.take_along_axis(outputs, chosen[..., None], axis=2)
    return x + (picked * weights[..., None]).sum(axis=2)


def test_gpt_oss_maxtext_layout_gives_transformers_logits(tmp_path):
    model = _gpt_oss(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "gpt-oss:maxtext", progress=False)
    params = jax.tree.map(jnp.asarray, suture.load(tmp_path / "mt")["params"]["params"])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    decoder = params["decoder"]
    tokens = jnp.asarray(TOKENS)
    mask = jnp.tril(jnp.ones((tokens.shape[1],) * 2, bool))
    x = params["token_embedder"]["embedding"][tokens]
    for i in range(config["num_hidden_layers"]):  # layers_0: HF 0, 2, ...; layers_1: 1, 3, ...
        p = jax.tree.map(lambda a, i=i: a[:, i // 2], decoder["layers"][f"layers_{i % 2}"])
        x = _gpt_oss_layer(x, p, config, mask)
    x = _rms_norm(x, decoder["decoder_norm"]["scale"], config["rms_norm_eps"])
    ours = x @ decoder["logits_dense"]["kernel"]
    with torch.no_grad():
        theirs = model(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)


def _llama4_layer(x, p, config, i, mask):
    """One Llama 4 layer from MaxText's layout: attention (rotary pairs and an L2 q/k norm on
    rope layers, none on the others), then a dense MLP or the MoE block (top-k of the router
    logits, sigmoid scores scaling each expert's input, plus the shared expert)."""
    eps = config["rms_norm_eps"]
    attention = p["self_attention"]
    h = _rms_norm(x, p["pre_self_attention_layer_norm"]["scale"], eps)
    q, k, v = (
        jnp.einsum("bse,ehd->bshd", h, attention[part]["kernel"])
        for part in ("query", "key", "value")
    )
    if config["no_rope_layers"][i]:  # 1: a rope layer
        theta = config["rope_parameters"]["rope_theta"]
        q, k = _rope(q, theta, True), _rope(k, theta, True)
        if config["use_qk_norm"]:
            q, k = _rms_norm(q, 1.0, eps), _rms_norm(k, 1.0, eps)
    groups = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1)
    x = x + jnp.einsum(
        "bshd,hde->bse", jnp.einsum("bhqk,bkhd->bqhd", weights, v), attention["out"]["kernel"]
    )
    h = _rms_norm(x, p["post_self_attention_layer_norm"]["scale"], eps)
    if "mlp" in p:
        mlp = p["mlp"]
        return (
            x
            + (jax.nn.silu(h @ mlp["wi_0"]["kernel"]) * (h @ mlp["wi_1"]["kernel"]))
            @ mlp["wo"]["kernel"]
        )
    block = p["Llama4MoEBlock_0"]
    routed = block["MoeBlock_0"]
    logits = h @ routed["gate"]["kernel"]
    top, _ = jax.lax.top_k(logits, config["num_experts_per_tok"])
    scores = jax.nn.sigmoid(jnp.where(logits >= top[..., -1:], logits, -jnp.inf))
    scaled = h[..., None, :] * scores[..., None]  # (batch, seq, experts, embed)
    hidden = jax.nn.silu(jnp.einsum("bsxe,xem->bsxm", scaled, routed["wi_0"])) * jnp.einsum(
        "bsxe,xem->bsxm", scaled, routed["wi_1"]
    )
    out = jnp.einsum("bsxm,xme->bse", hidden, routed["wo"])
    shared = block["shared_experts"]
    gated = jax.nn.silu(h @ shared["wi_0"]["kernel"]) * (h @ shared["wi_1"]["kernel"])
    return x + out + gated @ shared["wo"]["kernel"]


def test_llama4_maxtext_layout_gives_transformers_logits(tmp_path):
    model = _llama4(tmp_path / "hf", 2)
    with torch.no_grad():  # non-trivial norms, so that a wrong mapping shows
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "llama4:maxtext", progress=False)
    params = jax.tree.map(jnp.asarray, suture.load(tmp_path / "mt")["params"]["params"])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    decoder = params["decoder"]
    tokens = jnp.asarray(TOKENS)
    mask = jnp.tril(jnp.ones((tokens.shape[1],) * 2, bool))
    x = params["token_embedder"]["embedding"][tokens]
    for i in range(config["num_hidden_layers"]):  # layers_k holds HF layers k, k + 4
        p = jax.tree.map(lambda a, i=i: a[:, i // 4], decoder["layers"][f"layers_{i % 4}"])
        x = _llama4_layer(x, p, config, i, mask)
    x = _rms_norm(x, decoder["decoder_norm"]["scale"], config["rms_norm_eps"])
    ours = x @ decoder["logits_dense"]["kernel"]
    with torch.no_grad():
        theirs = model(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)
