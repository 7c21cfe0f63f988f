"""Gemma 4 (text, dense and MoE) between Hugging Face and Tunix: the ``gemma4:tunix`` recipe.

Tiny random Gemma4ForCausalLM models (transformers' ``save_pretrained``), shaped like the 31B
(full-attention layers whose keys are their values: no ``v_proj``, Tunix's ``k_einsum``) and
the 26B-A4B (experts beside a dense MLP: the fused ``gate_up_proj`` as Tunix's
``gating_einsum``), go to Tunix's layout and back bit for bit; in Tunix's own environment
(`tests/tunix_env.py`) Tunix 0.1.7's loader and suture fill the same model with identical
leaves, whose logits are compared with transformers'.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import suture
from suture import families
from suture.families._convert import convert_with_recipe
from tests import tunix_env

from .test_families import _assert_refused, _assert_same_tensors

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

RECIPE = "gemma4:tunix"
TOKENS = np.array([[1, 5, 9, 2, 33, 7, 60, 3]])
PERIOD = 6
DENSE = dict(  # the 31B's settings, narrow
    vocab_size=64,
    hidden_size=32,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=8,
    global_head_dim=16,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    intermediate_size=24,
    num_hidden_layers=2 * PERIOD,
    sliding_window=4,
    layer_types=(["sliding_attention"] * (PERIOD - 1) + ["full_attention"]) * 2,
    hidden_size_per_layer_input=0,
    final_logit_softcapping=30.0,
)
MOE = dict(DENSE, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=12)
# Tunix 0.1.7's MoE routes on the experts' input, moe_pre_ffw_norm(x), where transformers routes
# on x (each through the router's own scale-free RMS norm): the two agree only when that norm's
# scale is uniform, so the models here have it uniform, and the logits then agree; with another
# scale, Tunix's model computes other logits from the very same leaves.
ROUTING = "pre_feedforward_layernorm_2"
needs_tunix = pytest.mark.skipif(
    not tunix_env.PYTHON.exists() or bool(os.environ.get("SUTURE_TUNIX_RAN")),
    reason=os.environ.get("SUTURE_TUNIX_RAN") or tunix_env.MISSING,
)


VISION = dict(  # a one-layer vision tower: the folder is multimodal, as every published one
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=8,
    global_head_dim=8,
    patch_size=4,
    position_embedding_size=16,
)


def _save(folder, config: dict, multimodal: bool = True) -> None:
    """A random Gemma 4; multimodal (model.language_model.*, the only names Tunix's loader
    reads), or the text model alone."""
    torch.manual_seed(0)
    if multimodal:
        whole = transformers.Gemma4Config(
            text_config=config, vision_config=VISION, audio_config=None
        )
        module = transformers.Gemma4ForConditionalGeneration(whole).eval()
    else:
        module = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**config)).eval()
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if "norm" in name or "scale" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
            if "pre_feedforward_layernorm_2" in name:  # uniform: see ROUTING
                parameter.fill_(1.25)
    module.save_pretrained(folder)


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "suture", *map(str, args), "--no-progress"],
        capture_output=True,
        text=True,
    )


def _logits(folder) -> np.ndarray:
    module = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return module.eval()(torch.from_numpy(TOKENS)).logits.numpy()


@pytest.mark.parametrize(
    ("config", "multimodal"), [(DENSE, False), (MOE, True)], ids=["dense-text", "moe-multimodal"]
)
def test_round_trip_is_bit_identical(tmp_path, config, multimodal):
    _save(tmp_path / "hf", config, multimodal)
    with pytest.warns(families.LeftOutWarning) if multimodal else contextlib.nullcontext():
        convert_with_recipe(tmp_path / "hf", tmp_path / "tunix", RECIPE, progress=False)
    tree = suture.open(tmp_path / "tunix")
    assert tree["layers/5/attn/k_einsum/w"].shape == (1, 32, 16)  # k alone, global heads
    assert "layers/5/attn/kv_einsum/w" not in tree.paths()
    assert tree["layers/0/attn/kv_einsum/w"].shape == (2, 2, 32, 8)
    if config is MOE:
        assert tree["layers/3/moe/gating_einsum"].shape == (4, 2, 12, 32)
        assert tree["layers/3/moe/linear"].shape == (4, 12, 32)
    like = ["--like", str(tmp_path / "hf")] if multimodal else []
    done = _cli(
        "convert", tmp_path / "tunix", tmp_path / "back", "--recipe", RECIPE, "--reverse", *like
    )
    assert done.returncode == 0, done.stderr
    _assert_same_tensors(tmp_path / "hf", tmp_path / "back")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(hidden_size_per_layer_input=8), "'hidden_size_per_layer_input' is 8"),
        (dict(layer_types=["sliding_attention"] * 12), "'layer_types' has no 'full_attention'"),
    ],
    ids=["per-layer-inputs", "no-full-layer"],
)
def test_configs_it_cannot_write_are_refused(tmp_path, change, match):
    _save(tmp_path / "hf", DENSE, multimodal=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **change}))
    _assert_refused(tmp_path, RECIPE, match)


def test_recipe_is_listed():
    assert RECIPE in families.recipe_names()


@needs_tunix
@pytest.mark.parametrize("config", [DENSE, MOE], ids=["dense", "moe"])
def test_tunix_loader_and_suture_load_identical_leaves(tmp_path, config):
    _save(tmp_path / "hf", config)
    tunix_env.run_worker("load", "gemma4", tmp_path / "hf", tmp_path / "out", timeout=600)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["differ"] == [] and report["leaves"] == report["ours"] > 0
    got, expected = np.load(tmp_path / "out" / "logits.npy"), _logits(tmp_path / "hf")
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
