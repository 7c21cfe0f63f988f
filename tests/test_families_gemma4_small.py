"""Gemma 4 E2B/E4B: the gemma4-small recipe, proven with transformers' own Gemma4ForCausalLM;
and leaves made with no source (``make:``) in a user's table.

Tiny random models with E2B's layer cycle (4 sliding + 1 full, KV-shared last cycle, double-wide
MLPs there) and E4B's (5 + 1, plain MLPs) go to MaxText's unscanned layout and back bit for bit;
the tree has the paths and shapes MaxText 0.2.5's converter gives (GEMMA4_SMALL_MAXTEXT_TO_HF_
PARAM_MAPPING: no key, value or key norm in the shared layers, per-layer embeddings as stored).
bench/_maxtext_families.py compares the values with MaxText's converter itself.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import suture
from suture import families
from suture.families._convert import convert_with_recipe
from suture.families._file import family_recipe

from .test_families import _assert_refused, _assert_same_tensors, _tensors, _vary_norms

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

RECIPE = "gemma4-small:maxtext-unscanned"
SLIDING, FULL = "sliding_attention", "full_attention"


def _config(period: int, cycles: int, shared_cycles: int, double: bool, **extra) -> dict:
    return dict(
        vocab_size=64,
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        global_head_dim=16,
        intermediate_size=24,
        num_hidden_layers=period * cycles,
        hidden_size_per_layer_input=4,
        vocab_size_per_layer_input=64,
        num_kv_shared_layers=period * shared_cycles,
        use_double_wide_mlp=double,
        sliding_window=8,
        layer_types=([SLIDING] * (period - 1) + [FULL]) * cycles,
        **extra,
    )


E2B = _config(5, 2, 1, True)  # layers 0-4 own their keys and values, 5-9 reuse them
E4B = _config(6, 2, 1, False)


def _save(folder, config: dict) -> None:
    torch.manual_seed(0)
    model = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**config))
    _vary_norms(model.eval()).save_pretrained(folder)


@pytest.fixture(scope="module")
def e2b(tmp_path_factory):
    folder = tmp_path_factory.mktemp("e2b") / "hf"
    _save(folder, E2B)
    return folder


@pytest.mark.parametrize("config", [E2B, E4B], ids=["e2b", "e4b"])
def test_round_trip_is_bit_identical(tmp_path, config):
    _save(tmp_path / "hf", config)
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", RECIPE, progress=False)
    convert_with_recipe(tmp_path / "mt", tmp_path / "back", RECIPE, reverse=True, progress=False)
    source, back = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert sorted(source) == sorted(back)
    embedding = "model.embed_tokens.weight"  # times sqrt(32) and back: within 1 ulp
    np.testing.assert_array_max_ulp(source.pop(embedding), back.pop(embedding), maxulp=1)
    for name, tensor in source.items():
        assert tensor.dtype == back[name].dtype
        np.testing.assert_array_equal(tensor, back[name], err_msg=name)


def test_tree_has_maxtexts_paths_and_shapes(tmp_path, e2b):
    convert_with_recipe(e2b, tmp_path / "mt", RECIPE, progress=False)
    tree = suture.open(tmp_path / "mt")
    decoder = "params/params/decoder"
    paths = set(tree.paths())
    attention = f"{decoder}/layers_{{}}/self_attention/{{}}"
    # a sliding layer with its own keys, the global one (global_head_dim 16), a shared one
    assert tree[attention.format(0, "key/kernel")].shape == (32, 1, 8)
    assert tree[attention.format(4, "query/kernel")].shape == (32, 2, 16)
    assert tree[attention.format(4, "value/kernel")].shape == (32, 1, 16)
    assert tree[attention.format(9, "out/kernel")].shape == (2, 16, 32)
    for name in ("key/kernel", "value/kernel", "key_norm/scale"):
        assert attention.format(5, name) not in paths
        assert attention.format(9, name) not in paths
    assert tree[f"{decoder}/layers_0/mlp/wi_0/kernel"].shape == (32, 24)
    assert tree[f"{decoder}/layers_5/mlp/wi_0/kernel"].shape == (32, 48)  # double width
    ple = f"{decoder}/per_layer_embedder"
    assert tree[f"{ple}/embed_tokens_per_layer"].shape == (64, 10 * 4)
    assert tree[f"{ple}/per_layer_model_projection/kernel"].shape == (32, 40)
    assert tree[f"{decoder}/layers_3/per_layer_input_gate/kernel"].shape == (32, 4)
    assert tree[f"{decoder}/layers_3/layer_scalar"].shape == (1,)
    hf = _tensors(e2b)
    # the per-layer embedding unscaled; the token embedding times float32(sqrt(32))
    np.testing.assert_array_equal(
        tree[f"{ple}/embed_tokens_per_layer"].read(), hf["model.embed_tokens_per_layer.weight"]
    )
    np.testing.assert_array_equal(
        tree["params/params/token_embedder/embedding"].read(),
        hf["model.embed_tokens.weight"] * np.float32(32**0.5),
    )


def test_global_head_dim_and_per_layer_config_give_the_same_tree(tmp_path, e2b):
    """transformers 5.24 writes per_layer_config; published configs global_head_dim."""
    published = tmp_path / "published"
    published.mkdir()
    for file in e2b.iterdir():
        (published / file.name).write_bytes(file.read_bytes())
    config = json.loads((e2b / "config.json").read_text())
    assert list(config["per_layer_config"].values()) == [{"head_dim": 16}] * 2
    del config["per_layer_config"]
    config["global_head_dim"], config["num_global_key_value_heads"] = 16, None
    (published / "config.json").write_text(json.dumps(config))
    convert_with_recipe(e2b, tmp_path / "a", RECIPE, progress=False)
    convert_with_recipe(published, tmp_path / "b", RECIPE, progress=False)
    a, b = suture.open(tmp_path / "a"), suture.open(tmp_path / "b")
    assert a.paths() == b.paths()
    assert all(np.array_equal(a[p].read(), b[p].read()) for p in a.paths() if p != "step")


def test_only_the_unscanned_layout_is_offered():
    assert RECIPE in families.recipe_names()
    assert "gemma4-small:maxtext" not in families.recipe_names()
    with pytest.raises(suture.SurgeryError, match="gemma4-small:maxtext-unscanned only"):
        families.get_recipe("gemma4-small:maxtext")


def test_a_users_copy_of_the_table_keeps_its_layouts(tmp_path):
    from importlib.resources import files

    table = tmp_path / "mine.yaml"
    table.write_text(files("suture.families").joinpath("gemma4-small.yaml").read_text())
    assert family_recipe(f"{table}:maxtext-unscanned").name == RECIPE
    with pytest.raises(suture.SurgeryError, match=r"offers the layout\(s\) maxtext-unscanned only"):
        family_recipe(str(table))


def _refused_with(tmp_path, e2b, match: str, **change) -> None:
    folder = tmp_path / "hf"
    folder.mkdir()
    for file in e2b.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    config = json.loads((e2b / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    _assert_refused(tmp_path, RECIPE, match)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(attention_k_eq_v=True), "'attention_k_eq_v' is True: MaxText's gemma4_small"),
        (dict(enable_moe_block=True), "'enable_moe_block' is True"),
        (
            dict(layer_types=[SLIDING] * 3 + [FULL, SLIDING] + [SLIDING] * 4 + [FULL]),
            r"'layer_types' makes layer 7 'sliding_attention'.*cycle its first 4.*expects 'full_attention'",
        ),
        (dict(num_kv_shared_layers=3), "'num_kv_shared_layers' is 3: the recipe supports"),
        (dict(hidden_size_per_layer_input=0), "'hidden_size_per_layer_input' is 0"),
    ],
    ids=["k-eq-v", "moe", "cycle", "shared", "no-ple"],
)
def test_configs_it_cannot_write_are_refused_before_reading(tmp_path, e2b, change, match):
    _refused_with(tmp_path, e2b, match, **change)


# make: leaves with no source, in a user's table -----------------------------------------------


def _table_with_made_leaf(folder) -> str:
    """llama3.1's table as a user's file, plus a norm scale of ones and a per-layer bias of
    zeros that MaxText's model would hold and the HF checkpoint does not."""
    from importlib.resources import files

    import yaml

    data = yaml.safe_load(files("suture.families").joinpath("llama3.1.yaml").read_text())
    data["names"] = ["made"]
    data["leaves"] += [
        {"maxtext": "decoder/extra_norm/scale", "make": {"fill": 1.0, "shape": ["hidden_size"]}},
        {
            "maxtext": "decoder/layers/extra/bias",
            "make": {"fill": 0, "shape": ["hidden_size"], "dtype": "bfloat16", "layers": "layer"},
        },
    ]
    path = folder / "made.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_a_users_table_makes_leaves_with_no_source_and_drops_them_back(tmp_path, layout):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    table = f"{_table_with_made_leaf(tmp_path)}:{layout}"
    suture.convert(tmp_path / "hf", tmp_path / "mt", recipe=table, progress=False)
    tree = suture.open(tmp_path / "mt")
    decoder = "params/params/decoder"
    norm = tree[f"{decoder}/extra_norm/scale"].read()
    assert norm.dtype == np.float32 and norm.tolist() == [1.0] * 64
    if layout == "maxtext":
        bias = tree[f"{decoder}/layers/extra/bias"].read()
        assert bias.shape == (64, 2) and str(bias.dtype) == "bfloat16" and not bias.any()
    else:
        assert tree[f"{decoder}/layers_1/extra/bias"].shape == (64,)
    suture.convert(tmp_path / "mt", tmp_path / "back", recipe=table, reverse=True, progress=False)
    _assert_same_tensors(tmp_path / "hf", tmp_path / "back")


def test_a_made_leaf_of_another_shape_is_refused_on_the_way_back(tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    recipe = family_recipe(_table_with_made_leaf(tmp_path))
    names = json.loads((tmp_path / "hf" / "config.json").read_text())
    flat = suture.flatten(recipe.to_maxtext(suture.open(tmp_path / "hf").tree, names))
    flat["params/params/decoder/extra_norm/scale"] = np.ones(63, np.float32)
    with pytest.raises(families.ConfigMismatchError, match=r"extra_norm/scale' has shape \(63,\)"):
        recipe.to_hf(suture.unflatten(flat), names)


@pytest.mark.parametrize(
    ("make", "phrase"),
    [
        ({"fill": "one", "shape": ["hidden_size"]}, "fill must be a finite number"),
        ({"fill": 1, "shape": "hidden_size"}, "shape must be a list"),
        ({"fill": 1, "shape": [4], "dtype": "int8"}, "dtype must be one of"),
        ({"fill": 1, "shape": [4], "layers": "blocks"}, "'blocks' is no layer group"),
        ({"fill": 1, "shape": [4], "colour": 2}, "unknown key 'colour'"),
    ],
)
def test_a_bad_make_entry_is_refused_when_the_table_loads(tmp_path, make, phrase):
    import yaml

    table = tmp_path / "bad.yaml"
    leaves = [{"maxtext": "decoder/x/scale", "make": make}]
    table.write_text(yaml.safe_dump({"names": ["bad"], "leaves": leaves}))
    with pytest.raises(suture.SurgeryError, match=f"leaf 0 .*make.*{phrase}"):
        family_recipe(str(table))


def test_layer_groups_sharing_a_path_must_be_disjoint(tmp_path):
    """A config that gives two groups writing one path a layer in common is an error (the
    layer counted twice), not one leaf overwriting another."""
    import dataclasses
    from importlib.resources import files

    import yaml

    data = yaml.safe_load(files("suture.families").joinpath("gemma4-small.yaml").read_text())
    groups = dict(
        data["layer_groups"], local={"count": 2, "hf_index": "i + 3", "unscanned": "hf_index"}
    )
    (tmp_path / "overlap.yaml").write_text(yaml.safe_dump(dict(data, layer_groups=groups)))
    recipe = family_recipe(f"{tmp_path / 'overlap.yaml'}:maxtext-unscanned")
    # the checkpoint below holds q_proj only: without its file, the recipe is checked as a
    # built-in one (a user's table would first report the leaves no tensor matches)
    recipe = dataclasses.replace(recipe, table_file="")
    config = transformers.Gemma4TextConfig(**E2B).to_dict()
    q = np.zeros((16, 32), np.float32)
    hf = {
        f"model/layers/{i}/self_attn/q_proj/weight": q for i in (3, 4, 9)
    }  # local 3-4, global 4, 9
    with pytest.raises(suture.SurgeryError, match=r"4 layers, and the checkpoint holds 3"):
        recipe.to_maxtext(hf, config)
