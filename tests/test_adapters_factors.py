"""LoRA factors through the family recipes' operations, and what adapter conversion refuses.

Numpy only (no torch): each recipe leaf's operations applied to the whole delta ``B @ A``
must equal the target factors' product, and back.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

import suture
from suture import families

CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 96,
    "vocab_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def _leaves(name):
    recipe = families.get_recipe(name)
    names = recipe.config_names(CONFIG)
    return names, [leaf for leaf in recipe.leaves if "proj" in leaf.hf]


@pytest.mark.parametrize(
    "name", ["llama3.1:maxtext-unscanned", "llama3:tunix", "llama2:maxtext-unscanned"]
)
def test_factor_products_are_the_recipe_image_of_the_delta(name):
    from suture._adapters import factors

    names, leaves = _leaves(name)
    rng = np.random.default_rng(0)
    assert len(leaves) == 7
    for leaf in leaves:
        out, inp = {"o_proj": (64, 64), "down_proj": (64, 96)}.get(
            leaf.hf.split(".")[-2], (96 if "mlp" in leaf.hf else 64, 64)
        )
        if "k_proj" in leaf.hf or "v_proj" in leaf.hf:
            out = 32
        lora_a = rng.standard_normal((3, inp)).astype(np.float32)
        lora_b = rng.standard_normal((out, 3)).astype(np.float32)
        a, b = factors.to_target(leaf.operations, names, lora_a, lora_b)
        image = suture.LazyArray.from_array(lora_b @ lora_a)
        for op in leaf.operations:
            image = op.forward(image, names)
        product = np.tensordot(a, b, axes=([-1], [0]))
        np.testing.assert_allclose(product, image.read(), atol=1e-5, err_msg=leaf.hf)
        back_a, back_b = factors.to_hf(leaf.operations, names, a, b)
        exact = all(not hasattr(op, "exact_for") or op.exact_for(names) for op in leaf.operations)
        if exact:
            np.testing.assert_array_equal(back_a, lora_a)
            np.testing.assert_array_equal(back_b, lora_b)


def test_flattened_nnx_factors_of_an_einsum_kernel_are_unflattened():
    from suture._adapters import factors

    names, leaves = _leaves("llama3:tunix")
    (q,) = [leaf for leaf in leaves if "q_proj" in leaf.hf]
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 2)).astype(np.float32)  # (embed, r)
    b = rng.standard_normal((2, 64)).astype(np.float32)  # (r, heads * head_dim)
    lora_a, lora_b = factors.to_hf(q.operations, names, a, b)
    np.testing.assert_array_equal(lora_b @ lora_a, (a @ b).T)


def test_found_pairs_name_each_layout():
    from suture._adapters.pairs import found_pairs

    flat = {
        "layers/0/attn/q_proj/w_lora_a": 1,
        "layers/0/attn/q_proj/w_lora_b": 2,
        "layers/0/mlp/up_proj/lora/lora_a": 3,
        "layers/0/mlp/up_proj/lora/lora_b": 4,
        "layers/0/mlp/down_proj/lora_a": 5,
        "layers/0/mlp/down_proj/lora_b": 6,
    }
    found = {(p.owner, p.style) for p in found_pairs(flat)}
    assert found == {
        ("layers/0/attn/q_proj/w", "qwix"),
        ("layers/0/mlp/up_proj", "nnx"),
        ("layers/0/mlp/down_proj", "nnx"),
    }
    del flat["layers/0/mlp/up_proj/lora/lora_b"]
    with pytest.raises(suture.SurgeryError, match="no partner"):
        found_pairs(flat)


@pytest.fixture
def base(tmp_path):
    folder = tmp_path / "base"
    rng = np.random.default_rng(0)
    suture.save(
        {
            "model": {
                "layers": {
                    "0": {
                        "self_attn": {
                            "q_proj": {"weight": rng.standard_normal((64, 64)).astype(np.float32)}
                        }
                    }
                }
            }
        },
        folder,
        format="safetensors",
        progress=False,
    )
    (folder / "config.json").write_text(json.dumps(CONFIG))
    return folder


def _adapter(folder, tensors, **config):
    folder.mkdir()
    save_file(tensors, folder / "adapter_model.safetensors")
    settings = {"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps({**settings, **config}))
    return folder


def _pair(module="model.layers.0.self_attn.q_proj", rows=64):
    rng = np.random.default_rng(2)
    return {
        f"base_model.model.{module}.lora_A.weight": rng.standard_normal((2, 64)).astype(np.float32),
        f"base_model.model.{module}.lora_B.weight": rng.standard_normal((rows, 2)).astype(
            np.float32
        ),
    }


def test_merge_streams_w_plus_scaled_product(base, tmp_path):
    adapter = _adapter(tmp_path / "adapter", _pair())
    suture.convert(base, tmp_path / "out", merge_adapter=adapter, progress=False)
    got = suture.open(tmp_path / "out")["model/layers/0/self_attn/q_proj/weight"].read()
    w = suture.open(base)["model/layers/0/self_attn/q_proj/weight"].read()
    pair = list(_pair().values())
    np.testing.assert_allclose(got, w + (pair[1] @ pair[0]) * 2, rtol=1e-6, atol=1e-6)
    assert (tmp_path / "out" / "config.json").is_file()


@pytest.mark.parametrize(
    ("tensors", "config", "match"),
    [
        (_pair("model.layers.0.self_attn.k_proj"), {}, "no tensor"),
        (_pair(rows=32), {}, "another model"),
        (_pair(), {"use_dora": True}, "use_dora"),
        (_pair(), {"peft_type": "IA3"}, "peft_type"),
        (_pair(), {"r": 8}, "r = 8"),
        ({k: v for k, v in _pair().items() if "lora_A" in k}, {}, "no partner"),
    ],
    ids=["missing-module", "wrong-shape", "dora", "not-lora", "wrong-r", "lone-factor"],
)
def test_merge_refuses_a_bad_adapter(base, tmp_path, tensors, config, match):
    adapter = _adapter(tmp_path / "adapter", tensors, **config)
    with pytest.raises(suture.SurgeryError, match=match):
        suture.convert(base, tmp_path / "out", merge_adapter=adapter, progress=False)
    assert not (tmp_path / "out").exists()


def test_adapter_arguments_are_checked(base, tmp_path):
    adapter = _adapter(tmp_path / "adapter", _pair())
    with pytest.raises(suture.SurgeryError, match="not both"):
        suture.convert(base, tmp_path / "o", adapter_only=True, merge_adapter=adapter)
    with pytest.raises(suture.SurgeryError, match="family"):
        suture.convert(adapter, tmp_path / "o", adapter_only=True, config=base / "config.json")


def test_export_alpha_follows_the_layout(base, tmp_path):
    """NNX factors apply no scale (lora_alpha = r, --lora-alpha refused); qwix needs it."""
    rng = np.random.default_rng(3)
    nnx_tree = {
        "layers": {"0": {"attn": {"q_proj": {"lora": {
            "lora_a": rng.standard_normal((64, 2)).astype(np.float32),
            "lora_b": rng.standard_normal((2, 64)).astype(np.float32),
        }}}}}
    }  # fmt: skip
    suture.save(nnx_tree, tmp_path / "nnx", progress=False)
    common = dict(recipe="llama3:tunix", reverse=True, adapter_only=True, progress=False)
    common["config"] = base / "config.json"
    with pytest.raises(suture.SurgeryError, match="apply no scale"):
        suture.convert(tmp_path / "nnx", tmp_path / "p", lora_alpha=4, **common)
    suture.convert(tmp_path / "nnx", tmp_path / "p", **common)
    written = json.loads((tmp_path / "p" / "adapter_config.json").read_text())
    assert written["lora_alpha"] == written["r"] == 2
    qwix_tree = {"layers": {"0": {"attn": {"q_proj": {
        "w_lora_a": {"value": nnx_tree["layers"]["0"]["attn"]["q_proj"]["lora"]["lora_a"]},
        "w_lora_b": {"value": nnx_tree["layers"]["0"]["attn"]["q_proj"]["lora"]["lora_b"].reshape(2, 4, 16)},
    }}}}}  # fmt: skip
    suture.save(qwix_tree, tmp_path / "qwix", progress=False)
    with pytest.raises(suture.SurgeryError, match="--lora-alpha"):
        suture.convert(tmp_path / "qwix", tmp_path / "q", **common)
    suture.convert(tmp_path / "qwix", tmp_path / "q", lora_alpha=4, **common)
    same = [suture.open(tmp_path / f / "adapter_model.safetensors") for f in ("p", "q")]
    for path in same[0].paths():
        np.testing.assert_array_equal(same[0][path].read(), same[1][path].read())


def test_an_adapter_folder_is_replaced_only_with_overwrite(base, tmp_path):
    adapter = _adapter(tmp_path / "adapter", _pair())
    common = dict(recipe="llama3:tunix", adapter_only=True, config=base / "config.json")
    suture.convert(adapter, tmp_path / "jax", progress=False, **common)
    back = dict(common, reverse=True, lora_alpha=4)
    suture.convert(tmp_path / "jax", tmp_path / "peft", **back)
    with pytest.raises(suture.SurgeryError, match="exists"):
        suture.convert(tmp_path / "jax", tmp_path / "peft", **back)
    suture.convert(tmp_path / "jax", tmp_path / "peft", overwrite=True, **back)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(suture.SurgeryError, match="notes.txt"):
        suture.convert(tmp_path / "jax", tmp_path / "other", overwrite=True, **back)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
