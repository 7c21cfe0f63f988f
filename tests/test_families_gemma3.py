"""The gemma3 recipe: layer period 6 with a remainder, 1+w norms, the embedding's bfloat16 scale,
MaxText's shorter vocabulary, and the language model of a multimodal folder.

Tiny random models made with transformers (`Gemma3ForCausalLM`, `Gemma3ForConditionalGeneration`,
`save_pretrained`) go to MaxText's layout and back; the MaxText-layout weights run through a
JAX forward pass written from MaxText's Gemma 3 decoder, whose logits match transformers'.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import suture
from suture.families._convert import convert_with_recipe

from .test_families import TOKENS, _rope

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TEXT = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=32,
    num_hidden_layers=8,  # one period of 6 (5 local + 1 global) and 2 left over
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
    query_pre_attn_scalar=16,
    sliding_window=16,
)
HALF_ULP_OF_ONE = np.spacing(np.float32(1)) / 2


def _perturbed(model):
    with torch.no_grad():  # non-trivial norms, so that a wrong mapping shows
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    return model.eval()


def _text_model(folder, **extra):
    torch.manual_seed(0)
    model = _perturbed(
        transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**{**TEXT, **extra}))
    )
    model.save_pretrained(folder)
    return model


def _multimodal_model(folder):
    torch.manual_seed(0)
    vision = transformers.SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
    )
    config = transformers.Gemma3Config(
        text_config=TEXT, vision_config=vision.to_dict(), mm_tokens_per_image=4
    )
    model = _perturbed(transformers.Gemma3ForConditionalGeneration(config))
    model.save_pretrained(folder)
    return model


def _tensors(folder) -> dict[str, np.ndarray]:
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def _assert_round_trip(source, back):
    assert sorted(source) == sorted(back)
    for key in source:
        if "norm" in key:  # stored as 1 + w: (w + 1) - 1 is within half an ulp of 1
            np.testing.assert_allclose(back[key], source[key], rtol=0, atol=HALF_ULP_OF_ONE)
        else:  # the embedding's factor bfloat16(sqrt(64)) = 8 is a power of two: exact
            np.testing.assert_array_equal(back[key], source[key], err_msg=key)


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_gemma3_round_trip(tmp_path, layout):
    _text_model(tmp_path / "hf")
    name = f"gemma3:{layout}"
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", name, progress=False)
    convert_with_recipe(tmp_path / "mt", tmp_path / "back", name, reverse=True, progress=False)
    _assert_round_trip(_tensors(tmp_path / "hf"), _tensors(tmp_path / "back"))
    assert transformers.Gemma3ForCausalLM.from_pretrained(tmp_path / "back") is not None


def test_scanned_gemma3_stacks_by_position_in_the_period_and_keeps_the_rest_unscanned(tmp_path):
    _text_model(tmp_path / "hf")
    hf = _tensors(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "gemma3:maxtext", progress=False)
    ckpt = suture.open(tmp_path / "mt")
    decoder = "params/params/decoder"
    assert sorted({p.split("/")[4] for p in ckpt.paths() if "/layers/" in p}) == [
        f"layers_{k}" for k in range(6)
    ]
    assert sorted({p.split("/")[4] for p in ckpt.paths() if "layers_remainder" in p}) == [
        "layers_0",
        "layers_1",
    ]
    query = ckpt[f"{decoder}/layers/layers_5/self_attention/query/kernel"].read()
    assert query.shape == (64, 1, 4, 16)  # one full period: HF layer 5 (the global one)
    np.testing.assert_array_equal(
        query[:, 0], hf["model.layers.5.self_attn.q_proj.weight"].T.reshape(64, 4, 16)
    )
    left = ckpt[f"{decoder}/layers_remainder/layers_1/mlp/wo/kernel"].read()
    np.testing.assert_array_equal(left, hf["model.layers.7.mlp.down_proj.weight"].T)
    norm = ckpt[f"{decoder}/layers/layers_2/pre_ffw_norm/scale"].read()
    np.testing.assert_array_equal(
        norm[:, 0], hf["model.layers.2.pre_feedforward_layernorm.weight"] + 1
    )
    embedding = ckpt["params/params/token_embedder/embedding"].read()
    np.testing.assert_array_equal(embedding, hf["model.embed_tokens.weight"] * np.float32(8))


def test_gemma3_vocabulary_is_cut_to_maxtexts_and_like_restores_it(tmp_path):
    _text_model(tmp_path / "hf", vocab_size=262208)  # Gemma 3's; MaxText keeps 262144 rows
    hf = _tensors(tmp_path / "hf")["model.embed_tokens.weight"]
    with pytest.warns(suture.families.LeftOutWarning, match="keeps 262144 of the 262208 rows"):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "gemma3:maxtext", progress=False)
    embedding = suture.open(tmp_path / "mt")["params/params/token_embedder/embedding"]
    assert embedding.shape == (262144, 64)
    convert_with_recipe(
        tmp_path / "mt", tmp_path / "zeros", "gemma3:maxtext", reverse=True, progress=False
    )
    back = _tensors(tmp_path / "zeros")["model.embed_tokens.weight"]
    np.testing.assert_array_equal(back[:262144], hf[:262144])
    assert not back[262144:].any()  # without the original, the cut rows come back as zeros
    convert_with_recipe(
        tmp_path / "mt",
        tmp_path / "back",
        "gemma3:maxtext",
        reverse=True,
        like=tmp_path / "hf",
        progress=False,
    )
    _assert_round_trip(_tensors(tmp_path / "hf"), _tensors(tmp_path / "back"))
    table = suture.families.get_recipe("gemma3:maxtext").operations_table(
        json.loads((tmp_path / "hf" / "config.json").read_text())
    )
    assert (
        "cut rows to 262144 (64 rows past it are left out"
        in dict((m, ops) for m, _, ops in table)["token_embedder/embedding"]
    )


def test_multimodal_gemma3_converts_its_language_model_and_like_restores_the_vision_tower(
    tmp_path,
):
    model = _multimodal_model(tmp_path / "hf")
    source = _tensors(tmp_path / "hf")
    with pytest.warns(suture.families.LeftOutWarning, match="leaves out 34 tensor.*--like"):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "gemma3:maxtext", progress=False)
    ckpt = suture.open(tmp_path / "mt")
    assert not any("vision" in path for path in ckpt.paths())
    np.testing.assert_array_equal(
        ckpt["params/params/decoder/layers_remainder/layers_0/mlp/wi_0/kernel"].read(),
        source["language_model.model.layers.6.mlp.gate_proj.weight"].T,
    )
    convert_with_recipe(
        tmp_path / "mt", tmp_path / "text", "gemma3:maxtext", reverse=True, progress=False
    )
    text = _tensors(tmp_path / "text")
    assert sorted(text) == sorted(k for k in source if k.startswith("language_model."))
    convert_with_recipe(
        tmp_path / "mt",
        tmp_path / "back",
        "gemma3:maxtext",
        reverse=True,
        like=tmp_path / "hf",
        progress=False,
    )
    _assert_round_trip(source, _tensors(tmp_path / "back"))
    reloaded = transformers.Gemma3ForConditionalGeneration.from_pretrained(tmp_path / "back")
    assert sorted(reloaded.state_dict()) == sorted(model.state_dict())


# A forward pass written from MaxText's Gemma 3 decoder, on the MaxText layout ------------------


def _norm(x, scale, eps):  # MaxText stores Gemma's 1 + w
    variance = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(variance + eps) * scale


def _layer(x, p, config, theta, mask):
    eps = config["rms_norm_eps"]
    h = _norm(x, p["pre_self_attention_norm"]["scale"], eps)
    attention = p["self_attention"]
    q = jnp.einsum("bse,ehd->bshd", h, attention["query"]["kernel"])
    k = jnp.einsum("bse,ehd->bshd", h, attention["key"]["kernel"])
    v = jnp.einsum("bse,ehd->bshd", h, attention["value"]["kernel"])
    q = _rope(_norm(q, attention["query_norm"]["scale"], eps), theta, False)
    k = _rope(_norm(k, attention["key_norm"]["scale"], eps), theta, False)
    q = q * config["query_pre_attn_scalar"] ** -0.5
    groups = q.shape[2] // k.shape[2]
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1)
    attended = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
    out = jnp.einsum("bshd,hde->bse", attended, attention["out"]["kernel"])
    x = x + _norm(out, p["post_self_attention_norm"]["scale"], eps)
    h = _norm(x, p["pre_ffw_norm"]["scale"], eps)
    mlp = p["mlp"]
    gated = jax.nn.gelu(h @ mlp["wi_0"]["kernel"], approximate=True) * (h @ mlp["wi_1"]["kernel"])
    return x + _norm(gated @ mlp["wo"]["kernel"], p["post_ffw_norm"]["scale"], eps)


def test_maxtext_layout_gives_transformers_logits(tmp_path):
    model = _text_model(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "gemma3:maxtext", progress=False)
    params = jax.tree.map(jnp.asarray, suture.load(tmp_path / "mt")["params"]["params"])
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    thetas = {kind: r["rope_theta"] for kind, r in config["rope_parameters"].items()}
    tokens = jnp.asarray(TOKENS)
    mask = jnp.tril(jnp.ones((tokens.shape[1],) * 2, bool))  # 8 tokens: inside the window
    decoder = params["decoder"]
    x = params["token_embedder"]["embedding"][tokens]  # already scaled by sqrt(hidden)
    layers = config["num_hidden_layers"]
    for i in range(layers):
        if i < layers - layers % 6:
            stacked = decoder["layers"][f"layers_{i % 6}"]
            p = jax.tree.map(lambda a, i=i: a[:, i // 6], stacked)
        else:
            p = decoder["layers_remainder"][f"layers_{i - (layers - layers % 6)}"]
        kind = config["layer_types"][i]
        x = _layer(x, p, config, thetas[kind], mask)
    x = _norm(x, decoder["decoder_norm"]["scale"], config["rms_norm_eps"])
    ours = x @ params["token_embedder"]["embedding"].T / np.float32(8)  # the unscaled embedding
    with torch.no_grad():
        theirs = model(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4, rtol=0)


def test_tunix_recipe_takes_the_language_model_of_a_multimodal_folder(tmp_path):
    """As Tunix's own loader does (its gemma3 mapping accepts ``language_model.model.``): the
    Tunix tree of a multimodal folder equals the one of a text folder holding the same
    language model, and --reverse --like ORIGINAL gives the multimodal folder back."""
    _multimodal_model(tmp_path / "mm")
    tensors = _tensors(tmp_path / "mm")
    prefix = "language_model."
    text = {
        name[len(prefix) :]: value for name, value in tensors.items() if name.startswith(prefix)
    }
    assert len(text) < len(tensors)  # the vision tower and projector stay behind
    (tmp_path / "text").mkdir()
    save_file(text, tmp_path / "text" / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "mm" / "config.json").read_text())["text_config"]
    (tmp_path / "text" / "config.json").write_text(json.dumps(config))
    with pytest.warns(suture.families.LeftOutWarning, match="Tunix's text model has no place for"):
        convert_with_recipe(tmp_path / "mm", tmp_path / "from_mm", "gemma3:tunix", progress=False)
    convert_with_recipe(tmp_path / "text", tmp_path / "from_text", "gemma3:tunix", progress=False)
    from_mm, from_text = suture.open(tmp_path / "from_mm"), suture.open(tmp_path / "from_text")
    assert sorted(from_mm.paths()) == sorted(from_text.paths())
    for path in from_text.paths():
        np.testing.assert_array_equal(from_mm[path].read(), from_text[path].read(), err_msg=path)
    convert_with_recipe(
        tmp_path / "from_mm",
        tmp_path / "back",
        "gemma3:tunix",
        reverse=True,
        like=tmp_path / "mm",
        progress=False,
    )
    back = _tensors(tmp_path / "back")
    assert sorted(back) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(back[name], value, err_msg=name)


def test_a_left_out_part_is_said_in_one_warning_line_on_the_command_line():
    """suture's own warnings print as one `Warning:` line; LeftOutWarning was a plain
    UserWarning, shown with Python's file and source line."""
    import warnings

    from suture.cli.app import _show_warning

    assert issubclass(suture.families.LeftOutWarning, suture.SutureWarning)
    shown = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("typer.echo", lambda text, err=False: shown.append(text))
        _show_warning(warnings.WarningMessage("keeps 4 of 6 rows", suture.families.LeftOutWarning, "f.py", 1).message, suture.families.LeftOutWarning, "f.py", 1)  # fmt: skip
    assert shown == ["Warning: keeps 4 of 6 rows"]
