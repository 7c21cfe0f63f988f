"""LoRA adapters as PEFT folders, both ways, and merged into their base as they stream.

A tiny Llama (transformers, float32) is the base. A Flax NNX Llama in Tunix's layout (the
``llama3:tunix`` recipe's), its projections carrying ``nnx.LoRA`` pairs, is fine-tuned for a
few steps; its exported adapter, loaded by ``peft.PeftModel.from_pretrained``, gives the NNX
model's logits. A PEFT folder goes to qwix factors and back bit for bit, and a streamed merge
equals peft's ``merge_and_unload`` within 1 ulp.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import suture
from suture import families

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

# peft 0.21 asks transformers 5 for a deprecated property (a third party's warning)
pytestmark = pytest.mark.filterwarnings(
    "ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"
)

TOKENS = np.array([[1, 5, 9, 2, 33, 7, 60, 3]])
CONFIG = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny Llama folder (float32)."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
    folder = tmp_path_factory.mktemp("base") / "llama"
    model.save_pretrained(folder)
    return folder


def peft_adapter(base, folder, *, rank=4, alpha=8, rslora=False, dtype=None, seed=1):
    """A PEFT folder of random LoRA pairs (lora_B non-zero) on every projection."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = peft.LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=TARGETS, use_rslora=rslora,
        init_lora_weights=False, task_type="CAUSAL_LM",
    )  # fmt: skip
    torch.manual_seed(seed)
    wrapped = peft.get_peft_model(model, config)
    if dtype is not None:
        wrapped = wrapped.to(dtype)
    wrapped.save_pretrained(folder)
    return folder


def read_tensors(path):
    ckpt = suture.open(path)
    return {k.replace("/", "."): np.asarray(v.read()) for k, v in suture.flatten(ckpt.tree).items()}


# --- PEFT -> JAX -> PEFT --------------------------------------------------------------


@pytest.mark.parametrize("recipe", ["llama3:tunix", "llama3.1:maxtext-unscanned"])
def test_peft_to_jax_and_back_is_bit_for_bit(base, tmp_path, recipe):
    adapter = peft_adapter(base, tmp_path / "adapter")
    jax_tree = tmp_path / "jax"
    suture.convert(
        adapter, jax_tree, recipe=recipe, adapter_only=True, config=base / "config.json",
        progress=False,
    )  # fmt: skip
    flat = suture.flatten(suture.open(jax_tree).tree)
    if recipe == "llama3:tunix":
        a = flat["layers/1/attn/q_proj/w_lora_a/value"]
        b = flat["layers/1/attn/q_proj/w_lora_b/value"]
        assert a.shape == (64, 4) and b.shape == (4, 4, 16)  # (embed, r), (r, heads, head_dim)
    back = tmp_path / "back"
    suture.convert(
        jax_tree, back, recipe=recipe, reverse=True, adapter_only=True,
        config=base / "config.json", lora_alpha=8, progress=False,
    )  # fmt: skip
    original, returned = (
        read_tensors(adapter / "adapter_model.safetensors"),
        read_tensors(back / "adapter_model.safetensors"),
    )
    assert sorted(original) == sorted(returned)
    for name, value in original.items():
        assert value.dtype == returned[name].dtype
        np.testing.assert_array_equal(returned[name], value, err_msg=name)
    config = json.loads((back / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8)
    assert config["task_type"] == "CAUSAL_LM" and sorted(config["target_modules"]) == sorted(
        TARGETS
    )


def test_qwix_factors_multiply_to_the_recipe_image_of_the_delta(base, tmp_path):
    """a @ b of the JAX factors is the recipe's image of PEFT's B @ A (a head split and the
    query's 1/sqrt(head_dim) scale in MaxText's layout, the rotary interleave too)."""
    adapter = peft_adapter(base, tmp_path / "adapter")
    suture.convert(
        adapter, tmp_path / "mt", recipe="llama3.1:maxtext-unscanned", adapter_only=True,
        config=base / "config.json", progress=False,
    )  # fmt: skip
    flat = suture.flatten(suture.open(tmp_path / "mt").tree)
    a = flat["params/params/decoder/layers_0/self_attention/query/kernel_lora_a"].read()
    b = flat["params/params/decoder/layers_0/self_attention/query/kernel_lora_b"].read()
    peft_tensors = read_tensors(adapter / "adapter_model.safetensors")
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"
    delta = peft_tensors[name.format("B")] @ peft_tensors[name.format("A")]
    recipe = families.get_recipe("llama3.1:maxtext-unscanned")
    (leaf,) = [leaf for leaf in recipe.leaves if leaf.hf.endswith("q_proj.weight")]
    names = recipe.config_names(dict(CONFIG, model_type="llama"))
    image = suture.LazyArray.from_array(delta)
    for op in leaf.operations:
        image = op.forward(image, names)
    assert a.shape == (64, 4) and b.shape == (4, 4, 16)
    np.testing.assert_allclose(np.einsum("ir,rnh->inh", a, b), image.read(), atol=1e-6)


def test_an_adapter_without_peft_prefix_is_refused(base, tmp_path):
    from safetensors.numpy import save_file

    adapter = peft_adapter(base, tmp_path / "adapter")
    tensors = read_tensors(adapter / "adapter_model.safetensors")
    save_file(
        {k.removeprefix("base_model.model."): v for k, v in tensors.items()},
        adapter / "adapter_model.safetensors",
    )
    with pytest.raises(suture.SurgeryError, match="base_model.model"):
        suture.convert(
            adapter, tmp_path / "jax", recipe="llama3:tunix", adapter_only=True,
            config=base / "config.json", progress=False,
        )  # fmt: skip


def test_a_peft_folder_needs_the_base_config(base, tmp_path):
    adapter = peft_adapter(base, tmp_path / "adapter")
    with pytest.raises(suture.SurgeryError, match="--config"):
        suture.convert(adapter, tmp_path / "jax", recipe="llama3:tunix", adapter_only=True)


# --- the streamed merge ---------------------------------------------------------------


@pytest.mark.parametrize(
    "case", ["float32", "rslora", "bfloat16"], ids=["float32", "rslora", "bfloat16"]
)
def test_merge_adapter_equals_peft_merge_and_unload(base, tmp_path, case):
    dtype = torch.bfloat16 if case == "bfloat16" else torch.float32
    adapter = peft_adapter(base, tmp_path / "adapter", rslora=case == "rslora", alpha=16)
    base_folder = base
    if case == "bfloat16":
        model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
        base_folder = tmp_path / "base16"
        model.save_pretrained(base_folder)
    ours = tmp_path / "ours"
    suture.convert(base_folder, ours, merge_adapter=adapter, progress=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(base_folder, dtype=dtype)
    merged = peft.PeftModel.from_pretrained(model, adapter).merge_and_unload()
    theirs = tmp_path / "theirs"
    merged.save_pretrained(theirs)
    mine, peers = read_tensors(ours), read_tensors(theirs)
    assert sorted(mine) == sorted(peers)
    changed = 0
    for name, value in peers.items():
        assert mine[name].dtype == value.dtype, name
        ulp = np.spacing(np.abs(value.astype(np.float32)).astype(value.dtype)).astype(np.float32)
        diff = np.abs(mine[name].astype(np.float32) - value.astype(np.float32))
        assert (diff <= ulp).all(), (name, float((diff / ulp).max()))
        changed += "proj" in name
    assert changed == 14
    assert (tmp_path / "ours" / "config.json").is_file()


def test_merge_adapter_into_a_tunix_layout(base, tmp_path):
    """--merge-adapter with --recipe: the merged model in Tunix's layout, as the merged HF
    folder converted."""
    adapter = peft_adapter(base, tmp_path / "adapter")
    suture.convert(base, tmp_path / "hf", merge_adapter=adapter, progress=False)
    suture.convert(tmp_path / "hf", tmp_path / "two", recipe="llama3:tunix", progress=False)
    suture.convert(
        base, tmp_path / "one", recipe="llama3:tunix", merge_adapter=adapter, progress=False
    )
    one = suture.flatten(suture.open(tmp_path / "one").tree)
    two = suture.flatten(suture.open(tmp_path / "two").tree)
    assert sorted(one) == sorted(two)
    for path, leaf in two.items():
        if hasattr(leaf, "read"):
            np.testing.assert_array_equal(one[path].read(), leaf.read(), err_msg=path)


# --- Flax NNX fine-tuning, exported, served by peft -----------------------------------


def nnx_llama(params: dict, config: dict, rank: int):
    """A Llama in Flax NNX with Tunix's names, each projection carrying an ``nnx.LoRA``."""
    import jax.numpy as jnp
    from flax import nnx

    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hidden = config["hidden_size"]
    head_dim = hidden // heads
    rngs = nnx.Rngs(0)
    numbers = np.random.default_rng(0)

    def small(key, shape, dtype):  # numpy's: no compile per shape, as jax.random would
        return jnp.asarray(0.1 * numbers.standard_normal(shape), dtype)

    def zeros(key, shape, dtype):  # NNX's own start: b at zero
        return jnp.asarray(np.zeros(shape), dtype)

    class Proj(nnx.Module):
        def __init__(self, weight, name_w, fan_in, fan_out):
            setattr(self, name_w, nnx.Param(jnp.asarray(weight)))
            self.lora = nnx.LoRA(
                fan_in, rank, fan_out, a_initializer=small, b_initializer=zeros, rngs=rngs
            )

    class Module(nnx.Module):
        pass

    def proj(path, name_w):
        w = params[path]
        fan_in = w.shape[0] if not path.endswith("o_proj/w") else w.shape[0] * w.shape[1]
        fan_out = int(np.prod(w.shape)) // fan_in
        return Proj(w, name_w, fan_in, fan_out)

    model = Module()
    model.embedder = Module()
    model.embedder.input_embedding = nnx.Param(jnp.asarray(params["embedder/input_embedding"]))
    model.final_norm = Module()
    model.final_norm.w = nnx.Param(jnp.asarray(params["final_norm/w"]))
    model.lm_head = Module()
    model.lm_head.w = nnx.Param(jnp.asarray(params["lm_head/w"]))
    layers = []
    for i in range(config["num_hidden_layers"]):
        layer = Module()
        layer.attn = Module()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(layer.attn, name, proj(f"layers/{i}/attn/{name}/w", "w"))
        layer.mlp = Module()
        for name in ("gate_proj", "up_proj", "down_proj"):
            setattr(layer.mlp, name, proj(f"layers/{i}/mlp/{name}/kernel", "kernel"))
        for name in ("input_layernorm", "post_attention_layernorm"):
            norm = Module()
            norm.w = nnx.Param(jnp.asarray(params[f"layers/{i}/{name}/w"]))
            setattr(layer, name, norm)
        layers.append(layer)
    model.layers = nnx.List(layers)
    model.dims = (heads, kv, head_dim)
    return model


def nnx_logits(model, tokens, config):
    """transformers' Llama forward, on the NNX model's weights and LoRA pairs."""
    import jax
    import jax.numpy as jnp

    heads, kv, head_dim = model.dims
    eps, theta = config["rms_norm_eps"], config["rope_theta"]

    def norm(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * w

    def lora(p, x):  # x (..., fan_in) flattened
        return x @ p.lora.lora_a[...] @ p.lora.lora_b[...]

    def linear(p, x, spec):
        w = p.w[...] if hasattr(p, "w") else p.kernel[...]
        base = jnp.einsum(spec, x, w)
        flat = x.reshape(*x.shape[:2], -1)
        return base + lora(p, flat).reshape(base.shape)

    t = tokens.shape[1]
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
    freqs = np.outer(np.arange(t, dtype=np.float32), inv)
    emb = np.concatenate([freqs, freqs], -1)
    cos, sin = jnp.asarray(np.cos(emb)), jnp.asarray(np.sin(emb))

    def rope(x):  # (B, T, N, H)
        half = head_dim // 2
        rotated = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
        return x * cos[None, :, None] + rotated * sin[None, :, None]

    x = model.embedder.input_embedding[...][tokens]
    mask = np.tril(np.ones((t, t), bool))
    for layer in model.layers:
        h = norm(x, layer.input_layernorm.w[...])
        q = rope(linear(layer.attn.q_proj, h, "btd,dnh->btnh"))
        k = rope(linear(layer.attn.k_proj, h, "btd,dnh->btnh"))
        v = linear(layer.attn.v_proj, h, "btd,dnh->btnh")
        k, v = jnp.repeat(k, heads // kv, 2), jnp.repeat(v, heads // kv, 2)
        scores = jnp.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(head_dim)
        scores = jnp.where(mask, scores, -jnp.inf)
        attn = jnp.einsum("bnts,bsnh->btnh", jax.nn.softmax(scores, -1), v)
        x = x + linear(layer.attn.o_proj, attn, "btnh,nhd->btd")
        h = norm(x, layer.post_attention_layernorm.w[...])
        gate = linear(layer.mlp.gate_proj, h, "btd,df->btf")
        up = linear(layer.mlp.up_proj, h, "btd,df->btf")
        x = x + linear(layer.mlp.down_proj, jax.nn.silu(gate) * up, "btf,fd->btd")
    x = norm(x, model.final_norm.w[...])
    return x @ model.lm_head.w[...]


def test_nnx_lora_fine_tune_exports_to_a_peft_folder_peft_serves(base, tmp_path):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    config = json.loads((base / "config.json").read_text())
    recipe = families.get_recipe("llama3:tunix")
    target = suture.flatten(recipe.to_target(suture.open(base).tree, config))
    params = {path: np.asarray(leaf.read()) for path, leaf in target.items()}
    model = nnx_llama(params, CONFIG, rank=4)
    tokens = jnp.asarray(TOKENS)
    hf = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    with torch.no_grad():
        base_logits = hf(torch.tensor(TOKENS)).logits.numpy()
    logits_of = nnx.jit(lambda model: nnx_logits(model, tokens, CONFIG))
    np.testing.assert_allclose(np.asarray(logits_of(model)), base_logits, atol=1e-4)

    def loss(model):  # next-token cross entropy on the tokens
        logits = nnx_logits(model, tokens[:, :-1], CONFIG)
        return -jnp.mean(jax.nn.log_softmax(logits)[0, jnp.arange(7), tokens[0, 1:]])

    @nnx.jit
    def step(model):  # plain SGD on the LoRA factors alone
        grads = nnx.grad(loss, argnums=nnx.DiffState(0, nnx.LoRAParam))(model)
        lora = nnx.state(model, nnx.LoRAParam)
        nnx.update(model, jax.tree.map(lambda p, g: p - 0.5 * g, lora, grads))

    for _ in range(3):
        step(model)
    tuned = np.asarray(logits_of(model))
    assert np.abs(tuned - base_logits).max() > 1e-2  # the fine-tune moved the model

    flat = {
        "/".join(map(str, path)): np.asarray(variable.get_value())
        for path, variable in nnx.to_flat_state(nnx.state(model))
    }
    suture.save(suture.unflatten(flat), tmp_path / "nnx", progress=False)
    out = tmp_path / "peft"
    suture.convert(
        tmp_path / "nnx", out, recipe="llama3:tunix", reverse=True, adapter_only=True,
        config=base / "config.json", progress=False,
    )  # fmt: skip
    config_written = json.loads((out / "adapter_config.json").read_text())
    assert config_written["lora_alpha"] == config_written["r"] == 4
    served = peft.PeftModel.from_pretrained(hf, out)
    lora_b = served.base_model.model.model.layers[1].self_attn.v_proj.lora_B["default"].weight
    assert float(lora_b.abs().max()) > 0  # peft loaded the factors (not left at zero)
    with torch.no_grad():
        logits = served(torch.tensor(TOKENS)).logits.numpy()
    np.testing.assert_allclose(logits, tuned, atol=1e-4, rtol=0)


def test_merge_adapter_into_a_quantized_base_needs_its_real_values(base, tmp_path):
    """An FP8 base read as stored holds codes whose scale is another tensor: a delta added to
    them is lost (it rounds away) or wrong. The merge refuses it, naming the weight and
    --dequantize; dequantized, it merges."""
    from suture._adapters.api import merged_with_adapter

    adapter = peft_adapter(base, tmp_path / "adapter")
    fp8 = tmp_path / "fp8"
    suture.convert(base, fp8, quantize="fp8-block", progress=False)
    with pytest.raises(suture.UnsupportedError, match="float8_e4m3fn.*--dequantize") as error:
        suture.convert(fp8, tmp_path / "out", merge_adapter=adapter, progress=False)
    assert "'model.layers.0.mlp.down_proj.weight'" in str(error.value)
    assert not (tmp_path / "out").exists()
    suture.convert(
        fp8, tmp_path / "out", merge_adapter=adapter, dequantize=True, dtype="float32",
        progress=False,
    )  # fmt: skip
    suture.convert(fp8, tmp_path / "real", dequantize=True, dtype="float32", progress=False)
    suture.convert(tmp_path / "real", tmp_path / "two", merge_adapter=adapter, progress=False)
    one, two = read_tensors(tmp_path / "out"), read_tensors(tmp_path / "two")
    assert sorted(one) == sorted(two)
    for name, value in two.items():
        np.testing.assert_array_equal(one[name], value, err_msg=name)
    packed = {"model": {"layers": {"0": {"mlp": {"down_proj": {
        "weight_packed": np.zeros((64, 12), np.int32), "weight_scale": np.ones((64, 3)),
    }}}}}}  # fmt: skip
    with pytest.raises(suture.UnsupportedError, match="weight_packed' is stored packed"):
        merged_with_adapter(packed, adapter)


def test_an_adapter_import_that_does_not_fit_names_the_pair_and_the_way_out(base, tmp_path):
    adapter = peft_adapter(base, tmp_path / "adapter")
    with pytest.raises(suture.UnsupportedError, match=r"down_proj'.*scan axis.*maxtext-unscanned"):
        suture.convert(
            adapter, tmp_path / "jax", recipe="llama3.1:maxtext", adapter_only=True,
            config=base / "config.json", progress=False,
        )  # fmt: skip
    narrow = dict(json.loads((base / "config.json").read_text()), num_attention_heads=2)
    with pytest.raises(suture.ConfigMismatchError, match=r"Adapter pair of '.*o_proj'.*2 x 16"):
        suture.convert(
            adapter, tmp_path / "jax", recipe="llama3:tunix", adapter_only=True,
            config=narrow, progress=False,
        )  # fmt: skip
    assert not (tmp_path / "jax").exists()


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"lora_bias": True}, "lora_B.bias' .*it is a bias PEFT trained"),
        ({"modules_to_save": ["lm_head"]}, "lm_head.weight' .*it is a whole weight"),
        ({"target_modules": ["embed_tokens"]}, "embed_tokens.*(embedding's LoRA|whole weight)"),
    ],
    ids=["lora-bias", "modules-to-save", "embedding"],
)
def test_an_adapter_with_more_than_lora_pairs_says_what_the_tensor_is(
    base, tmp_path, options, said
):
    """peft's own folders: what the tensor that is no LoRA pair holds, named, nothing written."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = peft.LoraConfig(**{"r": 2, "target_modules": ["q_proj"], **options})
    with warnings.catch_warnings():  # peft's own, on these very options
        warnings.simplefilter("ignore")
        peft.get_peft_model(model, config).save_pretrained(tmp_path / "adapter")
    with pytest.raises(suture.UnsupportedError, match=said):
        suture.convert(base, tmp_path / "out", merge_adapter=tmp_path / "adapter", progress=False)
    assert not (tmp_path / "out").exists()


def test_an_adapter_of_a_tensor_a_leaf_joins_with_others_says_to_merge_it(base, tmp_path):
    """docs/recipe-tables.md's table interleaves q, k and v into one qkv leaf: q's pair has
    no leaf of its own; the error names the leaf and the merge that takes it."""
    from .test_families_qwen35 import _docs_table

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = peft.LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False)
    peft.get_peft_model(model, config).save_pretrained(tmp_path / "adapter")
    table = f"{_docs_table(tmp_path)}:maxtext-unscanned"
    with pytest.raises(suture.UnsupportedError, match=r"q_proj.weight' .*qkv/kernel.*merge"):
        suture.convert(
            tmp_path / "adapter", tmp_path / "jax", recipe=table, adapter_only=True,
            config=base / "config.json", progress=False,
        )  # fmt: skip
    assert not (tmp_path / "jax").exists()


@pytest.mark.parametrize("base_dtype", ["float32", "float16"])
def test_an_adapter_stored_in_bfloat16_merges_as_peft_loads_it(base, tmp_path, base_dtype):
    """peft loads a bfloat16 folder's factors into LoRA weights of the base's dtype (float32
    for a half base): the delta is float32, never rounded to bfloat16; equal bit for bit."""
    adapter = peft_adapter(base, tmp_path / "adapter", dtype=torch.bfloat16)
    assert (
        read_tensors(adapter / "adapter_model.safetensors")[
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
        ].dtype.name
        == "bfloat16"
    )
    dtype = getattr(torch, base_dtype)
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    model.save_pretrained(tmp_path / "base")
    suture.convert(tmp_path / "base", tmp_path / "ours", merge_adapter=adapter, progress=False)
    peft.PeftModel.from_pretrained(model, adapter).merge_and_unload().save_pretrained(
        tmp_path / "theirs"
    )
    mine, peers = read_tensors(tmp_path / "ours"), read_tensors(tmp_path / "theirs")
    assert sorted(mine) == sorted(peers)
    for name, value in peers.items():
        assert mine[name].dtype == value.dtype, name
        np.testing.assert_array_equal(mine[name], value, err_msg=name)


@pytest.mark.parametrize("alpha", [float("nan"), float("inf")])
def test_a_lora_alpha_that_is_no_finite_number_is_refused(base, tmp_path, alpha):
    """NaN would scale every delta to NaN (and write NaN, which is no JSON, as lora_alpha)."""
    from suture.families._tunix import merged_lora

    adapter = peft_adapter(base, tmp_path / "adapter")
    suture.convert(
        adapter, tmp_path / "jax", recipe="llama3:tunix", adapter_only=True,
        config=base / "config.json", progress=False,
    )  # fmt: skip
    with pytest.raises(suture.ArgumentError, match="lora_alpha.*finite number"):
        suture.convert(
            tmp_path / "jax", tmp_path / "back", recipe="llama3:tunix", reverse=True,
            adapter_only=True, config=base / "config.json", lora_alpha=alpha, progress=False,
        )  # fmt: skip
    assert not (tmp_path / "back").exists()
    tree = {"q/w": np.ones((2, 2)), "q/w_lora_a": np.ones((2, 1)), "q/w_lora_b": np.ones((1, 2))}
    with pytest.raises(suture.ArgumentError, match="lora_alpha.*finite number"):
        merged_lora(tree, lora_alpha=alpha)


def test_an_adapter_of_rank_zero_is_refused_not_divided_by(base, tmp_path):
    from safetensors.numpy import save_file

    adapter = peft_adapter(base, tmp_path / "adapter")
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "r": 0}))
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"
    save_file(
        {name.format("A"): np.zeros((0, 64), np.float32), name.format("B"): np.zeros((64, 0))},
        adapter / "adapter_model.safetensors",
    )
    with pytest.raises(suture.NotACheckpointError, match=r"q_proj'.*\(0, 64\).*at least 1"):
        suture.convert(base, tmp_path / "out", merge_adapter=adapter, progress=False)
    assert not (tmp_path / "out").exists()
