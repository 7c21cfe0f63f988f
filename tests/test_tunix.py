"""Tunix's NNX models as a target: the ``FAMILY:tunix`` recipes, both ways.

Tiny random models are made with transformers (`save_pretrained`). Without Tunix, the
recipes are checked against the layout of ``nnx.state`` of Tunix's models, a round trip bit
for bit, and an export from the layout Tunix's CheckpointManager writes (real Orbax). With
Tunix's own environment (`tests/tunix_env.py`, google-tunix 0.1.7), Tunix's loader and
suture fill the same model class with identical leaves, whose logits are transformers'; and
a checkpoint saved by Tunix's CheckpointManager (with qwix LoRA adapters, too) exports to an
HF folder that gives the Tunix model's logits in transformers. Qwen3-MoE is read and written in
both of transformers' expert layouts (one tensor per expert, and v5's fused 3-D experts).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

import suture
from suture import families
from suture.families._convert import convert_with_recipe
from suture.families._tunix import merged_lora
from tests import tunix_env

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TOKENS = np.array([[1, 5, 9, 2, 33, 7, 60, 3]])
# Tunix's Llama 3 and Qwen3 models apply rotary embeddings with theta 1e6 whatever their
# config says, so the tiny models use that theta too.
BASE = dict(
    vocab_size=64,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-5,
    rope_theta=1e6,
)
MODELS = {
    "llama3": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**BASE)),
    "llama3-tied": lambda: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**BASE, tie_word_embeddings=True)
    ),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**BASE, head_dim=16)),
    "qwen3-tied": lambda: transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(**BASE, head_dim=16, tie_word_embeddings=True)
    ),
    "qwen2.5": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**BASE)),
    # Tunix's MoELayer always renormalizes the top-k routing weights: norm_topk_prob true
    "qwen3-moe": lambda: transformers.Qwen3MoeForCausalLM(
        transformers.Qwen3MoeConfig(
            **BASE,
            head_dim=16,
            moe_intermediate_size=24,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
        )
    ),
    # Tunix's Gemma: rotary theta 1e4, RMSNorm eps 1e-6, query scaled by 1/sqrt(head_dim)
    "gemma2": lambda: transformers.Gemma2ForCausalLM(
        transformers.Gemma2Config(
            **{**BASE, "rope_theta": 1e4, "rms_norm_eps": 1e-6},
            head_dim=16,
            query_pre_attn_scalar=16,
        )
    ),
    # Tunix's Gemma3: 5 of every 6 layers local (rotary theta 1e4), then one global (1e6)
    "gemma3": lambda: transformers.Gemma3ForCausalLM(
        transformers.Gemma3TextConfig(
            **{k: v for k, v in BASE.items() if k not in ("rope_theta", "rms_norm_eps")},
            rms_norm_eps=1e-6,
            head_dim=16,
            query_pre_attn_scalar=16,
        )
    ),
    "gemma2-mha": lambda: transformers.Gemma2ForCausalLM(
        transformers.Gemma2Config(
            **{**BASE, "rope_theta": 1e4, "rms_norm_eps": 1e-6, "num_key_value_heads": 4},
            head_dim=16,
            query_pre_attn_scalar=16,
        )
    ),
}
needs_tunix = pytest.mark.skipif(
    not tunix_env.PYTHON.exists() or bool(os.environ.get("SUTURE_TUNIX_RAN")),
    reason=os.environ.get("SUTURE_TUNIX_RAN") or tunix_env.MISSING,
)


# Leaves of nnx.state of Tunix's models, with their shapes for the tiny models
SHAPES = {
    "*": {
        "layers/1/attn/q_proj/w": (64, 4, 16),  # (embed, heads, head_dim)
        "layers/0/attn/o_proj/w": (4, 16, 64),
        "layers/0/mlp/down_proj/kernel": (96, 64),
    },
    "gemma2": {
        "layers/1/attn/q_einsum/w": (4, 64, 16),  # (heads, embed, head_dim)
        "layers/1/attn/kv_einsum/w": (2, 2, 64, 16),  # (k and v, kv heads, embed, head_dim)
        "layers/0/attn/attn_vec_einsum/w": (4, 16, 64),
        "layers/0/pre_ffw_norm/scale": (64,),
    },
    "gemma2-mha": {"layers/1/attn/qkv_einsum/w": (3, 4, 64, 16)},
    "qwen3-moe": {
        "layers/1/attn/q_proj/w": (64, 4, 16),
        "layers/1/mlp/router/kernel": (64, 4),  # (embed, experts)
        "layers/1/mlp/gate_proj": (4, 64, 24),  # (experts, embed, moe_intermediate)
        "layers/0/mlp/up_proj": (4, 64, 24),
        "layers/0/mlp/down_proj": (4, 24, 64),
    },
    "gemma3": {
        "layers/1/attn/kv_einsum/w": (2, 2, 64, 16),
        "layers/1/attn/_query_norm/scale": (16,),
        "layers/0/post_attention_norm/scale": (64,),
    },
}


def _recipe(model: str) -> str:
    return f"{model.removesuffix('-tied').removesuffix('-mha')}:tunix"


def _save_model(model: str, folder, fused: bool = False) -> object:
    """`fused`: experts in transformers v5's fused 3-D tensors, not one tensor per expert."""
    torch.manual_seed(0)
    module = MODELS[model]().eval()
    with torch.no_grad():  # non-zero biases and non-trivial norms, so a wrong mapping shows
        for name, parameter in module.named_parameters():
            if "norm" in name or name.endswith("bias"):
                parameter.add_(torch.randn_like(parameter) * 0.1)
    module.save_pretrained(folder, save_original_format=not fused)
    return module


def _tensors(folder) -> dict[str, np.ndarray]:
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def _logits(folder) -> np.ndarray:
    module = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return module(torch.from_numpy(TOKENS)).logits.numpy()


def _cli(args: list[str]) -> str:
    from typer.testing import CliRunner

    from suture.cli import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return result.output


def test_tunix_recipes_are_listed():
    names = families.recipe_names()
    for name in ("llama3:tunix", "qwen3:tunix", "qwen2.5:tunix", "qwen3-moe:tunix"):
        assert name in names
        assert families.get_recipe(name).name == name
    assert "qwen3:tunix " in _cli(["recipes"])


@pytest.mark.parametrize("model", sorted(MODELS))
def test_round_trip_is_bit_identical(tmp_path, model):
    _save_model(model, tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "tunix", _recipe(model), progress=False)
    ckpt = suture.open(tmp_path / "tunix")
    assert "step" not in ckpt.paths()  # the tree of nnx.state(model): no root, no step
    for path, shape in SHAPES.get(model, SHAPES["*"]).items():
        assert ckpt[path].shape == shape, path
    assert ("lm_head/w" in ckpt.paths()) == (model in ("llama3", "qwen3", "qwen2.5", "qwen3-moe"))
    convert_with_recipe(
        tmp_path / "tunix", tmp_path / "back", _recipe(model), reverse=True, progress=False
    )
    original, back = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert sorted(original) == sorted(back)
    for name, value in original.items():
        assert back[name].dtype == value.dtype and np.array_equal(back[name], value), name


def test_qwen25_biases_stay_flat(tmp_path):
    _save_model("qwen2.5", tmp_path / "hf")
    convert_with_recipe(tmp_path / "hf", tmp_path / "tunix", "qwen2.5:tunix", progress=False)
    ckpt = suture.open(tmp_path / "tunix")
    hf = _tensors(tmp_path / "hf")
    assert np.array_equal(
        ckpt["layers/1/attn/k_bias"].read(), hf["model.layers.1.self_attn.k_proj.bias"]
    )


def test_missing_tensor_is_an_error_naming_it(tmp_path):
    _save_model("qwen3", tmp_path / "hf")
    tensors = _tensors(tmp_path / "hf")
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    from safetensors.numpy import save_file

    save_file(tensors, tmp_path / "hf" / "model.safetensors")
    with pytest.raises(
        suture.SurgeryError,
        match=r"holds 1 \('model\.layers\.N\.self_attn\.k_norm\.weight' for N = 0\)",
    ):
        convert_with_recipe(tmp_path / "hf", tmp_path / "tunix", "qwen3:tunix", progress=False)


# Qwen3-MoE: experts stacked per layer, from either of transformers' expert layouts ------------


@pytest.mark.parametrize("fused", [False, True], ids=["per-expert", "fused"])
def test_qwen3_moe_experts_stack_on_axis_0_from_either_layout_and_go_back_as_they_came(
    tmp_path, fused
):
    _save_model("qwen3-moe", tmp_path / "per-expert")
    _save_model("qwen3-moe", tmp_path / "hf", fused=fused)
    convert_with_recipe(tmp_path / "hf", tmp_path / "tunix", "qwen3-moe:tunix", progress=False)
    ckpt = suture.open(tmp_path / "tunix")
    assert ckpt.custom_metadata["suture.family"]["experts"] == ("fused" if fused else "per-expert")
    hf = _tensors(tmp_path / "per-expert")
    for layer in range(2):
        mlp = f"model.layers.{layer}.mlp"
        router = ckpt[f"layers/{layer}/mlp/router/kernel"].read()
        np.testing.assert_array_equal(router, hf[f"{mlp}.gate.weight"].T)
        for name in ("gate_proj", "up_proj", "down_proj"):
            stacked = ckpt[f"layers/{layer}/mlp/{name}"].read()
            for expert in range(4):
                per_expert = hf[f"{mlp}.experts.{expert}.{name}.weight"].T
                np.testing.assert_array_equal(stacked[expert], per_expert)
    convert_with_recipe(
        tmp_path / "tunix", tmp_path / "back", "qwen3-moe:tunix", reverse=True, progress=False
    )
    original, back = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert sorted(original) == sorted(back)  # the layout the source had
    for name, value in original.items():
        assert back[name].dtype == value.dtype and np.array_equal(back[name], value), name


def test_qwen3_moe_goes_back_in_the_layout_the_like_folder_shows(tmp_path):
    model = _save_model("qwen3-moe", tmp_path / "hf")
    _save_model("qwen3-moe", tmp_path / "fused", fused=True)
    convert_with_recipe(tmp_path / "hf", tmp_path / "tunix", "qwen3-moe:tunix", progress=False)
    convert_with_recipe(
        tmp_path / "tunix",
        tmp_path / "back",
        "qwen3-moe:tunix",
        reverse=True,
        like=tmp_path / "fused",
        progress=False,
    )
    fused, back = _tensors(tmp_path / "fused"), _tensors(tmp_path / "back")
    assert sorted(back) == sorted(fused)
    assert "model.layers.1.mlp.experts.gate_up_proj" in back
    for name, value in fused.items():
        assert np.array_equal(back[name], value), name
    reloaded = type(model).from_pretrained(tmp_path / "back")
    for (name, ours), theirs in zip(
        model.state_dict().items(), reloaded.state_dict().values(), strict=True
    ):
        assert torch.equal(ours, theirs), name


@pytest.mark.parametrize(
    ("fused", "missing", "message"),
    [
        (
            False,
            "model.layers.1.mlp.experts.2.up_proj.weight",
            r"needs tensor 'model\.layers\.1\.mlp\.experts\.2\.up_proj\.weight' for "
            r"'layers/1/mlp/up_proj', which the checkpoint lacks",
        ),
        (
            True,
            "model.layers.1.mlp.experts.down_proj",
            r"holds 1 \('model\.layers\.N\.mlp\.experts\.down_proj' for N = 0\)",
        ),
    ],
    ids=["per-expert", "fused"],
)
def test_a_missing_expert_tensor_is_an_error_naming_it(tmp_path, fused, missing, message):
    from safetensors.numpy import save_file

    _save_model("qwen3-moe", tmp_path / "hf", fused=fused)
    tensors = _tensors(tmp_path / "hf")
    del tensors[missing]
    save_file(tensors, tmp_path / "hf" / "model.safetensors")
    with pytest.raises(suture.SurgeryError, match=message):
        convert_with_recipe(tmp_path / "hf", tmp_path / "tunix", "qwen3-moe:tunix", progress=False)
    assert not (tmp_path / "tunix").exists()


def test_a_tunix_moe_state_missing_or_short_of_experts_is_an_error_naming_the_leaf(tmp_path):
    _save_model("qwen3-moe", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    recipe = families.get_recipe("qwen3-moe:tunix")
    state = recipe.to_target(suture.open(tmp_path / "hf", separator=".").tree, config)
    flat = suture.flatten(state)
    short = {**flat, "layers/1/mlp/up_proj": flat["layers/1/mlp/up_proj"][:3]}
    with pytest.raises(
        suture.SurgeryError,
        match=r"Tunix leaf 'layers/1/mlp/up_proj' has shape \(3, 64, 24\); expected 4 experts",
    ):
        recipe.to_hf(suture.unflatten(short), config)
    del flat["layers/1/mlp/up_proj"]
    with pytest.raises(
        suture.SurgeryError, match=r"2 layers, .*holds 1 \('layers/N/mlp/up_proj' for N = 0\)"
    ):
        recipe.to_hf(suture.unflatten(flat), config)


def test_qwen3_moe_without_renormalized_routing_is_refused_naming_the_field(tmp_path):
    """Tunix's MoELayer divides the top-k routing weights by their sum whatever the config
    says; a model that does not (norm_topk_prob false, transformers' default) would compute
    otherwise there."""
    _save_model("qwen3-moe", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    with pytest.raises(families.ConfigMismatchError, match="'norm_topk_prob' is False"):
        convert_with_recipe(
            tmp_path / "hf",
            tmp_path / "tunix",
            "qwen3-moe:tunix",
            config={**config, "norm_topk_prob": False},
            progress=False,
        )


def test_recipes_shows_the_moe_table(tmp_path):
    _save_model("qwen3-moe", tmp_path / "hf")
    shown = _cli(["recipes", "qwen3-moe:tunix", "--config", str(tmp_path / "hf" / "config.json")])
    assert "Follows google-tunix 0.1.7 tunix/models/qwen3/params.py" in shown
    row = next(line for line in shown.splitlines() if "layers/{layer}/mlp/up_proj " in line)
    assert "model.layers.{layer}.mlp.experts.{expert}.up_proj.weight" in row
    assert "experts on axis 0, or fused model.layers.{layer}.mlp.experts.gate_up_proj part 1" in row


def _write_like_checkpoint_manager(root, tree: dict, step: int) -> None:
    """What Tunix's CheckpointManager writes: the `model_params` item of an Orbax
    CheckpointManager, each variable wrapped as {'value': ...}."""
    import orbax.checkpoint as ocp

    from suture._paths import unflatten

    wrapped = unflatten({f"{path}/value": value for path, value in tree.items()})
    manager = ocp.CheckpointManager(
        root, item_handlers={"model_params": ocp.PyTreeCheckpointHandler()}
    )
    manager.save(step, args=ocp.args.Composite(model_params=ocp.args.PyTreeSave(wrapped)))
    manager.wait_until_finished()
    manager.close()


def test_exports_the_latest_step_with_the_original_side_files(tmp_path):
    _save_model("qwen3", tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer_config.json").write_text('{"model_max_length": 64}\n')
    convert_with_recipe(tmp_path / "hf", tmp_path / "tunix", "qwen3:tunix", progress=False)
    tree = {p: np.asarray(a.read()) for p, a in suture.open(tmp_path / "tunix").arrays().items()}
    _write_like_checkpoint_manager(tmp_path / "run", tree, step=2)
    tree["embedder/input_embedding"] = tree["embedder/input_embedding"] * np.float32(2)
    _write_like_checkpoint_manager(tmp_path / "run", tree, step=5)
    _cli(
        [
            "convert",
            str(tmp_path / "run"),
            str(tmp_path / "out"),
            "--recipe",
            "qwen3:tunix",
            "--reverse",
            "--like",
            str(tmp_path / "hf"),
            "--no-progress",
        ]
    )
    out = _tensors(tmp_path / "out")
    expected = _tensors(tmp_path / "hf")["model.embed_tokens.weight"] * np.float32(2)
    assert np.array_equal(out["model.embed_tokens.weight"], expected)  # step 5, the latest
    assert (tmp_path / "out" / "tokenizer_config.json").read_text() == '{"model_max_length": 64}\n'
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "qwen3"
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")


def test_like_and_lora_alpha_go_with_the_way_back(tmp_path):
    _save_model("qwen3", tmp_path / "hf")
    with pytest.raises(suture.SurgeryError, match="goes with reverse=True"):
        suture.convert(tmp_path / "hf", tmp_path / "o", recipe="qwen3:tunix", like=tmp_path / "hf")
    with pytest.raises(suture.SurgeryError, match="goes with a FAMILY:tunix recipe"):
        suture.convert(tmp_path / "hf", tmp_path / "o", recipe="qwen3:maxtext", lora_alpha=8.0)
    assert not (tmp_path / "o").exists()


def test_lora_merge_is_tunix_formula():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 16, 64)).astype(np.float32)  # an o_proj (heads, head_dim, embed)
    a = rng.standard_normal((4, 16, 2)).astype(np.float32)
    b = rng.standard_normal((2, 64)).astype(np.float32)
    tree = {"o": {"w": {"value": w}, "w_lora_a": {"value": a}, "w_lora_b": {"value": b}}}
    merged = merged_lora(tree, lora_alpha=8.0)
    assert sorted(merged) == ["o/w"]
    # tunix/models/safetensors_saver.py: (a @ b) * (alpha / rank), then added in w's dtype
    delta = (a.reshape(64, 2) @ b.reshape(2, 64)) * (8.0 / 2)
    np.testing.assert_allclose(merged["o/w"].read(), w + delta.reshape(w.shape), rtol=1e-6)


def test_lora_merge_refuses_what_it_cannot_merge():
    w, a, b = np.ones((3, 2), np.float32), np.ones((3, 1), np.float32), np.ones((1, 2), np.float32)
    with pytest.raises(suture.SurgeryError, match="--lora-alpha"):
        merged_lora({"q/w": w, "q/w_lora_a": a, "q/w_lora_b": b})
    with pytest.raises(suture.SurgeryError, match="'q/w_lora_a' has no partner"):
        merged_lora({"q/w": w, "q/w_lora_a": a}, lora_alpha=1.0)
    with pytest.raises(suture.SurgeryError, match="only the adapters.*--like"):
        merged_lora({"q/w_lora_a": a, "q/w_lora_b": b}, lora_alpha=1.0)
    with pytest.raises(suture.SurgeryError, match=r"do not give the weight's shape \(3, 2\)"):
        merged_lora({"q/w": w, "q/w_lora_a": a, "q/w_lora_b": b.T}, lora_alpha=1.0)


# With Tunix itself ---------------------------------------------------------------------------


@needs_tunix
def test_suture_shards_as_tunix_does_on_the_models_mesh(tmp_path):
    """Tunix's loader places each leaf by the sharding its nnx.Param declares; so does
    suture.nnx.load_into (each process reading only its shards) on an (fsdp, tp) mesh."""
    _save_model("qwen3", tmp_path / "hf")
    tunix_env.run_worker("load", "qwen3", tmp_path / "hf", tmp_path / "out", "2x2", devices=4)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["differ"] == [] and report["placed_differently"] == []
    assert report["sharded"] == report["leaves"] == 25


@needs_tunix
def test_the_families_page_tunix_block_runs_and_its_model_runs_on_its_mesh(tmp_path):
    """docs/families.md's `load_into` block, as pasted (a tiny model's folder and config in
    place of Qwen3-0.6B's): its mesh has Auto axes, so the model's forward pass runs."""
    _save_model("qwen3", tmp_path / "hf")
    tunix_env.run_worker("docs", tmp_path / "hf", tmp_path / "logits.npy")
    got, expected = np.load(tmp_path / "logits.npy"), _logits(tmp_path / "hf")
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@needs_tunix
@pytest.mark.parametrize("model", sorted(MODELS))
def test_tunix_loader_and_suture_load_identical_leaves(tmp_path, model):
    _save_model(model, tmp_path / "hf")
    tunix_env.run_worker("load", _recipe(model).split(":")[0], tmp_path / "hf", tmp_path / "out")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["differ"] == [] and report["leaves"] == report["ours"] > 0
    got, expected = np.load(tmp_path / "out" / "logits.npy"), _logits(tmp_path / "hf")
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@needs_tunix
def test_a_folder_mixing_bfloat16_and_float32_loads_as_tunix_original_mode_does(tmp_path):
    """Tunix's default loader reads every tensor with the first one's dtype and fails on such
    a folder; its "original" mode and suture give the same float32 model."""
    import ml_dtypes
    from safetensors.numpy import save_file

    _save_model("qwen3", tmp_path / "hf")
    tensors = _tensors(tmp_path / "hf")
    mixed = {k: v if "norm" in k else v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()}
    save_file(mixed, tmp_path / "hf" / "model.safetensors")
    tunix_env.run_worker("mixed", "qwen3", tmp_path / "hf", tmp_path / "report.json")
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["tunix_default"].startswith("ValueError: cannot reshape")
    assert report["differ"] == [] and report["leaves"] == 25


@needs_tunix
def test_a_tunix_model_that_does_not_fit_the_folder_is_an_error_naming_each_leaf(tmp_path):
    _save_model("qwen3", tmp_path / "hf")
    tunix_env.run_worker("mismatch", "qwen3", tmp_path / "hf", tmp_path / "error.txt")
    error = (tmp_path / "error.txt").read_text()
    assert error.startswith("SurgeryError: The surgery has 6 problems")
    assert (
        "'layers/1/mlp/gate_proj/kernel': the target wants shape (64, 128), the result has (64, 96)"
        in error
    )


@needs_tunix
@pytest.mark.parametrize("how", ["edited", "lora", "sft"])
def test_tunix_checkpoint_exports_to_transformers(tmp_path, how):
    """edited: the whole model, its embedding doubled, saved by Tunix's CheckpointManager;
    lora: the same with qwix LoRA adapters (random factors) beside the weights; sft: three
    LoRA SFT steps of Tunix's PeftTrainer, which saves the adapters alone, so the base
    weights come from --like."""
    _save_model("qwen3", tmp_path / "hf")
    if how == "sft":
        tunix_env.run_worker("sft", "qwen3", tmp_path / "hf", tmp_path / "run", "4", "8.0")
    else:
        extra = ["4", "8.0"] if how == "lora" else []
        tunix_env.run_worker("save", "qwen3", tmp_path / "hf", tmp_path / "run", *extra)
    _cli(
        [
            "convert",
            str(tmp_path / "run"),
            str(tmp_path / "out"),
            "--recipe",
            "qwen3:tunix",
            "--reverse",
            "--like",
            str(tmp_path / "hf"),
            *(["--lora-alpha", "8"] if how != "edited" else []),
            "--no-progress",
        ]
    )
    expected = np.load(tmp_path / "run" / "logits.npy")
    got = _logits(tmp_path / "out")
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    assert np.abs(got - _logits(tmp_path / "hf")).max() > 1e-2  # the weights did change
    assert sorted(_tensors(tmp_path / "out")) == sorted(_tensors(tmp_path / "hf"))


@needs_tunix
def test_suture_reads_fused_experts_into_the_model_tunix_loads_from_per_expert_ones(tmp_path):
    """Tunix's loader reads one tensor per expert only; suture reads transformers' fused
    layout into the same leaves."""
    _save_model("qwen3-moe", tmp_path / "hf")
    _save_model("qwen3-moe", tmp_path / "fused", fused=True)
    tunix_env.run_worker(
        "load", "qwen3-moe", tmp_path / "hf", tmp_path / "out", "", tmp_path / "fused"
    )
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["differ"] == [] and report["leaves"] == report["ours"] == 27
    got, expected = np.load(tmp_path / "out" / "logits.npy"), _logits(tmp_path / "fused")
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


@needs_tunix
@pytest.mark.parametrize(
    ("how", "like"), [("edited", "per-expert"), ("lora", "fused")], ids=["edited", "lora-fused"]
)
def test_tunix_moe_checkpoint_exports_to_transformers_in_the_like_layout(tmp_path, how, like):
    """A Qwen3-MoE Tunix loaded and saved with its CheckpointManager (its embedding doubled;
    lora: with qwix adapters on the attention) goes back in the expert layout of --like."""
    _save_model("qwen3-moe", tmp_path / "per-expert")
    _save_model("qwen3-moe", tmp_path / "fused", fused=True)
    extra = ["4", "8.0"] if how == "lora" else []
    tunix_env.run_worker("save", "qwen3-moe", tmp_path / "per-expert", tmp_path / "run", *extra)
    _cli(
        [
            "convert",
            str(tmp_path / "run"),
            str(tmp_path / "out"),
            "--recipe",
            "qwen3-moe:tunix",
            "--reverse",
            "--like",
            str(tmp_path / like),
            *(["--lora-alpha", "8"] if how == "lora" else []),
            "--no-progress",
        ]
    )
    assert sorted(_tensors(tmp_path / "out")) == sorted(_tensors(tmp_path / like))
    got = _logits(tmp_path / "out")
    np.testing.assert_allclose(got, np.load(tmp_path / "run" / "logits.npy"), atol=1e-5, rtol=0)
    assert np.abs(got - _logits(tmp_path / like)).max() > 1e-2  # the weights did change


@needs_tunix
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("family", ["qwen3", "qwen3-moe"])
def test_tunix_peft_trainer_adapters_export_to_a_peft_folder_peft_serves(tmp_path, family):
    """Three LoRA SFT steps of Tunix's PeftTrainer (qwix, alpha 8, adapters saved alone):
    the adapter-only export, loaded by peft on the transformers base, gives the Tunix
    model's logits."""
    peft = pytest.importorskip("peft")
    _save_model(family, tmp_path / "hf")
    tunix_env.run_worker("sft", family, tmp_path / "hf", tmp_path / "run", "4", "8.0")
    _cli(
        [
            "convert",
            str(tmp_path / "run"),
            str(tmp_path / "adapter"),
            "--recipe",
            f"{family}:tunix",
            "--reverse",
            "--adapter-only",
            "--like",
            str(tmp_path / "hf"),
            "--lora-alpha",
            "8",
            "--no-progress",
        ]
    )
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 8)
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    served = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    lora_b = served.base_model.model.model.layers[1].self_attn.o_proj.lora_B["default"].weight
    assert float(lora_b.abs().max()) > 0  # peft loaded the factors (not left at zero)
    with torch.no_grad():
        got = served(torch.from_numpy(TOKENS)).logits.numpy()
    expected = np.load(tmp_path / "run" / "logits.npy")
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=0)
    assert np.abs(got - _logits(tmp_path / "hf")).max() > 1e-3  # the adapters do change it
