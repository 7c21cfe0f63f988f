"""Model families: HF <-> MaxText recipes, proven with transformers' own models.

Tiny random models are made with transformers (`save_pretrained`), converted to MaxText's
layout and back; the round trip is compared bit for bit, and the MaxText-layout weights are
run through a JAX forward pass written here from MaxText's definition of the model, whose
logits must match transformers' own.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

import suture
from suture import families
from suture.families._convert import convert_with_recipe

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TOKENS = np.array([[1, 5, 9, 2, 33, 7, 60, 3]])


def _llama_config(**extra):
    base = dict(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
    )  # head_dim 16: sqrt is a power of two, so the query scale is exact
    return {**base, **extra}


MODELS = {
    "llama2": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**_llama_config())),
    "llama3.1": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**_llama_config())),
    "mistral": lambda: transformers.MistralForCausalLM(
        transformers.MistralConfig(**_llama_config(sliding_window=None))
    ),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(**_llama_config(head_dim=16, tie_word_embeddings=True))
    ),
    "gemma2": lambda: transformers.Gemma2ForCausalLM(
        transformers.Gemma2Config(**_llama_config(head_dim=16, query_pre_attn_scalar=16))
    ),
}


def _vary_norms(model):
    """`model`, its norms made non-trivial, so that a wrong mapping shows."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    return model


def _save_model(family: str, folder) -> object:
    torch.manual_seed(0)
    model = _vary_norms(MODELS[family]().eval())
    model.save_pretrained(folder)
    return model


def _tensors(folder) -> dict[str, np.ndarray]:
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def _assert_same_tensors(expected, actual, *, same_config: bool = False) -> dict[str, np.ndarray]:
    """The folders hold the same tensors, dtypes and bits (and config.json, if `same_config`);
    returns `expected`'s tensors."""
    source, back = _tensors(expected), _tensors(actual)
    assert sorted(source) == sorted(back)
    for key in source:
        assert source[key].dtype == back[key].dtype, key
        np.testing.assert_array_equal(source[key], back[key], err_msg=key)
    if same_config:
        assert json.loads((actual / "config.json").read_text()) == json.loads(
            (expected / "config.json").read_text()
        )
    return source


def _assert_tree(folder, expected: dict[str, tuple[int, ...]]):
    """The checkpoint in `folder` has `expected`'s paths (and step), of those shapes; returned."""
    ckpt = suture.open(folder)
    assert sorted(p for p in ckpt.paths() if p != "step") == sorted(expected)
    for path, shape in expected.items():
        assert tuple(ckpt[path].shape) == shape, path
    return ckpt


def _assert_refused(tmp_path, recipe: str, match: str) -> None:
    """Converting tmp_path/hf with `recipe` is a ConfigMismatchError matching `match`: nothing
    written, the source's tensors unchanged."""
    source = _tensors(tmp_path / "hf")
    with pytest.raises(families.ConfigMismatchError, match=match):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", recipe, progress=False)
    assert not (tmp_path / "mt").exists()
    assert all(np.array_equal(source[k], v) for k, v in _tensors(tmp_path / "hf").items())


def _cli(*args: str):
    from typer.testing import CliRunner

    from suture.cli import app

    return CliRunner().invoke(app, list(args))


def _cli_shows_family(family: str, config) -> str:
    """`suture recipes` lists `family`'s two layouts; the table `suture recipes family:maxtext
    --config config` shows is returned."""
    listed = _cli("recipes")
    assert listed.exit_code == 0
    assert f"{family}:maxtext " in listed.output
    assert f"{family}:maxtext-unscanned" in listed.output
    shown = _cli("recipes", f"{family}:maxtext", "--config", str(config))
    assert shown.exit_code == 0, shown.output
    return shown.output


def _cli_round_trip(tmp_path, recipe: str, *back_options: str) -> None:
    """`suture convert` tmp_path/hf to mt and back with `recipe`: the tensors come back bit for bit."""
    common = ["--recipe", recipe, "--no-progress"]
    for source, target, more in (("hf", "mt", []), ("mt", "back", ["--reverse", *back_options])):
        done = _cli("convert", str(tmp_path / source), str(tmp_path / target), *common, *more)
        assert done.exit_code == 0, done.output
    source, restored = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert sorted(source) == sorted(restored)
    assert all(np.array_equal(source[k], restored[k]) for k in source)


@pytest.mark.parametrize("family", ["llama2", "llama3.1", "mistral", "qwen3"])
@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_round_trip_is_bit_identical(tmp_path, family, layout):
    _save_model(family, tmp_path / "hf")
    name = f"{family}:{layout}"
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", name, progress=False)
    convert_with_recipe(tmp_path / "mt", tmp_path / "back", name, reverse=True, progress=False)
    _assert_same_tensors(tmp_path / "hf", tmp_path / "back", same_config=True)
    reloaded = type(MODELS[family]()).from_pretrained(tmp_path / "back")
    assert reloaded is not None


def test_stock_orbax_restores_the_maxtext_tree(tmp_path):
    import orbax.checkpoint as ocp

    _save_model("llama3.1", tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "llama3.1:maxtext", progress=False)
    restored = ocp.PyTreeCheckpointer().restore(tmp_path / "mt")
    assert restored["step"] == 0
    assert sorted(restored["params"]["params"]) == ["decoder", "token_embedder"]
    layers = restored["params"]["params"]["decoder"]["layers"]
    assert layers["mlp"]["wo"]["kernel"].shape == (96, 2, 64)  # (mlp, layer, embed)
    assert layers["self_attention"]["out"]["kernel"].shape == (
        4,
        2,
        16,
        64,
    )  # (heads, layer, head_dim, embed)
    np.testing.assert_array_equal(
        layers["mlp"]["wo"]["kernel"],
        suture.open(tmp_path / "mt")["params/params/decoder/layers/mlp/wo/kernel"].read(),
    )


def test_gemma2_round_trip_within_half_an_ulp_of_one(tmp_path):
    _save_model("gemma2", tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "gemma2:maxtext", progress=False)
    convert_with_recipe(
        tmp_path / "mt", tmp_path / "back", "gemma2:maxtext", reverse=True, progress=False
    )
    source, back = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert sorted(source) == sorted(back)
    for key in source:
        if "norm" in key:  # stored as 1 + w in MaxText: (w + 1) - 1 is within half an ulp of 1
            np.testing.assert_allclose(
                back[key], source[key], rtol=0, atol=np.spacing(np.float32(1)) / 2
            )
        else:  # embedding x sqrt(64) = x 8 and query x 1/4: powers of two, exact
            np.testing.assert_array_equal(back[key], source[key], err_msg=key)


def test_gemma2_maxtext_layout_pairs_layers_and_pads_the_vocabulary(tmp_path):
    _save_model("gemma2", tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "gemma2:maxtext", progress=False)
    hf, ckpt = _tensors(tmp_path / "hf"), suture.open(tmp_path / "mt")
    params = "params/params/decoder/layers"
    local_q = ckpt[f"{params}/self_attention_local/query/kernel"].read()
    global_q = ckpt[f"{params}/self_attention_global/query/kernel"].read()
    assert local_q.shape == (64, 1, 4, 16)  # (embed, layer, heads, head_dim): 2 HF layers = 1 pair
    q0 = hf["model.layers.0.self_attn.q_proj.weight"].T.reshape(64, 4, 16) * np.float32(0.25)
    q1 = hf["model.layers.1.self_attn.q_proj.weight"].T.reshape(64, 4, 16) * np.float32(0.25)
    np.testing.assert_array_equal(local_q[:, 0], q0)
    np.testing.assert_array_equal(global_q[:, 0], q1)
    norm = ckpt[f"{params}/pre_ffw_norm_global/scale"].read()
    np.testing.assert_array_equal(
        norm[:, 0], hf["model.layers.1.pre_feedforward_layernorm.weight"] + 1
    )
    embedding = ckpt["params/params/token_embedder/embedding"].read()
    np.testing.assert_array_equal(embedding, hf["model.embed_tokens.weight"] * np.float32(8))


# A forward pass written from MaxText's model definition, on the MaxText layout -----------------


def _rms_norm(x, scale, eps):
    variance = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(variance + eps) * scale


def _rope(x, theta, interleaved):
    """x: (batch, seq, heads, head_dim); MaxText's rotary: halves, or pairs for Llama 3.1."""
    d = x.shape[-1]
    positions = jnp.arange(x.shape[1])[:, None]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    angles = (positions * inv_freq)[None, :, None, :]
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    if interleaved:
        first, second = x[..., 0::2], x[..., 1::2]
        rotated = jnp.stack([first * cos - second * sin, second * cos + first * sin], axis=-1)
        return rotated.reshape(x.shape)
    first, second = x[..., : d // 2], x[..., d // 2 :]
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def _maxtext_logits(params, config, tokens, *, interleaved, qk_norm, runtime_query_scale):
    decoder, eps = params["decoder"], config["rms_norm_eps"]
    theta = (config.get("rope_parameters") or {}).get(
        "rope_theta", config.get("rope_theta", 10000.0)
    )
    layers = decoder["layers"]
    x = params["token_embedder"]["embedding"][tokens]
    seq = tokens.shape[1]
    mask = jnp.tril(jnp.ones((seq, seq), bool))
    for i in range(config["num_hidden_layers"]):
        take = lambda tree, i=i: jax.tree.map(lambda a: a[:, i] if a.ndim > 1 else a, tree)  # noqa: E731
        attention, mlp = take(layers["self_attention"]), take(layers["mlp"])
        h = _rms_norm(x, layers["pre_self_attention_layer_norm"]["scale"][:, i], eps)
        q = jnp.einsum("bse,ehd->bshd", h, attention["query"]["kernel"])
        k = jnp.einsum("bse,ehd->bshd", h, attention["key"]["kernel"])
        v = jnp.einsum("bse,ehd->bshd", h, attention["value"]["kernel"])
        if qk_norm:
            q = _rms_norm(q, attention["query_norm"]["scale"], eps)
            k = _rms_norm(k, attention["key_norm"]["scale"], eps)
        q, k = _rope(q, theta, interleaved), _rope(k, theta, interleaved)
        if runtime_query_scale:
            q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
        groups = q.shape[2] // k.shape[2]
        k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        weights = jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1)
        attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        x = x + jnp.einsum(
            "bshd,hde->bse", attended, layers["self_attention"]["out"]["kernel"][:, i]
        )
        h = _rms_norm(x, layers["post_self_attention_layer_norm"]["scale"][:, i], eps)
        gate = jax.nn.silu(h @ mlp["wi_0"]["kernel"]) * (h @ mlp["wi_1"]["kernel"])
        x = x + gate @ layers["mlp"]["wo"]["kernel"][:, i]
    x = _rms_norm(x, decoder["decoder_norm"]["scale"], eps)
    if "logits_dense" in decoder:
        return x @ decoder["logits_dense"]["kernel"]
    return x @ params["token_embedder"]["embedding"].T


@pytest.mark.parametrize(
    ("family", "interleaved", "qk_norm", "runtime_query_scale"),
    [
        ("llama2", False, False, False),
        ("llama3.1", True, False, False),
        ("qwen3", False, True, True),
    ],
)
def test_maxtext_layout_gives_transformers_logits(
    tmp_path, family, interleaved, qk_norm, runtime_query_scale
):
    model = _save_model(family, tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", f"{family}:maxtext", progress=False)
    loaded = suture.load(tmp_path / "mt")
    params = jax.tree.map(jnp.asarray, loaded["params"]["params"])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    ours = _maxtext_logits(
        params,
        config,
        jnp.asarray(TOKENS),
        interleaved=interleaved,
        qk_norm=qk_norm,
        runtime_query_scale=runtime_query_scale,
    )
    with torch.no_grad():
        theirs = model(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)


# Checked configs and clear errors -------------------------------------------------------------


def test_recipe_refuses_a_model_of_another_family(tmp_path):
    _save_model("qwen3", tmp_path / "hf")
    with pytest.raises(families.ConfigMismatchError, match="model_type.*'qwen3'.*llama3.1:maxtext"):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "llama3.1:maxtext", progress=False)
    assert not (tmp_path / "mt").exists()


def test_recipe_refuses_attention_biases_naming_the_field(tmp_path):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**_llama_config(attention_bias=True))
    )
    model.save_pretrained(tmp_path / "hf")
    with pytest.raises(
        families.ConfigMismatchError, match="'attention_bias' is True: MaxText's Llama has no"
    ):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "llama2:maxtext", progress=False)


def test_config_that_does_not_fit_the_weights_names_the_leaf(tmp_path):
    _save_model("llama2", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["num_attention_heads"] = 8  # head_dim 16 x 8 heads = 128 != 64
    with pytest.raises(suture.SurgeryError, match="q_proj/weight.*expected 8 x 16 = 128"):
        convert_with_recipe(
            tmp_path / "hf", tmp_path / "mt", "llama2:maxtext", config=config, progress=False
        )
    assert not (tmp_path / "mt").exists()


def test_unknown_recipe_lists_the_closest_built_in_ones():
    with pytest.raises(
        suture.SurgeryError, match=r"(?s)Did you mean:\n  llama3.1:maxtext\n.*`suture recipes`"
    ):
        families.get_recipe("llama3.1:maxtxt")


def test_missing_config_says_how_to_pass_it(tmp_path):
    _save_model("llama2", tmp_path / "hf")
    (tmp_path / "hf" / "config.json").unlink()
    with pytest.raises(suture.SurgeryError, match="needs the model's config.json.*--config"):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "llama2:maxtext", progress=False)


def test_operations_table_says_how_close_a_round_trip_comes():
    config = _llama_config(model_type="llama", num_attention_heads=8)  # head_dim 8: sqrt(8) inexact
    rows = dict(
        (maxtext, ops)
        for maxtext, _, ops in families.get_recipe("llama3.1:maxtext").operations_table(config)
    )
    assert "within 1 ulp" in rows["decoder/layers/self_attention/query/kernel"]
    assert "interleave" in rows["decoder/layers/self_attention/key/kernel"]
    exact = families.get_recipe("llama3.1:maxtext").operations_table(
        _llama_config(model_type="llama")
    )
    assert (
        "exact round trip"
        in dict((m, o) for m, _, o in exact)["decoder/layers/self_attention/query/kernel"]
    )


# The command line -----------------------------------------------------------------------------


def test_cli_lists_recipes_and_converts_both_ways(tmp_path):
    listed = _cli("recipes")
    assert listed.exit_code == 0
    assert "llama3.1:maxtext " in listed.output and "gemma2:maxtext-unscanned" in listed.output
    _save_model("llama3.1", tmp_path / "hf")
    shown = _cli("recipes", "llama3.1:maxtext", "--config", str(tmp_path / "hf" / "config.json"))
    assert (
        shown.exit_code == 0 and "param_mapping.py" in shown.output and "interleave" in shown.output
    )
    _cli_round_trip(tmp_path, "llama3.1:maxtext")
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    wrong = _cli("convert", str(tmp_path / "hf"), str(tmp_path / "x"), "--recipe", "qwen3:maxtext")
    assert wrong.exit_code == 2 and "Error:" in wrong.output and "model_type" in wrong.output


def test_convert_dry_run_prints_a_family_recipes_plan_both_ways(tmp_path):
    """`suture convert --dry-run --recipe FAMILY:maxtext` prints each MaxText leaf with its HF
    tensor and operations, and the bytes, writing nothing; --reverse plans the way back."""
    _save_model("llama3.1", tmp_path / "hf")
    common = ["--recipe", "llama3.1:maxtext", "--dry-run"]
    planned = _cli("convert", str(tmp_path / "hf"), str(tmp_path / "mt"), *common)
    assert planned.exit_code == 0, planned.output
    assert "params/params/decoder/layers/self_attention/query/kernel" in planned.output
    assert "model/layers/0/self_attn/q_proj/weight" in planned.output
    assert "reads" in planned.output and "No problems." in planned.output
    assert not (tmp_path / "mt").exists()
    assert _cli("convert", str(tmp_path / "hf"), str(tmp_path / "mt"), *common[:2]).exit_code == 0
    back = _cli("convert", str(tmp_path / "mt"), str(tmp_path / "back"), *common, "--reverse")
    assert back.exit_code == 0, back.output
    assert "model/layers/0/self_attn/q_proj/weight" in back.output
    assert "params/params/decoder/layers/self_attention/q" in back.output
    assert not (tmp_path / "back").exists()


def test_convert_dry_run_refuses_a_mesh_as_the_run_does(tmp_path):
    """A family recipe without MaxText's logical axes (a Tunix one) refuses --mesh alone:
    the dry run says so too, where it printed a plan with no problems."""
    _save_model("llama3.1", tmp_path / "hf")
    common = ["--recipe", "llama3:tunix", "--mesh", "fsdp=2", "--no-progress"]
    dry = _cli("convert", str(tmp_path / "hf"), str(tmp_path / "out"), *common, "--dry-run")
    run = _cli("convert", str(tmp_path / "hf"), str(tmp_path / "out"), *common)
    assert dry.exit_code == run.exit_code == 2
    assert "does not know MaxText's logical axes" in dry.output
    assert dry.output == run.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "options",
    [["--quantize", "W8A16"], ["--group-size", "64"], ["--format", "safetensors"]],
    ids=str,
)
def test_a_family_recipe_refuses_options_it_would_leave_unused(tmp_path, options):
    """A family recipe writes its layout unquantized, Orbax forward: --quantize (or a format
    it does not write) wrote an unquantized Orbax checkpoint and said nothing."""
    _save_model("llama3.1", tmp_path / "hf")
    common = ["--recipe", "llama3.1:maxtext", "--no-progress", *options]
    for dry in ([], ["--dry-run"]):
        done = _cli("convert", str(tmp_path / "hf"), str(tmp_path / "mt"), *common, *dry)
        assert done.exit_code == 2 and "does not go with the family recipe" in done.output
        assert options[0] in done.output
    assert not (tmp_path / "mt").exists()
    back = ["--recipe", "llama3.1:maxtext", "--reverse", "--format", "orbax"]
    done = _cli("convert", str(tmp_path / "hf"), str(tmp_path / "back"), *back)
    assert done.exit_code == 2 and "which writes safetensors" in done.output


def test_a_family_recipe_refuses_an_output_named_as_one_safetensors_file(tmp_path):
    """`convert` writes one safetensors file to a name ending in .safetensors; a family
    recipe wrote an Orbax folder (or an HF folder back) under that name and exit 0."""
    _save_model("llama3.1", tmp_path / "hf")
    named = str(tmp_path / "model.safetensors")
    for dry in ([], ["--dry-run"]):
        done = _cli("convert", str(tmp_path / "hf"), named, "--recipe", "llama3.1:maxtext", *dry)
        assert done.exit_code == 2, done.output
        assert "model.safetensors" in done.output and "writes an Orbax folder" in done.output
        assert "without .safetensors" in done.output
    with pytest.raises(suture.SurgeryError, match="writes a Hugging Face folder"):
        suture.convert(tmp_path / "hf", named, recipe="llama3.1:maxtext", reverse=True)
    assert not (tmp_path / "model.safetensors").exists()
    suture.convert(tmp_path / "hf", named, recipe="llama3.1:maxtext", format="orbax",
                   progress=False)  # fmt: skip
    assert suture.open(named).format == "orbax"  # asked for by name: written


def test_python_convert_takes_built_in_recipe_names(tmp_path):
    _save_model("qwen3", tmp_path / "hf")
    suture.convert(
        tmp_path / "hf", tmp_path / "mt", recipe="qwen3:maxtext-unscanned", progress=False
    )
    ckpt = suture.open(tmp_path / "mt")
    assert "params/params/decoder/layers_1/self_attention/query_norm/scale" in ckpt.paths()
    assert "params/params/decoder/logits_dense/kernel" not in ckpt.paths()  # tied embeddings
    with pytest.raises(suture.SurgeryError, match="reverse= and config= go with a built-in"):
        suture.convert(tmp_path / "hf", tmp_path / "x", reverse=True, progress=False)
