"""Table features for hybrid layer cycles, in users' tables: one target leaf per layer kind
(`_shared_targets`), blocks under another subtree (``layer_blocks_under``), and per-layer
config overrides read per kind (``config.per_layer``, `_layer_config`).

A Llama is made hybrid by its table: its even and odd layers are two layer groups, each with
its own leaf on the same MaxText path, in blocks of 2 under ``decoder/scanned_blocks``; 5
layers leave a remainder. It goes to MaxText and back bit for bit, both layouts.
"""

from __future__ import annotations

import numpy as np
import pytest

import suture
from suture import families
from suture.families._layer_config import per_kind_fields

from .test_families import _tensors

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

QUERY = "decoder/layers/self_attention/query/kernel"


def _kinds_table(folder, **change) -> object:
    """llama3.1's table as a user's file: blocks of 2 under decoder/scanned_blocks, the query
    kernel written by two leaves, one per kind of layer (even, odd)."""
    from importlib.resources import files

    import yaml

    data = yaml.safe_load(files("suture.families").joinpath("llama3.1.yaml").read_text())
    data["names"] = ["kinds"]
    data["layer_period"] = 2
    data["layer_blocks"] = {"local_layers": [0], "global_layer": 1}
    data["layer_blocks_under"] = "decoder/scanned_blocks"
    data["layer_groups"] = {
        "layer": {"count": "num_hidden_layers", "hf_index": "i"},
        "even": {
            "count": "(num_hidden_layers + 1) // 2",
            "hf_index": "2 * i",
            "unscanned": "hf_index",
        },
        "odd": {
            "count": "num_hidden_layers // 2",
            "hf_index": "2 * i + 1",
            "unscanned": "hf_index",
        },
    }
    (query,) = [leaf for leaf in data["leaves"] if leaf["maxtext"] == QUERY]
    data["leaves"].remove(query)
    for group in ("even", "odd"):
        data["leaves"].append({**query, "hf": query["hf"].replace("{layer}", f"{{{group}}}")})
    data.update(change)
    data = {key: value for key, value in data.items() if value is not None}
    path = folder / "kinds.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama") / "hf"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
    )  # head_dim 16: the query scale is exact
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_a_leaf_per_layer_kind_on_one_path_converts_both_ways(tmp_path, llama, layout):
    table = f"{_kinds_table(tmp_path)}:{layout}"
    suture.convert(llama, tmp_path / "mt", recipe=table, progress=False)
    tree = suture.open(tmp_path / "mt")
    hf = _tensors(llama)
    decoder = "params/params/decoder"
    if layout == "maxtext":
        # blocks under decoder/scanned_blocks; layer 4 (even) in the remainder
        assert tree[f"{decoder}/scanned_blocks/local_layers/self_attention/query/kernel"].shape == (
            64,
            2,
            1,
            4,
            16,
        )
        odd = tree[f"{decoder}/scanned_blocks/global_layer/self_attention/query/kernel"]
        assert odd.shape == (64, 2, 4, 16)
        pairs = np.stack([np.arange(8), np.arange(8) + 8], axis=-1).reshape(-1)  # rope pairs
        expected = hf["model.layers.3.self_attn.q_proj.weight"].T.reshape(64, 4, 16)[..., pairs] / 4
        np.testing.assert_array_equal(odd.read()[:, 1], expected)
        rest = tree[f"{decoder}/layers_remainder/local_layers/self_attention/query/kernel"]
        assert rest.shape == (64, 1, 4, 16)
        assert not any("decoder/layers/" in path for path in tree.paths())
    else:
        assert [
            f"{decoder}/layers_{i}/self_attention/query/kernel" in tree.paths() for i in range(5)
        ] == [True] * 5
    suture.convert(tmp_path / "mt", tmp_path / "back", recipe=table, reverse=True, progress=False)
    back = _tensors(tmp_path / "back")
    assert sorted(back) == sorted(hf)
    assert all(np.array_equal(hf[k], back[k]) for k in hf)


def test_a_layer_kind_missing_from_the_target_is_refused(tmp_path, llama):
    """Unscanned, the layers of both kinds are checked together: one kind's layer missing is
    named, not taken for the other kind's extra layer."""
    table = f"{_kinds_table(tmp_path)}:maxtext-unscanned"
    suture.convert(llama, tmp_path / "mt", recipe=table, progress=False)
    config = tmp_path / "config.json"
    import json

    settings = json.loads((llama / "config.json").read_text())
    config.write_text(json.dumps({**settings, "num_hidden_layers": 6}))
    with pytest.raises(families.ConfigMismatchError, match="6 layers"):
        suture.convert(
            tmp_path / "mt",
            tmp_path / "back",
            recipe=table,
            reverse=True,
            config=config,
            progress=False,
        )


@pytest.mark.parametrize(
    ("change", "phrase"),
    [
        (
            dict(layer_groups=None),
            r"\{even\} in .* is no layer group",
        ),
        (
            dict(layer_blocks_under="scanned_blocks"),
            "layer_blocks_under: must be the path of the decoder's subtree",
        ),
        (
            dict(layer_blocks=None),
            "layer_blocks_under: needs layer_blocks",
        ),
    ],
)
def test_a_table_with_wrong_kind_features_is_refused(tmp_path, change, phrase):
    from suture.families._file import family_recipe

    with pytest.raises(families.RecipeFormatError, match=phrase):
        family_recipe(str(_kinds_table(tmp_path, **change)))


def test_two_leaves_of_one_group_on_one_path_are_refused(tmp_path):
    from suture.families._file import family_recipe

    path = _kinds_table(tmp_path)
    text = path.read_text().replace("{odd}.self_attn.q_proj", "{even}.self_attn.k_proj")
    path.write_text(text)
    with pytest.raises(
        families.RecipeFormatError, match="overwrite the other \\(both in layer group 'even'"
    ):
        family_recipe(str(path))


# per-layer overrides ---------------------------------------------------------------------

KINDS = ["sliding_attention"] * 2 + ["full_attention"]


def test_per_layer_overrides_become_one_field_per_kind():
    names = {
        "layer_types": KINDS * 2,
        "per_layer_config": {"02": {"head_dim": 32}, "5": {"head_dim": 32}},
    }
    spec = (("per_layer_config", "layer_types"),)
    assert per_kind_fields("r", names, spec) == {"full_attention_head_dim": 32}
    assert per_kind_fields("r", {"layer_types": KINDS}, spec) == {}  # none: defaults apply


@pytest.mark.parametrize(
    ("overrides", "kinds", "phrase"),
    [
        (
            {"2": {"head_dim": 32}, "5": {"head_dim": 64}},
            KINDS * 2,
            "layer 2 head_dim=32 and layer 5 head_dim=64",
        ),
        (
            {"9": {"head_dim": 32}},
            KINDS,
            "names layer '9'; recipe 'r' expects layer numbers 0 to 2",
        ),
        (
            {"2": {"head_dim": 32}},
            None,
            "reads them by the kind of each layer, which 'layer_types'",
        ),
        ([32], KINDS, "needs a mapping of layer numbers"),
        ({"2": 32}, KINDS, r"'per_layer_config.2' is 32"),
    ],
)
def test_per_layer_overrides_that_do_not_fit_are_refused(overrides, kinds, phrase):
    names = {"layer_types": kinds, "per_layer_config": overrides}
    with pytest.raises(families.ConfigMismatchError, match=phrase):
        per_kind_fields("r", names, (("per_layer_config", "layer_types"),))


def test_groups_sharing_a_path_in_one_place_are_refused(tmp_path, llama):
    """Scanned without blocks, both kinds would stack into decoder/layers/...: refused, not
    one group's layers silently overwriting the other's."""
    table = _kinds_table(tmp_path, layer_period=None, layer_blocks=None, layer_blocks_under=None)
    with pytest.raises(
        families.RecipeFormatError,
        match="writes 'decoder/layers/self_attention/query/kernel' from two leaves",
    ):
        suture.convert(llama, tmp_path / "mt", recipe=str(table), progress=False)
    assert not (tmp_path / "mt").exists()
