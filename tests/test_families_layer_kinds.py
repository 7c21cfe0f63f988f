"""A config whose per-layer kinds depart from the pattern MaxText fixes in code is refused.

MaxText's Gemma 2/3, gpt-oss and Llama 4 models do not read ``layer_types``,
``no_rope_layers`` or ``moe_layers``: they fix the pattern in code. A checkpoint with another
pattern has tensors of the same shapes, so it would convert and then run each layer as another
kind. These tests edit the config.json of real tiny models (transformers' `save_pretrained`)
and check the refusal names the field, the layer, what was expected and found, and that no
output appears.
"""

from __future__ import annotations

import json

import pytest

from suture import families
from suture.families._convert import convert_with_recipe

from .test_families import _save_model
from .test_families_gemma3 import _text_model
from .test_families_moe import _gpt_oss, _llama4

transformers = pytest.importorskip("transformers")


def _edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return config


def _refused(tmp_path, recipe, match):
    with pytest.raises(families.ConfigMismatchError, match=match):
        convert_with_recipe(tmp_path / "hf", tmp_path / "out", recipe, progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("layout", ["maxtext", "maxtext-unscanned"])
def test_gemma3_layer_types_other_than_five_local_then_one_global_are_refused(tmp_path, layout):
    _text_model(tmp_path / "hf")
    kinds = json.loads((tmp_path / "hf" / "config.json").read_text())["layer_types"]
    assert kinds[5] == "full_attention"  # what transformers writes: the recipe's pattern
    kinds[5] = "sliding_attention"
    _edit_config(tmp_path / "hf", layer_types=kinds)
    _refused(
        tmp_path,
        f"gemma3:{layout}",
        r"'layer_types' makes layer 5 'sliding_attention'; recipe 'gemma3:.*' expects "
        r"'full_attention' there",
    )


def test_gemma3_older_config_with_another_period_is_refused(tmp_path):
    _text_model(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["layer_types"]
    config["sliding_window_pattern"] = 4
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    _refused(tmp_path, "gemma3:maxtext", r"'sliding_window_pattern' is 4: MaxText's Gemma 3 fixes")


def test_gemma3_config_without_layer_types_converts(tmp_path):
    _text_model(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["layer_types"]  # transformers then builds them from the same pattern
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    convert_with_recipe(tmp_path / "hf", tmp_path / "out", "gemma3:maxtext", progress=False)
    assert (tmp_path / "out").is_dir()


def test_gpt_oss_pairs_starting_with_full_attention_are_refused(tmp_path):
    _gpt_oss(tmp_path / "hf")
    _edit_config(tmp_path / "hf", layer_types=["full_attention", "sliding_attention"] * 2)
    _refused(
        tmp_path,
        "gpt-oss:maxtext",
        r"makes layer 0 'full_attention'; recipe 'gpt-oss:maxtext' expects 'sliding_attention'",
    )


def test_a_layer_types_list_of_the_wrong_length_is_refused(tmp_path):
    _gpt_oss(tmp_path / "hf")
    _edit_config(tmp_path / "hf", layer_types=["sliding_attention", "full_attention"])
    _refused(tmp_path, "gpt-oss:maxtext", r"expects a list of 4 entries \(one per layer")


def test_llama4_moe_layers_off_the_interleave_step_are_refused(tmp_path):
    _llama4(tmp_path / "hf", step=2)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["moe_layers"] == [1, 3, 5, 7]  # as transformers writes it: the recipe's rule
    _edit_config(tmp_path / "hf", moe_layers=[0, 2, 4, 6])
    _refused(
        tmp_path, "llama4:maxtext", r"'moe_layers' is \[0, 2, 4, 6\]; .* expects \[1, 3, 5, 7\]"
    )


def test_llama4_rope_left_out_elsewhere_than_every_fourth_layer_is_refused(tmp_path):
    _llama4(tmp_path / "hf", step=1)
    _edit_config(tmp_path / "hf", no_rope_layers=[1, 1, 0, 1] * 2)
    _refused(
        tmp_path, "llama4:maxtext-unscanned", r"'no_rope_layers' makes layer 2 0; .* expects 1"
    )


def test_gemma2_layers_not_paired_local_then_global_are_refused(tmp_path):
    _save_model("gemma2", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    layers = config["num_hidden_layers"]
    _edit_config(tmp_path / "hf", layer_types=["full_attention"] * layers)
    _refused(tmp_path, "gemma2:maxtext", r"makes layer 0 'full_attention'; .* 'sliding_attention'")


@pytest.mark.parametrize("recipe", ["qwen3:maxtext", "qwen3:tunix"])
def test_qwen_with_sliding_window_layers_is_refused(tmp_path, recipe):
    """Qwen's use_sliding_window makes the layers from max_window_layers on sliding; neither
    MaxText's nor Tunix's Qwen3 has a sliding window."""
    config = transformers.Qwen3Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        use_sliding_window=True,
        sliding_window=16,
        max_window_layers=2,
    )
    assert config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    transformers.Qwen3ForCausalLM(config).save_pretrained(tmp_path / "hf")
    _refused(tmp_path, recipe, r"makes layer 2 'sliding_attention'; .* expects 'full_attention'")
