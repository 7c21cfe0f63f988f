"""MaxText's own converter beside suture's recipes for Qwen2.5, Qwen3-MoE, Mixtral, DeepSeek-V3, gpt-oss, Gemma 3, OLMo 3, DeepSeek-V2 and V3.2, Qwen3-Next, Qwen3.5, Gemma 4, Gemma 4 E2B/E4B and Kimi K2-Thinking (bench/families.py).

For each family, one random HF folder made with transformers (float32, narrow, but with the
layer and expert counts of MaxText's built-in HF config for the model name, which its converter
maps names from, unless the family's settings change that config) is converted scanned and
unscanned by MaxText 0.2.5's ``to_maxtext`` and by ``suture convert --recipe
FAMILY:maxtext[-unscanned]``; the two trees are compared leaf by leaf. Then MaxText's own model
restores suture's scanned output of each family in ``LOGITS`` through ``load_parameters_path``
and its logits are set beside transformers'.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from datetime import date
from pathlib import Path

import numpy as np

from bench._common import BENCH_DIR, DATA_DIR, machine, write_section
from bench._maxtext import compare_trees, maxtext_command

WORK = DATA_DIR / "families-maxtext-moe"
MIB = 1024**2
NARROW = dict(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
# (suture family, MaxText model name, transformers class prefix, config, extra MaxText overrides);
# layer and expert counts are MaxText's (checkpoint_conversion/utils/hf_model_configs.py), the
# width is shrunk.
FAMILIES = [
    (
        "qwen2.5",
        "qwen2.5-7b",
        "Qwen2",
        dict(NARROW, intermediate_size=32, num_hidden_layers=28, rms_norm_eps=1e-6),
        [],
    ),
    (
        "qwen3-moe",
        "qwen3-30b-a3b",
        "Qwen3Moe",
        dict(
            NARROW,
            head_dim=16,
            intermediate_size=32,
            moe_intermediate_size=32,
            num_hidden_layers=48,
            num_experts=128,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_theta": 10_000_000.0, "rope_type": "default"},
        ),
        [],
    ),
    (
        "mixtral",
        "mixtral-8x7b",
        "Mixtral",
        dict(
            NARROW,
            intermediate_size=32,
            num_hidden_layers=32,
            num_local_experts=8,
            num_experts_per_tok=2,
            rope_parameters={"rope_theta": 1e6, "rope_type": "default"},
        ),
        [],
    ),
    (
        # MaxText's deepseek3-671b does not convert (see the note); deepseek2-16b with V3's
        # settings gives the tree MaxText's loader expects.
        "deepseek3",
        "deepseek2-16b",
        "DeepseekV3",
        dict(
            NARROW,
            num_key_value_heads=4,
            intermediate_size=32,
            moe_intermediate_size=16,
            num_hidden_layers=27,
            first_k_dense_replace=1,
            n_routed_experts=64,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
        ),
        [
            "base_num_kv_heads=4",
            "base_moe_mlp_dim=16",
            "base_num_decoder_layers=27",
            "first_num_dense_layers=1",
            "num_experts=64",
            "num_experts_per_tok=2",
            "shared_experts=1",
            "routed_score_func=sigmoid",
            "routed_bias=true",
            "routed_scaling_factor=2.5",
            "q_lora_rank=32",
            "kv_lora_rank=16",
            "qk_nope_head_dim=16",
            "qk_rope_head_dim=8",
            "v_head_dim=16",
        ],
    ),
    (
        "gpt-oss",
        "gpt-oss-20b",
        "GptOss",
        dict(
            NARROW,
            head_dim=16,
            intermediate_size=32,
            num_hidden_layers=24,
            num_local_experts=32,
            num_experts_per_tok=4,
            sliding_window=16,
        ),
        [],
    ),
    (
        # a multimodal folder (names as transformers v5 and MaxText's mapping write them),
        # Gemma 3's vocabulary of 262208 rows against MaxText's 262144
        "gemma3",
        "gemma3-4b",
        "Gemma3",
        dict(
            NARROW,
            vocab_size=262208,
            intermediate_size=32,
            num_hidden_layers=34,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=16,
            rms_norm_eps=1e-6,
        ),
        ["vocab_size=262144"],
    ),
    (
        # two cycles of 3 sliding layers and 1 full; the launcher sets MaxText's HF config
        # (32 layers) to 8
        "olmo3",
        "olmo3-7b",
        "Olmo3",
        dict(
            NARROW, intermediate_size=32, num_hidden_layers=8, sliding_window=4, rms_norm_eps=1e-6
        ),
        ["base_num_decoder_layers=8", "hf_config.num_hidden_layers=8"],
    ),
    (
        # V2-Lite: the first layer dense, 64 routed experts (6 per token), 2 shared, no query LoRA
        "deepseek2",
        "deepseek2-16b",
        "DeepseekV2",
        dict(
            NARROW,
            num_key_value_heads=4,
            intermediate_size=32,
            moe_intermediate_size=16,
            num_hidden_layers=27,
            first_k_dense_replace=1,
            n_routed_experts=64,
            n_shared_experts=2,
            num_experts_per_tok=6,
            routed_scaling_factor=1.0,
            q_lora_rank=None,
            kv_lora_rank=16,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
        ),
        [
            "base_num_kv_heads=4",
            "q_lora_rank=0",
            "kv_lora_rank=16",
            "qk_nope_head_dim=16",
            "qk_rope_head_dim=8",
            "v_head_dim=16",
        ],
    ),
    (
        # V3's settings on deepseek2-16b's counts, as for deepseek3, with the sparse-attention
        # indexer (16 heads of 16, 8 of the 16 tokens of the logits run chosen by top-k; with
        # few heads, scores of exactly 0, where every head's ReLU is, tie at the cut and
        # MaxText (first by position) and transformers (torch.topk) break ties differently);
        # MaxText runs its indexer only with attention=dot_product
        "deepseek3.2",
        "deepseek2-16b",
        "DeepseekV32",
        dict(
            NARROW,
            num_key_value_heads=4,
            intermediate_size=32,
            moe_intermediate_size=16,
            num_hidden_layers=27,
            first_k_dense_replace=1,
            n_routed_experts=64,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=1,
            topk_group=1,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            index_n_heads=16,
            index_head_dim=16,
            index_topk=8,
        ),
        [
            "base_num_kv_heads=4",
            "num_experts=64",
            "num_experts_per_tok=2",
            "shared_experts=1",
            "routed_score_func=sigmoid",
            "routed_bias=true",
            "routed_scaling_factor=2.5",
            "q_lora_rank=32",
            "kv_lora_rank=16",
            "qk_nope_head_dim=16",
            "qk_rope_head_dim=8",
            "v_head_dim=16",
            "use_indexer=true",
            "indexer_n_heads=16",
            "indexer_head_dim=16",
            "indexer_topk=8",
            "attention=dot_product",
        ],
    ),
    (
        # two cycles of 3 Gated DeltaNet layers and 1 full-attention layer; the launcher sets
        # MaxText's HF config (48 layers, 512 experts) to 8 layers and 16 experts
        "qwen3-next",
        "qwen3-next-80b-a3b",
        "Qwen3Next",
        dict(
            NARROW,
            head_dim=16,
            intermediate_size=32,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_hidden_layers=8,
            num_experts=16,
            num_experts_per_tok=2,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            rms_norm_eps=1e-6,
        ),
        [
            "base_num_decoder_layers=8",
            "hf_config.num_hidden_layers=8",
            "num_experts=16",
            "hf_config.num_experts=16",
            "num_experts_per_tok=2",
            "gdn_key_head_dim=16",
            "gdn_value_head_dim=16",
            "gdn_num_key_heads=2",
            "gdn_num_value_heads=4",
        ],
    ),
    (
        # the published layout: the multimodal folder (language model under
        # model.language_model., a one-layer vision tower) with fused experts; two cycles of 3
        # Gated DeltaNet layers and 1 full-attention layer; the launcher sets MaxText's HF
        # config (40 layers) to 8
        "qwen3.5",
        "qwen3.5-35b-a3b",
        "Qwen3_5Moe",
        dict(
            NARROW,
            head_dim=16,
            intermediate_size=32,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_hidden_layers=8,
            num_experts=16,
            num_experts_per_tok=2,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            rms_norm_eps=1e-6,
        ),
        [
            "base_num_decoder_layers=8",
            "hf_config.text_config.num_hidden_layers=8",
            # its hooks regroup in_proj_qkvz / in_proj_ba by its HF config's head counts
            "hf_config.text_config.linear_num_key_heads=2",
            "hf_config.text_config.linear_num_value_heads=4",
            "hf_config.text_config.linear_key_head_dim=16",
            "hf_config.text_config.linear_value_head_dim=16",
            "num_experts=16",
            "num_experts_per_tok=2",
            "gdn_key_head_dim=16",
            "gdn_value_head_dim=16",
            "gdn_num_key_heads=2",
            "gdn_num_value_heads=4",
            # text only, every position stream alike: MaxText's plain rotary embedding (its
            # mrope_section is sized for head_dim 256 and refuses this one's)
            "use_mrope=false",
        ],
    ),
    (
        # Gemma 4 26B-A4B's counts (30 layers: five blocks of 5 local + 1 global; 128 experts,
        # 8 per token) in a multimodal folder with a one-layer vision tower; global layers with
        # head size 32 and one KV head, keys = values. MaxText's converter scales the
        # embedding by its HF config's sqrt(hidden_size): the launcher sets that to 64.
        "gemma4",
        "gemma4-26b",
        "Gemma4",
        dict(
            NARROW,
            intermediate_size=32,
            num_hidden_layers=30,
            head_dim=16,
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            hidden_size_per_layer_input=0,
            enable_moe_block=True,
            num_experts=128,
            top_k_experts=8,
            moe_intermediate_size=16,
            final_logit_softcapping=30.0,
            sliding_window=1024,
        ),
        [
            "global_head_dim=32",
            "global_num_kv_heads=1",
            "num_experts=128",
            "num_experts_per_tok=8",
            "hf_config.text_config.hidden_size=64",
        ],
    ),
    (
        # Gemma 4 31B's counts (60 layers, dense), as gemma4-26b's otherwise
        "gemma4",
        "gemma4-31b",
        "Gemma4",
        dict(
            NARROW,
            intermediate_size=32,
            num_hidden_layers=60,
            head_dim=16,
            global_head_dim=32,
            num_global_key_value_heads=1,
            attention_k_eq_v=True,
            hidden_size_per_layer_input=0,
            final_logit_softcapping=30.0,
            sliding_window=1024,
        ),
        ["global_head_dim=32", "global_num_kv_heads=1", "hf_config.text_config.hidden_size=64"],
    ),
]
# Gemma 4 E2B and E4B: MaxText's counts (35 and 42 layers, the last 20 and 18 reusing earlier
# layers' keys and values; E2B's cycle 4 sliding + 1 full with double-width MLPs in the shared
# layers, E4B's 5 + 1), multimodal folders with a one-layer vision tower as published (MaxText's
# mapping reads model.language_model.*); the launcher narrows its converter's HF config's hidden
# size (which its embedding scale reads) to the folder's. MaxText has them unscanned only.
_GEMMA4_SMALL = dict(
    NARROW,
    head_dim=16,
    global_head_dim=32,
    intermediate_size=32,
    hidden_size_per_layer_input=8,
    vocab_size_per_layer_input=256,
    sliding_window=16,
    final_logit_softcapping=30.0,
)
_GEMMA4_SMALL_MAXTEXT = [
    "global_head_dim=32",
    "hidden_size_per_layer_input=8",
    "vocab_size_per_layer_input=256",
    "hf_config.text_config.hidden_size=64",
]
FAMILIES += [
    (
        "gemma4-small",
        "gemma4-e2b",
        "Gemma4",
        dict(
            _GEMMA4_SMALL,
            num_hidden_layers=35,
            num_kv_shared_layers=20,
            use_double_wide_mlp=True,
            layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7,
        ),
        _GEMMA4_SMALL_MAXTEXT,
    ),
    (
        "gemma4-small",
        "gemma4-e4b",
        "Gemma4",
        dict(
            _GEMMA4_SMALL,
            num_hidden_layers=42,
            num_kv_shared_layers=18,
            use_double_wide_mlp=False,
            layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 7,
        ),
        _GEMMA4_SMALL_MAXTEXT,
    ),
]
UNSCANNED_ONLY = {"gemma4-small"}  # MaxText's gemma4_small refuses scan_layers
# Kimi K2-Thinking as published: V3's architecture on deepseek2-16b's counts as for deepseek3,
# bfloat16, the routed experts packed INT4 (group 32: experts 32 wide); MaxText's side is its
# own INT4 dequantizer, then its converter (`_kimi_int4`), saving bfloat16.
_V3 = next(family for family in FAMILIES if family[0] == "deepseek3")
FAMILIES.append(
    (
        "kimi-k2",
        "deepseek2-16b",
        "KimiInt4",
        dict(_V3[3], moe_intermediate_size=32),
        [
            *(item for item in _V3[4] if not item.startswith("base_moe_mlp_dim=")),
            "base_moe_mlp_dim=32",
        ],
    )
)
# DeepSeek-V4-Flash's architecture narrowed: 7 layers (2 sliding-window, then CSA on even and
# HCA on odd layers; the first 3 hash-routed), 8 experts, 4 query heads of 32 and one KV head,
# hyper-connections of 4; in the published tensor names, which MaxText's mapping reads (the
# launcher sets its converter's HF config, 43 layers, to 7)
FAMILIES.append(
    (
        "deepseek4",
        "deepseek4-284b",
        "DeepseekV4",
        dict(
            NARROW,
            num_key_value_heads=1,
            head_dim=32,
            intermediate_size=32,
            num_hidden_layers=7,
            n_routed_experts=8,
            num_experts_per_tok=2,
            q_lora_rank=16,
            o_groups=2,
            o_lora_rank=16,
            index_n_heads=4,
            index_head_dim=16,
            index_topk=4,
            sliding_window=8,
            hc_mult=4,
            compress_ratios=[0, 0, 4, 128, 4, 128, 4],
            qk_rope_head_dim=8,
            num_hash_layers=3,
        ),
        [
            "head_dim=32",
            "base_num_decoder_layers=7",
            "hf_config.num_hidden_layers=7",
            "num_experts=8",
            "num_experts_per_tok=2",
            "q_lora_rank=16",
            "o_groups=2",
            "o_lora_rank=16",
            "indexer_head_dim=16",
            "indexer_n_heads=4",
            "indexer_topk=4",
            "qk_rope_head_dim=8",
            "sliding_window_size=8",
            "attention=dot_product",  # MaxText's DeepSeek4 refuses the CPU's default attention
        ],
    )
)
MAXTEXT_DEQUANTIZES = {"kimi-k2"}  # MaxText converts the folder its own dequantizer writes
SAVE_DTYPE = {"kimi-k2": "bfloat16"}  # as published; MaxText's dequantizer gives bfloat16
# Families whose scanned suture output MaxText's model runs, with the settings its forward pass
# adds: the HF models here have plain rotary embeddings where MaxText's configs have YaRN
# (DeepSeek keeps YaRN with a factor of 1: only MaxText's YaRN embedding rotates the interleaved
# pairs DeepSeek's weights are laid out for; the attention's mscale is off when
# max_position_embeddings is the original's).
LOGITS = {
    "qwen3-moe": [],
    "mixtral": [],
    "olmo3": ["rope_type=default", "sliding_window_size=4"],
    "qwen3-next": ["rope_max_timescale=10000"],  # the HF model's rope_theta
    "qwen3.5": ["rope_max_timescale=10000"],
    "gemma4": [],
    "deepseek2": [
        "rope_factor=1",
        "max_position_embeddings=4096",
        "original_max_position_embeddings=4096",
    ],
    "deepseek4": [],  # plain rotary embeddings, as deepseek4-284b's configs and the HF model here
    "deepseek3.2": [
        "rope_factor=1",
        "max_position_embeddings=4096",
        "original_max_position_embeddings=4096",
    ],
}


def generate(folder: Path, kind: str, config: dict) -> int:
    """A random transformers model of `kind` saved to `folder` (norms and biases perturbed); its bytes."""
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "KimiInt4":  # Kimi K2-Thinking as published: bfloat16, INT4 routed experts
        from bench import _kimi_int4

        model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**config))
        _perturbed(torch, model)
        model.to(torch.bfloat16).save_pretrained(folder.parent / "bf16")
        _kimi_int4.pack(folder.parent / "bf16", folder)
        shutil.rmtree(folder.parent / "bf16")
        return sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    if kind == "DeepseekV4":  # in the names DeepSeek publishes, which MaxText's mapping reads
        model = transformers.DeepseekV4ForCausalLM(transformers.DeepseekV4Config(**config))
        _perturbed(torch, model)
        with torch.no_grad():  # the hyper-connections' biases and the attention sinks too
            for name, parameter in model.named_parameters():
                if name.endswith((".base", "hc_base", ".sinks")):
                    parameter.add_(torch.randn_like(parameter) * 0.1)
        _deepseek4_published(model, folder)
        return sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    if kind == "Qwen3_5Moe":  # the multimodal model as published, fused experts
        vision = dict(
            depth=1,
            hidden_size=16,
            intermediate_size=24,
            num_heads=2,
            out_hidden_size=config["hidden_size"],
            patch_size=4,
            spatial_merge_size=2,
            temporal_patch_size=2,
        )
        model = transformers.Qwen3_5MoeForConditionalGeneration(
            transformers.Qwen3_5MoeConfig(text_config=config, vision_config=vision)
        )
        _perturbed(torch, model)
        model.save_pretrained(folder, save_original_format=False)
        return sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    if kind == "Gemma4":  # the multimodal model, with a one-layer vision tower, as published
        vision = dict(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=16,
            global_head_dim=16,
            patch_size=4,
            position_embedding_size=64,
        )
        model = transformers.Gemma4ForConditionalGeneration(
            transformers.Gemma4Config(text_config=config, vision_config=vision, audio_config=None)
        )
    elif kind == "Gemma3":  # the multimodal model, with a one-layer vision tower
        vision = transformers.SiglipVisionConfig(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=14,
        )
        model = transformers.Gemma3ForConditionalGeneration(
            transformers.Gemma3Config(
                text_config=config, vision_config=vision.to_dict(), mm_tokens_per_image=4
            )
        )
    elif kind == "Gemma4":  # the multimodal model, with a one-layer vision tower
        vision = transformers.Gemma4VisionConfig(
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=16,
            position_embedding_size=64,
        )
        model = transformers.Gemma4ForConditionalGeneration(
            transformers.Gemma4Config(text_config=config, vision_config=vision.to_dict())
        )
    else:
        model_class = getattr(transformers, f"{kind}ForCausalLM")
        model = model_class(getattr(transformers, f"{kind}Config")(**config))
    _perturbed(torch, model)
    model.save_pretrained(folder, save_original_format=kind not in ("Gemma3", "Gemma4"))
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def _deepseek4_published(model, folder: Path) -> None:
    """`model` saved in DeepSeek-V4's published names (transformers' save_pretrained keeps its
    own for a few: model.embed_tokens, model.layers, the attention's norm), the hash tables as
    int32 expert numbers, distinct in each row as a token's experts are (the two models add a
    repeated expert's weight differently)."""
    from safetensors.numpy import load_file, save_file

    saved = folder.parent / "saved"
    model.save_pretrained(saved)
    top = {
        "model.embed_tokens.weight": "embed.weight",
        "model.norm.weight": "norm.weight",
        "model.hc_head.hc_fn": "hc_head_fn",
        "model.hc_head.hc_base": "hc_head_base",
        "model.hc_head.hc_scale": "hc_head_scale",
    }
    tensors = {}
    rng = np.random.default_rng(0)
    for name, value in load_file(saved / "model.safetensors").items():
        name = top.get(name, name.replace("model.layers.", "layers.", 1))
        name = name.replace(".attn.norm.", ".attn.kv_norm.")
        if name.endswith("tid2eid"):
            order = np.argsort(rng.random((value.shape[0], model.config.n_routed_experts)), axis=1)
            value = order[:, : value.shape[1]].astype(np.int32)
        tensors[name] = value
    folder.mkdir(parents=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    shutil.copy(saved / "config.json", folder / "config.json")
    shutil.rmtree(saved)


def _perturbed(torch, model) -> None:
    """Norms and biases away from their initial ones and zeros, so that a mix-up shows."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or "bias" in name or "scale" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):  # Gemma 4's, saved with the weights
                buffer.add_(torch.randn_like(buffer) * 0.1)
        if type(model).__name__.startswith("Gemma4"):  # on bfloat16's grid: MaxText's tied
            table = model.get_input_embeddings().weight  # logits round the table to it
            table.copy_(table.to(torch.bfloat16).to(table.dtype))


def overrides(model_name: str, config: dict, extra: list[str]) -> list[str]:
    """MaxText config overrides that narrow its `model_name` to the HF `config`."""
    base = [
        f"model_name={model_name}",
        "override_model_config=True",
        f"base_emb_dim={config['hidden_size']}",
        f"base_num_query_heads={config['num_attention_heads']}",
        f"base_num_kv_heads={config['num_key_value_heads']}",
        f"head_dim={config['hidden_size'] // config['num_attention_heads']}",
        f"base_mlp_dim={config['intermediate_size']}",
        f"base_moe_mlp_dim={config.get('moe_intermediate_size', config['intermediate_size'])}",
        f"vocab_size={config['vocab_size']}",
        "sparse_matmul=False",  # the dense MoE path: megablox kernels need an accelerator
    ]
    named = {item.split("=", 1)[0] for item in extra}
    return [item for item in base if item.split("=", 1)[0] not in named] + extra


def compare(
    python: Path, *, timed: Callable[[list[str]], dict], only: list[str] | None = None
) -> None:
    """Runs the families named in `only` (all when None) and writes their section; a
    whole-model recipe named there (``gemma3:maxtext-multimodal``, ``gemma4:...``,
    ``qwen3-vl:...``, ``qwen3-omni``) runs in its own section."""
    from bench import _maxtext_multimodal, _maxtext_qwen3_omni, _maxtext_qwen3_vl

    if only is not None and set(only) & set(_maxtext_multimodal.RECIPES):
        whole = tuple(name for name in only if name in _maxtext_multimodal.RECIPES)
        _maxtext_multimodal.compare(python, timed=timed, recipes=whole)
        only = [name for name in only if name not in _maxtext_multimodal.RECIPES]
        if not only:
            return
    if only is not None and set(only) & set(_maxtext_qwen3_omni.RECIPES):
        _maxtext_qwen3_omni.compare(python, timed=timed)
        only = [name for name in only if name not in _maxtext_qwen3_omni.RECIPES]
        if not only:
            return
    if only is not None and set(only) & set(_maxtext_qwen3_vl.RECIPES):
        _maxtext_qwen3_vl.compare(python, timed=timed, only=only)
        only = [name for name in only if name not in _maxtext_qwen3_vl.RECIPES]
        if not only:
            return
    unknown = sorted(set(only or []) - {family[0] for family in FAMILIES})
    if unknown:
        raise SystemExit(f"unknown families {unknown}: choose among {[f[0] for f in FAMILIES]}")
    selected = [family for family in FAMILIES if only is None or family[0] in only]
    shutil.rmtree(WORK, ignore_errors=True)
    rows, findings, logits = [], [], []
    suture_cli = str(Path(sys.executable).with_name("suture"))
    try:
        for family, model_name, kind, config, extra in selected:
            hf = WORK / family / "hf"
            size = generate(hf, kind, config)
            maxtext_hf = hf
            if family in MAXTEXT_DEQUANTIZES:
                from bench import _kimi_int4

                maxtext_hf = WORK / family / "hf-maxtext"
                _kimi_int4.maxtext_dequantized(python, hf, maxtext_hf)
            for scanned in (False,) if family in UNSCANNED_ONLY else (True, False):
                layout = "maxtext" if scanned else "maxtext-unscanned"
                ours, theirs = WORK / family / f"suture-{layout}", WORK / family / f"mt-{layout}"
                suture_run = timed(
                    [suture_cli, "convert", str(hf), str(ours), "--recipe", f"{family}:{layout}"]
                    + ["--no-progress"]
                )
                command = maxtext_command(
                    python,
                    [*overrides(model_name, config, extra), f"scan_layers={scanned}"],
                    maxtext_hf,
                    theirs,
                    save_dtype=SAVE_DTYPE.get(family, "float32"),
                )
                try:
                    maxtext_run: dict | None = timed(command)
                except RuntimeError as error:
                    maxtext_run = None
                    last = [line for line in str(error).splitlines() if "Error" in line]
                    findings.append(
                        f"`{family}:{layout}` ({model_name}): MaxText's converter fails: "
                        f"`{(last or ['(no message)'])[-1].strip()}`"
                    )
                if maxtext_run is not None:
                    lines, _ = compare_trees(theirs / "0" / "items", ours)
                    findings.append(f"`{family}:{layout}` ({model_name}): " + "; ".join(lines))
                rows.append((family, layout, size, suture_run, maxtext_run, model_name))
                shutil.rmtree(theirs, ignore_errors=True)
            if family in LOGITS:
                settings = [*overrides(model_name, config, extra), *LOGITS[family]]
                twice = sum(entry[0] == family for entry in selected) > 1
                label = f"{family}` (`{model_name}`)" if twice else f"{family}`"
                logits.append(
                    (label, *logits_difference(python, settings, config, hf, WORK / family))
                )
            shutil.rmtree(WORK / family, ignore_errors=True)
        report(selected, only is not None, rows, findings, logits)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


def logits_difference(
    python: Path, settings: list[str], config: dict, hf: Path, work: Path
) -> tuple:
    """MaxText's model on suture's scanned output against transformers on the HF folder."""
    import torch
    import transformers

    tokens = np.random.default_rng(1).integers(0, config["vocab_size"], (2, 16)).astype(np.int32)
    np.save(work / "tokens.npy", tokens)
    done = subprocess.run(
        [
            str(python),
            "-P",
            str(BENCH_DIR / "_maxtext_logits.py"),
            str(work / "tokens.npy"),
            str(work / "logits.npy"),
            # the converter launcher's own settings are not MaxText's
            *(item for item in settings if not item.startswith("hf_config.")),
            "scan_layers=True",
            f"load_parameters_path={work / 'suture-maxtext'}",
            f"base_output_directory={work / 'run'}",
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"MaxText's forward pass failed:\n{done.stderr[-3000:]}")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model(torch.from_numpy(tokens).long()).logits.numpy()
    got = np.load(work / "logits.npy")
    return float(np.max(np.abs(got - expected))), float(np.max(np.abs(expected)))


# What the section says of a family that ran: how its model was set up, and what its rows show.
SETUP = {
    "gemma4-small": "Gemma 4 E2B/E4B: multimodal folders with a one-layer vision tower (left "
    "out), MaxText's layer counts (35 and 42, the last 20 and 18 sharing keys and values; E2B's "
    "cycle of 4 sliding + 1 full layer with double-width MLPs in the shared layers, E4B's 5 + 1), "
    "global layers with head_dim 32, per-layer inputs of 8; unscanned only, as MaxText has them "
    "(its converter's HF config narrowed to the folder's hidden size: "
    "`hf_config.text_config.hidden_size=64`).",
    "deepseek3": "DeepSeek-V3: V3's settings on `deepseek2-16b` (MaxText's `deepseek3-671b` "
    "does not convert, its router bias living in a collection the mapping never names).",
    "kimi-k2": "Kimi K2-Thinking: DeepSeek-V3's settings on `deepseek2-16b` as for DeepSeek-V3 "
    "(MaxText's converter has no Kimi model name; its `convert_deepseek_family_ckpt.py` does, and "
    "imports torch, which its environment here lacks), bfloat16 as published, each routed expert "
    "packed by compressed-tensors (INT4, a bfloat16 scale per 32 inputs; experts 32 wide). suture "
    "converts the packed folder in one pass; MaxText's side is its own route: each packed weight "
    "through its `dequantize_pack_quantized_int4` (its script's function, run under torch), "
    "written as a bfloat16 folder, then `to_maxtext` (`save_dtype=bfloat16`).",
    "gemma3": "Gemma 3: multimodal, with a one-layer vision tower and its real vocabulary of "
    "262208 rows.",
    "olmo3": "OLMo 3: 8 layers, two cycles of 3 sliding-window layers (window 4) and 1 full, "
    "where `olmo3-7b` has 32 (the launcher sets its converter's HF config to 8: "
    "`hf_config.num_hidden_layers=8`).",
    "qwen3.5": "Qwen3.5: the published layout (Qwen3_5MoeForConditionalGeneration with a "
    "one-layer vision tower, the language model under `model.language_model.`, fused experts); "
    "8 layers, two cycles of 3 Gated DeltaNet layers (2 key and 4 value heads of 16) and 1 "
    "full-attention layer; 16 routed experts (2 per token) and a shared expert, where "
    "`qwen3.5-35b-a3b` has 40 layers and 256 experts (the launcher sets its converter's HF "
    "text config, which its hooks take the layer count and linear-attention head counts from, "
    "to the folder's: `hf_config.text_config.num_hidden_layers=8`, ...).",
    "qwen3-next": "Qwen3-Next: 8 layers, two cycles of 3 Gated DeltaNet layers (2 key and 4 "
    "value heads of 16, conv kernel 4) and 1 full-attention layer; 16 routed experts (2 per "
    "token) and a shared expert, where `qwen3-next-80b-a3b` has 48 layers and 512 experts (the "
    "launcher sets its converter's HF config to 8 and 16).",
    "gemma4": "Gemma 4: multimodal folders with a one-layer vision tower (left out by both), "
    "the counts of `gemma4-26b` (30 layers, 128 experts, 8 per token, a shared expert) and "
    "`gemma4-31b` (60 layers, dense); global layers of head size 32 with 1 KV head, keys = "
    "values (no `v_proj`, no value kernel); the logits soft-capped at 30, as MaxText's configs; "
    "the launcher sets its converter's HF config's hidden size to 64, which its embedding hook "
    "scales by.",
    "deepseek4": "DeepSeek-V4: Flash's architecture narrowed to 7 layers (2 sliding-window, then "
    "CSA with its indexer on even and HCA on odd layers; the first 3 routed by hash), 8 experts "
    "(2 per token), 4 query heads of 32 and 1 KV head, query LoRA 16, 2 output groups of rank 16, "
    "hyper-connections of 4, in DeepSeek's published tensor names (which MaxText's mapping reads); "
    "`deepseek4-284b` with the sizes overridden (the launcher sets its converter's HF config to 7 "
    "layers) and `attention=dot_product`, which MaxText's DeepSeek4 needs on the CPU.",
    "deepseek2": "DeepSeek-V2: V2-Lite's counts, those of `deepseek2-16b` (27 layers, the first "
    "dense; 64 routed experts, 6 per token; 2 shared; no query LoRA); latent rank 16, 4 heads "
    "of 16 + 8 (rotary).",
    "deepseek3.2": "DeepSeek-V3.2: V3's settings on `deepseek2-16b`'s counts (MaxText's "
    "`deepseek3.2-671b` does not convert, for DeepSeek-V3's reason), with the sparse-attention "
    "indexer (`use_indexer=true`, 16 heads of 16, 8 rotary; top 8 of the 16 tokens of the "
    "forward pass, so that its mask is in play) and `attention=dot_product`, the one attention "
    "MaxText runs its indexer with on the CPU, for the converter too.",
}
NOTES = [
    (
        ("mixtral", "deepseek3", "deepseek2", "deepseek3.2", "kimi-k2"),
        "MaxText's scanned Mixtral and DeepSeek conversions stack the router (and DeepSeek's "
        "shared experts) on axis 0, `(layers, embed, experts)`, and its own checkpoint writer "
        "refuses that against the model's `(embed, layers, experts)`; suture writes the model's "
        "shapes, which MaxText's model loads in the run below.",
    ),
    (
        ("deepseek2",),
        "DeepSeek-V2's scanned conversion fails one step earlier, for the same reason: MaxText's "
        "converter stacks every leaf whose name holds `MoeBlock` on axis 0 (`to_maxtext.py`'s "
        "`is_unscanned_moe` looks at the name only), so the per-layer shape it hands the "
        "reshape hook of the router and of the shared experts is the model's `(embed, layers, "
        "...)` without `embed`, `(26, 64)`, which a router's 64 x 64 or a shared expert's "
        "64 x 32 values cannot fill (which one fails first varies from run to run). DeepSeek-V3's "
        "run stops on its router bias, stacked on axis 0 by the same rule.",
    ),
    (
        ("kimi-k2",),
        "Kimi's scanned run stops as DeepSeek-V3's and V2's do, on a leaf stacked on axis 0 (the router here; its bias or a shared expert from run to run).",
    ),
    (
        ("deepseek3.2",),
        "DeepSeek-V3.2's scanned run stops on its router bias, as DeepSeek-V3's does (or, from "
        "run to run, on the router or shared experts, as DeepSeek-V2's). Its indexer runs with "
        "16 heads here: with few heads, scores of exactly 0 (every head's ReLU at 0) tie at the "
        "top-k cut, where MaxText keeps the first by position and transformers' `torch.topk` "
        "any, and the logits would differ by design of the test, not of the weights. The rotary "
        "embedding is plain, as for DeepSeek-V2 (YaRN with a factor of 1); the indexer's, in "
        "halves, comes from the same embedding.",
    ),
    (
        ("deepseek4",),
        "DeepSeek-V4: the only difference is the hash-routing tables (`tid2eid`, in MaxText's "
        "`Tid2EidVar` collection): MaxText's converter casts them to its save_dtype (float32 "
        "here; bfloat16 with its dequantize script, where expert numbers above 256 would no "
        "longer be exact), suture keeps the checkpoint's int32. MaxText's model declares the "
        "table float32 and casts it to int32 where it routes. Its router bias (`MoEBiasVar`) is "
        "stacked (layers, experts), as MaxText's scan leaves variables other than parameters on "
        "axis 0. MaxText's model restores the tables (declared float32) from suture's int32 and "
        "routes alike: its logits are transformers' below. The hash tables are drawn with two "
        "distinct experts per token, as a token's experts are: with a repeated expert the two "
        "models differ (by about 0.1 in the logits here), whichever converter wrote the tree. "
        "MaxText's indexer keeps the top 4 of the 16 tokens of the forward pass, so its sparse "
        "mask is in play.",
    ),
    (
        ("gemma3",),
        "Gemma 3's embedding differs by design of this narrow test only: MaxText scales it by "
        "bfloat16(sqrt(hidden_size)) with the hidden size of its built-in gemma3-4b config "
        "(2560: 50.5), not the checkpoint's (64: 8); with that factor, suture's operation gives "
        "MaxText's values bit for bit (checked separately), and the 64 rows past 262144 are cut "
        "by both.",
    ),
    (
        ("gemma4",),
        "Gemma 4's scanned and unscanned trees are MaxText's converter's bit for bit. MaxText "
        "0.2.5's model computes tied logits with the embedding table cast to bfloat16 whatever "
        "the dtype (`layers/embeddings.py`, `attend_on_embedding`), so the folder's embedding is "
        "drawn on bfloat16's grid (stored in float32). With a float32 table MaxText's logits "
        "differ from transformers' by about 1e-3 here; that cast accounts for it (checked "
        "separately on a model whose attention and MLP outputs are zero: transformers' "
        "logits with the table rounded to bfloat16 in the last projection agree with "
        "MaxText's within 6e-7). "
        "Not run with a remainder block: a Gemma 4 runs alike in both models only with a "
        "multiple of 6 layers, since transformers makes the last layer full attention and "
        "MaxText's remainder "
        "block (`layers_remainder/local_layers`, which MaxText's mapping names "
        "`layers_remainder/layers_r`) holds local layers only; suture refuses another count.",
    ),
    (
        ("olmo3", "deepseek2"),
        "MaxText's model runs OLMo 3 and DeepSeek-V2 with plain rotary embeddings, as the HF "
        "models here have them, where its configs have YaRN (`rope_type=default` for OLMo 3; "
        "YaRN kept for DeepSeek with a factor of 1 and no extended context, since only MaxText's "
        "YaRN embedding rotates DeepSeek's interleaved pairs).",
    ),
]


def report(selected: list, chosen: bool, rows: list, findings: list[str], logits: list) -> None:
    """The section of the families that ran (its own section when `chosen` with --families)."""

    def run(r: dict | None) -> str:
        if r is None:
            return "fails | |"
        return f"{r['wall_s']:.1f} s | {r['peak_rss_bytes'] / MIB:.0f} MiB |"

    names = list(dict.fromkeys(family[0] for family in selected))
    table = "\n".join(
        f"| `{family}:{layout}` ({model}) | {size / MIB:.0f} MiB | {run(ours)} {run(theirs)}"
        for family, layout, size, ours, theirs, model in rows
    )
    found = "\n".join(f"- {line}" for line in findings)
    forward = "\n".join(
        f"- `{family}: max abs logit difference {difference:.3g} (largest logit {scale:.3g})"
        for family, difference, scale in logits
    )
    if forward:
        forward = f"""
MaxText's own model (float32, highest matmul precision, dense MoE path, on the CPU;
`bench/_maxtext_logits.py`) restores suture's scanned float32 output through
`load_parameters_path` and runs 2 x 16 random tokens; transformers runs the HF folder on the
same tokens:

{forward}
"""
    command = "python -m bench.families --maxtext-venv DIR --maxtext-families"
    command += f" --families {','.join(names)}" if chosen else ""
    models = " / ".join(dict.fromkeys(family[1] for family in selected))
    setup = "".join(
        "\n" + textwrap.fill(SETUP[name], 95, initial_indent="- ", subsequent_indent="  ")
        for name in names
        if name in SETUP
    )
    notes = "\n\n".join(textwrap.fill(text, 95) for among, text in NOTES if set(among) & set(names))
    body = f"""## Model families: {", ".join(f"`{name}`" for name in names)} beside MaxText's own converter (`{command}`)

{machine()}, {date.today().isoformat()}. One random transformers model per family (float32; the
layer and expert counts of MaxText's built-in HF config for the model name, because its converter
maps names from that config; hidden 64, 4 query and 2 KV heads of 16, MLP 32, vocab 256),
converted scanned and unscanned by `suture convert --recipe FAMILY:LAYOUT` and by MaxText
0.2.5's `to_maxtext` (`model_name={models}` with the sizes overridden,
`lazy_load_tensors=True`, `save_dtype=float32`, through `bench/_maxtext_convert.py`).
{setup}

| recipe | source | suture wall | suture peak RSS | MaxText wall | MaxText peak RSS |
| --- | --- | --- | --- | --- | --- |
{table}

Output trees compared leaf by leaf (paths, shapes, dtypes, bytes; MaxText's empty `opt_state`
aside):

{found}

{notes}
{forward}"""
    section = "families-maxtext-" + "-".join(names) if chosen else "families-maxtext-moe"
    write_section(section, body)
    print(body)
