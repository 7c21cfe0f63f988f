"""Llama 3.2 (1B, 3B) between Hugging Face and Tunix: the ``llama3.2:tunix`` recipe.

Llama 3.2 ties its head to the embedding (``tie_word_embeddings: true``; its folder holds no
``lm_head.weight``) and scales its rotary frequencies the Llama 3 way. Tunix's Llama3 built
from its Llama 3.2 presets (``ModelConfig.llama3p2_1b`` / ``llama3p2_3b``, ``weight_tying=True``)
has no ``lm_head`` and decodes with the embedding; neither side's weights depend on the rotary
settings, so the recipe is ``llama3:tunix``'s table under Llama 3.2's name. Checked here with a
tiny random tied model (transformers' ``save_pretrained``), the published configs, and, in
Tunix's own environment (`tests/tunix_env.py`), Tunix's loader and presets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import suture
from suture import families
from suture.families._convert import convert_with_recipe
from tests import tunix_env

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

RECIPE = "llama3.2:tunix"
TOKENS = np.array([[1, 5, 9, 2, 33, 7, 60, 3]])
# Llama 3.2's rotary settings as its config.json writes them (transformers 5's spelling)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
# The published meta-llama/Llama-3.2-{1B,3B} config.json (transformers 4's spelling)
PUBLISHED = {
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, head_dim=64),
    "3b": dict(hidden_size=3072, intermediate_size=8192, num_attention_heads=24, head_dim=128),
}
LAYERS = {"1b": 16, "3b": 28}
needs_tunix = pytest.mark.skipif(
    not tunix_env.PYTHON.exists() or bool(os.environ.get("SUTURE_TUNIX_RAN")),
    reason=os.environ.get("SUTURE_TUNIX_RAN") or tunix_env.MISSING,
)


def _published_config(size: str) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "model_type": "llama",
        "num_hidden_layers": LAYERS[size],
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "rope_scaling": {k: v for k, v in LLAMA3_ROPE.items() if k != "rope_theta"},
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "vocab_size": 128256,
        **PUBLISHED[size],
    }


def _abstract_hf_tree(config: dict) -> dict:
    """The published folder's tensors as zero-stride arrays of their shapes (no memory)."""
    e, i, d = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], e), "model.norm.weight": (e,)}
    for layer in range(config["num_hidden_layers"]):
        for name, shape in {
            "self_attn.q_proj": (q, e),
            "self_attn.k_proj": (kv, e),
            "self_attn.v_proj": (kv, e),
            "self_attn.o_proj": (e, q),
            "mlp.gate_proj": (i, e),
            "mlp.up_proj": (i, e),
            "mlp.down_proj": (e, i),
            "input_layernorm": (e,),
            "post_attention_layernorm": (e,),
        }.items():
            shapes[f"model.layers.{layer}.{name}.weight"] = shape
    return suture.unflatten(
        {k.replace(".", "/"): np.broadcast_to(np.float32(0), s) for k, s in shapes.items()}
    )


def _save_tiny(folder) -> None:
    """A tiny random Llama 3.2: tied head, Llama 3 rotary scaling, non-trivial norms."""
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        rope_parameters=dict(LLAMA3_ROPE),
    )
    torch.manual_seed(0)
    module = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if "norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    module.save_pretrained(folder)


def _tensors(folder) -> dict[str, np.ndarray]:
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def _snapshot(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "suture", *map(str, args)], capture_output=True, text=True
    )


def _logits_as_tunix_computes(folder) -> np.ndarray:
    """transformers' logits for `folder` with the rotary embedding Tunix 0.1.7's Llama3 applies
    whatever the config says: theta 1e6, no Llama 3 scaling (its `apply_rope` default)."""
    config = transformers.AutoConfig.from_pretrained(folder)
    config.rope_parameters = {"rope_type": "default", "rope_theta": 1e6}
    module = transformers.AutoModelForCausalLM.from_pretrained(
        folder, config=config, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        return module(torch.from_numpy(TOKENS)).logits.numpy()


@pytest.mark.parametrize("size", sorted(PUBLISHED))
def test_llama32_tunix_is_listed_and_its_table_has_no_head(tmp_path, size):
    assert RECIPE in families.recipe_names()
    recipe = families.get_recipe(RECIPE)
    assert recipe.name == RECIPE
    listed = _cli("recipes")
    assert listed.returncode == 0 and f"{RECIPE} " in listed.stdout
    config = _published_config(size)
    (tmp_path / "config.json").write_text(json.dumps(config))
    table = _cli("recipes", RECIPE, "--config", tmp_path / "config.json")
    assert table.returncode == 0, table.stderr
    assert "embedder/input_embedding" in table.stdout and "lm_head/w" not in table.stdout
    leaves = suture.flatten(recipe.to_target(_abstract_hf_tree(config), config))
    assert "lm_head/w" not in leaves and len(leaves) == 2 + 9 * LAYERS[size]
    head_dim = PUBLISHED[size]["head_dim"]
    assert leaves["layers/0/attn/k_proj/w"].shape == (PUBLISHED[size]["hidden_size"], 8, head_dim)


def test_round_trip_through_the_cli_is_bit_identical_and_stays_tied(tmp_path):
    _save_tiny(tmp_path / "hf")
    source = _snapshot(tmp_path / "hf")
    assert "lm_head.weight" not in _tensors(tmp_path / "hf")
    done = _cli("convert", tmp_path / "hf", tmp_path / "tunix", "--recipe", RECIPE, "--no-progress")
    assert done.returncode == 0, done.stderr
    ckpt = suture.open(tmp_path / "tunix")
    assert "lm_head/w" not in ckpt.paths()
    assert ckpt["layers/1/attn/q_proj/w"].shape == (64, 4, 16)
    assert ckpt["layers/0/attn/o_proj/w"].shape == (4, 16, 64)
    back = _cli(
        "convert",
        tmp_path / "tunix",
        tmp_path / "back",
        "--recipe",
        RECIPE,
        "--reverse",
        "--like",
        tmp_path / "hf",
        "--no-progress",
    )
    assert back.returncode == 0, back.stderr
    original, returned = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert sorted(original) == sorted(returned)  # no lm_head.weight made up on the way back
    for name, value in original.items():
        assert returned[name].dtype == value.dtype and np.array_equal(returned[name], value), name
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["tie_word_embeddings"] is True and config["rope_parameters"] == LLAMA3_ROPE
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back")
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    assert _snapshot(tmp_path / "hf") == source


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("tied-with-head", r"no place for 1 tensor\(s\) of the checkpoint: lm_head\.weight"),
        ("untied-without-head", r"needs tensor 'lm_head\.weight' for 'lm_head/w'"),
    ],
)
def test_a_head_that_does_not_match_tie_word_embeddings_is_refused(tmp_path, case, message):
    """A tied config beside an lm_head.weight (which Tunix's loader drops without a word), or
    an untied one without it (Tunix would keep a random head): refused, nothing written."""
    _save_tiny(tmp_path / "hf")
    if case == "tied-with-head":
        tensors = _tensors(tmp_path / "hf")
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] * np.float32(2)
        save_file(tensors, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    else:
        config = json.loads((tmp_path / "hf" / "config.json").read_text())
        config["tie_word_embeddings"] = False
        (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    source = _snapshot(tmp_path / "hf")
    with pytest.raises(families.ConfigMismatchError, match=message):
        convert_with_recipe(tmp_path / "hf", tmp_path / "tunix", RECIPE, progress=False)
    done = _cli("convert", tmp_path / "hf", tmp_path / "tunix", "--recipe", RECIPE, "--no-progress")
    assert done.returncode != 0 and "lm_head.weight" in done.stderr
    assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    assert _snapshot(tmp_path / "hf") == source


# With Tunix itself ---------------------------------------------------------------------------


@needs_tunix
@pytest.mark.parametrize("size", sorted(PUBLISHED))
def test_published_configs_give_the_leaves_of_tunix_llama32_presets(tmp_path, size):
    """suture's tree for the published Llama-3.2-1B/3B config.json has exactly the leaves and
    shapes of Tunix's Llama3 built from ModelConfig.llama3p2_1b / llama3p2_3b."""
    tunix_env.run_worker("preset", f"llama3p2_{size}", tmp_path / "preset.json")
    preset = json.loads((tmp_path / "preset.json").read_text())
    assert preset["weight_tying"] is True
    config = _published_config(size)
    ours = suture.flatten(families.get_recipe(RECIPE).to_target(_abstract_hf_tree(config), config))
    assert {path: list(leaf.shape) for path, leaf in ours.items()} == preset["leaves"]


@needs_tunix
def test_tunix_loader_and_suture_load_identical_leaves(tmp_path):
    """Into Tunix's Llama 3.2 preset (made tiny): Tunix's create_model_from_safe_tensors and
    suture give the same leaves, bit for bit, and no lm_head; the model's logits are the tied
    model's with the rotary embedding Tunix's Llama3 applies."""
    _save_tiny(tmp_path / "hf")
    tunix_env.run_worker("load", "llama3.2", tmp_path / "hf", tmp_path / "out")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["differ"] == [] and report["leaves"] == report["ours"] == 2 + 9 * 2
    assert not any(path.startswith("lm_head") for path in report["paths"])
    got = np.load(tmp_path / "out" / "logits.npy")
    np.testing.assert_allclose(got, _logits_as_tunix_computes(tmp_path / "hf"), atol=1e-5, rtol=0)


@needs_tunix
def test_a_tunix_llama32_checkpoint_exports_to_a_tied_folder(tmp_path):
    """Loaded by Tunix, its (tied) embedding doubled, saved by Tunix's CheckpointManager:
    exported with --reverse --like, a folder with no lm_head.weight whose logits are Tunix's."""
    _save_tiny(tmp_path / "hf")
    tunix_env.run_worker("save", "llama3.2", tmp_path / "hf", tmp_path / "run")
    done = _cli(
        "convert",
        tmp_path / "run",
        tmp_path / "out",
        "--recipe",
        RECIPE,
        "--reverse",
        "--like",
        tmp_path / "hf",
        "--no-progress",
    )
    assert done.returncode == 0, done.stderr
    out, hf = _tensors(tmp_path / "out"), _tensors(tmp_path / "hf")
    assert sorted(out) == sorted(hf)
    expected = hf["model.embed_tokens.weight"] * np.float32(2)
    assert np.array_equal(out["model.embed_tokens.weight"], expected)
    got = _logits_as_tunix_computes(tmp_path / "out")
    np.testing.assert_allclose(got, np.load(tmp_path / "run" / "logits.npy"), atol=1e-5, rtol=0)
