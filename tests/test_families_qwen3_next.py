"""Qwen3-Next: the qwen3-next recipes, proven with transformers' own Qwen3NextForCausalLM.

A tiny random model (two cycles of 3 Gated DeltaNet layers and 1 full-attention layer, 4
routed experts, a shared expert) goes to MaxText's layout and back bit for bit, scanned and
unscanned, from either expert layout transformers writes; the tree has the paths and shapes
of MaxText 0.2.5's converter (QWEN3_NEXT_MAXTEXT_TO_HF_PARAM_MAPPING) and model
(Qwen3NextScannableBlock: layers/local_layers nested (blocks, local) on axes 1 and 2,
layers/global_layer on axis 1), each HF layer in its place. MaxText's own model restoring
these outputs is bench/_maxtext_families.py's run.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import suture
from suture import families
from suture.families._convert import convert_with_recipe

from .test_families import (
    _assert_refused,
    _assert_same_tensors,
    _assert_tree,
    _cli_round_trip,
    _cli_shows_family,
    _tensors,
)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

CYCLE = 4  # MaxText's inhomogeneous_layer_cycle_interval for Qwen3-Next
LAYERS = 8
E, HEADS, KV, D, MOE, EXPERTS, V = 32, 4, 2, 8, 16, 4, 64
GDN_KEY_HEADS, GDN_VALUE_HEADS, GDN_D, KERNEL = 2, 4, 8, 4
CONFIG = dict(
    vocab_size=V,
    hidden_size=E,
    intermediate_size=48,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    num_key_value_heads=KV,
    head_dim=D,
    linear_conv_kernel_dim=KERNEL,
    linear_key_head_dim=GDN_D,
    linear_value_head_dim=GDN_D,
    linear_num_key_heads=GDN_KEY_HEADS,
    linear_num_value_heads=GDN_VALUE_HEADS,
    moe_intermediate_size=MOE,
    shared_expert_intermediate_size=MOE,
    num_experts=EXPERTS,
    num_experts_per_tok=2,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
)


def _save_model(folder, fused: bool = False, **extra) -> object:
    torch.manual_seed(0)
    config = transformers.Qwen3NextConfig(**{**CONFIG, **extra})
    model = transformers.Qwen3NextForCausalLM(config).eval()
    with torch.no_grad():  # no two tensors alike, so that a wrong mapping shows
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    model.save_pretrained(folder, save_original_format=not fused)
    return model


def _round_trip(tmp_path, layout, fused=False, **extra):
    _save_model(tmp_path / "hf", fused=fused, **extra)
    name = f"qwen3-next:{layout}"
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", name, progress=False)
    convert_with_recipe(tmp_path / "mt", tmp_path / "back", name, reverse=True, progress=False)
    _assert_same_tensors(tmp_path / "hf", tmp_path / "back", same_config=True)


@pytest.mark.parametrize("fused", [False, True], ids=["per-expert", "fused"])
@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_qwen3_next_round_trip_is_bit_identical(tmp_path, layout, fused):
    _round_trip(tmp_path, layout, fused=fused)
    assert transformers.Qwen3NextForCausalLM.from_pretrained(tmp_path / "back") is not None


# MaxText's names per layer, with the shape of one layer (QWEN3_NEXT_MAXTEXT_TO_HF_PARAM_MAPPING's
# names; the shapes of MaxText's Qwen3NextDecoderLayer)
SHARED = {
    "input_layernorm/scale": (E,),
    "post_attention_layernorm/scale": (E,),
    "mlp/routed_experts/gate/kernel": (E, EXPERTS),
    "mlp/routed_experts/wi_0": (EXPERTS, E, MOE),
    "mlp/routed_experts/wi_1": (EXPERTS, E, MOE),
    "mlp/routed_experts/wo": (EXPERTS, MOE, E),
    "mlp/shared_expert/wi_0/kernel": (E, MOE),
    "mlp/shared_expert/wi_1/kernel": (E, MOE),
    "mlp/shared_expert/wo/kernel": (MOE, E),
    "mlp/shared_expert_gate/kernel": (E, 1),
}
CONV = 2 * GDN_KEY_HEADS * GDN_D + GDN_VALUE_HEADS * GDN_D
LINEAR = {
    "attention/in_proj_qkvz/kernel": (E, CONV + GDN_VALUE_HEADS * GDN_D),
    "attention/in_proj_ba/kernel": (E, 2 * GDN_VALUE_HEADS),
    "attention/conv1d/kernel": (KERNEL, 1, CONV),
    "attention/A_log": (GDN_VALUE_HEADS,),
    "attention/dt_bias": (GDN_VALUE_HEADS,),
    "attention/norm/rms_norm/scale": (GDN_D,),
    "attention/out_proj/kernel": (GDN_VALUE_HEADS * GDN_D, E),
}
FULL = {
    "attention/attention/query/kernel": (E, HEADS, 2 * D),  # the output gate beside the query
    "attention/attention/key/kernel": (E, KV, D),
    "attention/attention/value/kernel": (E, KV, D),
    "attention/attention/out/kernel": (HEADS * D, E),  # flat
    "attention/attention/query_norm/scale": (D,),
    "attention/attention/key_norm/scale": (D,),
}


def _stacked(shape, axes):
    """`shape` with the layer axes `axes` in, after its leading axis (experts, or the first)."""
    return (shape[0], *axes, *shape[1:])


def _expected_shapes(scanned: bool, layers: int = LAYERS) -> dict[str, tuple[int, ...]]:
    shapes = {
        "token_embedder/embedding": (V, E),
        "decoder/decoder_norm/scale": (E,),
        "decoder/logits_dense/kernel": (E, V),
    }
    blocks, rest = divmod(layers, CYCLE)
    for i in range(layers):
        full = i % CYCLE == CYCLE - 1
        for leaf, shape in {**SHARED, **(FULL if full else LINEAR)}.items():
            if not scanned:
                shapes[f"decoder/layers_{i}/{leaf}"] = shape
            elif i >= blocks * CYCLE:  # the remainder: a shorter block, local layers on axis 1
                shapes[f"decoder/layers_remainder/local_layers/{leaf}"] = _stacked(shape, (rest,))
            elif full:
                shapes[f"decoder/layers/global_layer/{leaf}"] = _stacked(shape, (blocks,))
            else:
                shapes[f"decoder/layers/local_layers/{leaf}"] = _stacked(shape, (blocks, CYCLE - 1))
    return {f"params/params/{path}": shape for path, shape in shapes.items()}


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_qwen3_next_tree_has_maxtexts_paths_and_shapes(tmp_path, layout):
    _save_model(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", f"qwen3-next:{layout}", progress=False)
    _assert_tree(tmp_path / "mt", _expected_shapes(layout == "maxtext"))


def test_scanned_qwen3_next_puts_hf_layer_4b_plus_p_at_block_b_position_p(tmp_path):
    _save_model(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "qwen3-next:maxtext", progress=False)
    hf, ckpt = _tensors(tmp_path / "hf"), suture.open(tmp_path / "mt")
    local = "params/params/decoder/layers/local_layers"
    qkvz = ckpt[f"{local}/attention/in_proj_qkvz/kernel"].read()
    conv = ckpt[f"{local}/attention/conv1d/kernel"].read()
    a_log = ckpt[f"{local}/attention/A_log"].read()
    wi_0 = ckpt[f"{local}/mlp/routed_experts/wi_0"].read()
    query = ckpt["params/params/decoder/layers/global_layer/attention/attention/query/kernel"]
    query = query.read()
    for block in range(LAYERS // CYCLE):
        for position in range(CYCLE - 1):
            layer = f"model.layers.{block * CYCLE + position}"
            # the fused in_proj_qkvz is already in MaxText's order: a plain transpose
            np.testing.assert_array_equal(
                qkvz[:, block, position], hf[f"{layer}.linear_attn.in_proj_qkvz.weight"].T
            )
            # HF (channels, 1, kernel) -> MaxText (kernel, 1, channels), layer axes after kernel
            np.testing.assert_array_equal(
                conv[:, block, position],
                hf[f"{layer}.linear_attn.conv1d.weight"].transpose(2, 1, 0),
            )
            np.testing.assert_array_equal(
                a_log[:, block, position], hf[f"{layer}.linear_attn.A_log"]
            )
            for expert in range(EXPERTS):
                np.testing.assert_array_equal(
                    wi_0[expert, block, position],
                    hf[f"{layer}.mlp.experts.{expert}.gate_proj.weight"].T,
                )
        full = hf[f"model.layers.{block * CYCLE + CYCLE - 1}.self_attn.q_proj.weight"]
        np.testing.assert_array_equal(query[:, block], full.T.reshape(E, HEADS, 2 * D))


def test_qwen3_next_layers_past_the_last_cycle_go_to_the_remainder_block(tmp_path):
    """10 layers: two blocks, then layers 8 and 9 (linear) in layers_remainder/local_layers, as
    MaxText's model builds them; back to HF bit for bit."""
    _round_trip(tmp_path, "maxtext", num_hidden_layers=10)
    ckpt, hf = suture.open(tmp_path / "mt"), _tensors(tmp_path / "hf")
    expected = _expected_shapes(True, layers=10)
    assert sorted(p for p in ckpt.paths() if p != "step") == sorted(expected)
    rest = ckpt["params/params/decoder/layers_remainder/local_layers/attention/dt_bias"].read()
    for slot, layer in enumerate((8, 9)):
        np.testing.assert_array_equal(
            rest[:, slot], hf[f"model.layers.{layer}.linear_attn.dt_bias"]
        )


def test_qwen3_next_reverse_refuses_a_tree_of_other_blocks(tmp_path):
    """A scanned tree whose nested stack holds other (blocks, local) counts than the config's
    is refused naming the leaf, the counts and the axes, before anything is written."""
    _save_model(tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "qwen3-next:maxtext", progress=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["num_hidden_layers"] = 4
    config["layer_types"] = config["layer_types"][:4]
    (tmp_path / "small.json").write_text(json.dumps(config))
    with pytest.raises(families.ConfigMismatchError, match=r"local_layers.*axes 1-2"):
        convert_with_recipe(
            tmp_path / "mt",
            tmp_path / "back",
            "qwen3-next:maxtext",
            reverse=True,
            config=tmp_path / "small.json",
            progress=False,
        )
    assert not (tmp_path / "back").exists()


# Configs MaxText's Qwen3-Next cannot hold ----------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (
            dict(layer_types=["linear_attention", "full_attention"] * 4),
            "'layer_types' makes layer 1 'full_attention'.*expects 'linear_attention'",
        ),
        (dict(tie_word_embeddings=True), "'tie_word_embeddings' is True: MaxText's Qwen3-Next"),
        (dict(mlp_only_layers=[1]), r"'mlp_only_layers' is \[1\]: MaxText's Qwen3-Next has"),
        (
            dict(shared_expert_intermediate_size=24),
            "'shared_expert_intermediate_size' is 24: MaxText's Qwen3-Next sizes",
        ),
    ],
)
def test_qwen3_next_refuses_a_config_maxtext_cannot_hold(tmp_path, extra, match):
    _save_model(tmp_path / "hf", **extra)
    _assert_refused(tmp_path, "qwen3-next:maxtext", match)


def test_qwen3_next_refuses_a_published_config_of_another_cycle(tmp_path):
    """A published config names the cycle (full_attention_interval) and lists no layer_types."""
    _save_model(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["layer_types"]
    config["full_attention_interval"] = 2
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        families.ConfigMismatchError, match="'full_attention_interval' is 2: MaxText's Qwen3-Next"
    ):
        convert_with_recipe(tmp_path / "hf", tmp_path / "mt", "qwen3-next:maxtext", progress=False)
    assert not (tmp_path / "mt").exists()


def test_cli_lists_qwen3_next_and_converts_both_ways(tmp_path):
    _save_model(tmp_path / "hf")
    shown = _cli_shows_family("qwen3-next", tmp_path / "hf" / "config.json")
    assert "QWEN3_NEXT_MAXTEXT_TO_HF_PARAM_MAPPING" in shown
    assert "permute axes to [2, 1, 0]" in shown
    _cli_round_trip(tmp_path, "qwen3-next:maxtext")


# layer_blocks in a user's table -----------------------------------------------------------


def _llama_blocks_table(folder, **change) -> object:
    """llama3.1's table as a user's file, its layers in blocks of 2: position 0 in
    ``local_layers`` (a nested stack), position 1 in ``global_layer``."""
    from importlib.resources import files

    import yaml

    data = yaml.safe_load(files("suture.families").joinpath("llama3.1.yaml").read_text())
    data["names"] = ["blocks"]
    data["layer_period"] = 2
    data["layer_blocks"] = {"local_layers": [0], "global_layer": 1}
    data.update(change)
    data = {key: value for key, value in data.items() if value is not None}
    path = folder / "blocks.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_users_table_with_layer_blocks_converts_both_ways(tmp_path):
    """5 Llama layers in blocks of 2: layers 0, 2 in local_layers (2 blocks x 1), 1, 3 in
    global_layer, layer 4 in layers_remainder/local_layers; back bit for bit."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
    )  # head_dim 16: the query scale is exact
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    table = str(_llama_blocks_table(tmp_path))
    suture.convert(tmp_path / "hf", tmp_path / "mt", recipe=table, progress=False)
    tree = suture.open(tmp_path / "mt")
    decoder = "params/params/decoder"
    wo = "mlp/wo/kernel"
    assert tree[f"{decoder}/layers/local_layers/{wo}"].shape == (96, 2, 1, 64)
    assert tree[f"{decoder}/layers/global_layer/{wo}"].shape == (96, 2, 64)
    assert tree[f"{decoder}/layers_remainder/local_layers/{wo}"].shape == (96, 1, 64)
    hf = _tensors(tmp_path / "hf")
    np.testing.assert_array_equal(
        tree[f"{decoder}/layers/local_layers/{wo}"].read()[:, 1, 0],
        hf["model.layers.2.mlp.down_proj.weight"].T,
    )
    suture.convert(tmp_path / "mt", tmp_path / "back", recipe=table, reverse=True, progress=False)
    back = _tensors(tmp_path / "back")
    assert sorted(back) == sorted(hf)
    assert all(np.array_equal(hf[k], back[k]) for k in hf)


@pytest.mark.parametrize(
    ("change", "phrase"),
    [
        (dict(layer_period=None), "layer_blocks: needs a layer_period"),
        (
            dict(layer_blocks={"local_layers": [0, 2], "global_layer": 1}),
            r"layer_blocks.local_layers: must be a position of the period \(0 to 1\)",
        ),
        (
            dict(layer_blocks={"local_layers": [0, 1], "global_layer": 1}),
            "layer_blocks.global_layer: position 1 is also in 'local_layers'",
        ),
        (
            dict(layer_blocks={"local_layers": [0]}),
            r"layer_blocks: puts no place for position\(s\) \[1\] of the period of 2",
        ),
        (
            dict(layer_blocks={"local layers": [0], "global_layer": 1}),
            "layer_blocks.local layers: a place is a word",
        ),
    ],
)
def test_a_table_with_wrong_layer_blocks_is_refused_naming_the_entry(tmp_path, change, phrase):
    from suture.families._file import family_recipe

    path = _llama_blocks_table(tmp_path, **change)
    with pytest.raises(families.RecipeFormatError, match=phrase):
        family_recipe(str(path))
