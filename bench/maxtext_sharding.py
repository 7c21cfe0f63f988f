"""MaxText's own sharding of each family's parameters beside suture's built-in recipes' axes.

MaxText (in its own venv, `--maxtext-venv`) builds a small model of each family abstractly
and reports, per parameter, the logical axes its code annotates, its config's
``logical_axis_rules`` and mesh, and the shard shape of its training sharding
(``nn.logical_to_mesh_sharding``). suture's built-in ``FAMILY:maxtext`` recipe, with no
rules file, gives each of those parameters its spec from its table's ``logical_axes`` and
suture's copy of MaxText's default rules (`suture.families._logical_axes`), on the same mesh
and over MaxText's own tree: every shard must be MaxText's.

Run from the repository root: `.venv/bin/python -m bench.maxtext_sharding --maxtext-venv
/tmp/mtvenv [--families qwen3-moe ...]`. MaxText's reports are recorded in
``bench/_data/maxtext-sharding/``; `bench/maxtext_axes_table.py` writes a table's
``logical_axes`` from them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from bench._common import BENCH_DIR, DATA_DIR, RESULTS, machine, write_section

WORK = DATA_DIR / "maxtext-sharding"
MESHES = {
    "fsdp=4,tensor=2": ["ici_fsdp_parallelism=4", "ici_tensor_parallelism=2"],
    "fsdp=2,tensor=2,expert=2": [
        "ici_fsdp_parallelism=2", "ici_tensor_parallelism=2", "ici_expert_parallelism=2",
    ],
    # DeepSeek-V4's one KV head: MaxText 0.2.5 builds its model on no mesh with a tensor axis
    "fsdp=8": ["ici_fsdp_parallelism=8"],
    "fsdp=4,expert=2": ["ici_fsdp_parallelism=4", "ici_expert_parallelism=2"],
}  # fmt: skip
SMALL = [
    "override_model_config=True",
    "base_emb_dim=256",
    "base_mlp_dim=512",
    "base_num_query_heads=4",
    "base_num_kv_heads=2",
    "head_dim=64",
    "vocab_size=128",
]
# The same widths as Hugging Face config fields: the config suture's recipe reads.
HF = dict(
    hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, vocab_size=128, tie_word_embeddings=False,
)  # fmt: skip
MOE = ["sparse_matmul=false"]  # the dense MoE path: the same parameters, and it runs on CPU
MLA = [
    "base_num_kv_heads=4", "base_moe_mlp_dim=64", "base_num_decoder_layers=3",
    "first_num_dense_layers=1", "num_experts=8", "num_experts_per_tok=2", "q_lora_rank=32",
    "kv_lora_rank=16", "qk_nope_head_dim=16", "qk_rope_head_dim=8", "v_head_dim=16",
]  # fmt: skip
MLA_HF = dict(
    num_key_value_heads=4, moe_intermediate_size=64, num_hidden_layers=3,
    first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
    n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
    qk_rope_head_dim=8, v_head_dim=16,
)  # fmt: skip
# family: (MaxText model, MaxText overrides, HF model_type, HF config fields, mesh)
FAMILIES = {
    "llama3.1": ("llama3.1-8b", ["base_num_decoder_layers=2"], "llama", {}, "fsdp=4,tensor=2"),
    "qwen3": ("qwen3-8b", ["base_num_decoder_layers=2"], "qwen3", {}, "fsdp=4,tensor=2"),
    "qwen3-moe": (
        "qwen3-30b-a3b",
        ["base_num_decoder_layers=2", "base_moe_mlp_dim=128", "num_experts=8", *MOE],
        "qwen3_moe",
        dict(moe_intermediate_size=128, num_experts=8, num_experts_per_tok=2),
        "fsdp=2,tensor=2,expert=2",
    ),
    "mixtral": (
        "mixtral-8x7b",
        ["base_num_decoder_layers=2", "base_moe_mlp_dim=512", "num_experts=4", *MOE],
        "mixtral",
        dict(num_local_experts=4, num_experts_per_tok=2),
        "fsdp=4,tensor=2",
    ),
    "deepseek3": (
        "deepseek2-16b",
        [*MLA, "shared_experts=1", "routed_score_func=sigmoid", "routed_bias=true", *MOE],
        "deepseek_v3",
        MLA_HF,
        "fsdp=2,tensor=2,expert=2",
    ),
    "deepseek2": (
        "deepseek2-16b",
        [*[o for o in MLA if not o.startswith("q_lora")], "q_lora_rank=0", *MOE],
        "deepseek_v2",
        {**MLA_HF, "q_lora_rank": None},
        "fsdp=4,tensor=2",
    ),
    # the llama table (llama2, llama3, mistral) on llama3-8b: MaxText's llama2-* configs put
    # [norm, fsdp] before the default rules (the norms' shards differ; give --sharding)
    "llama2": ("llama3-8b", ["base_num_decoder_layers=2"], "llama", {}, "fsdp=4,tensor=2"),
    "gpt-oss": (
        "gpt-oss-20b",
        ["base_num_decoder_layers=2", "num_experts=4", *MOE],
        "gpt_oss",
        dict(num_local_experts=4, num_experts_per_tok=2, num_hidden_layers=2),
        "fsdp=4,tensor=2",
    ),
    "gemma2": (
        "gemma2-2b",
        ["base_num_decoder_layers=2"],
        "gemma2",
        dict(query_pre_attn_scalar=64),
        "fsdp=4,tensor=2",
    ),
    "gemma3": (
        "gemma3-4b",
        ["base_num_decoder_layers=6"],
        "gemma3_text",
        dict(num_hidden_layers=6, query_pre_attn_scalar=64, tie_word_embeddings=True),
        "fsdp=4,tensor=2",
    ),
    "olmo3": (
        "olmo3-7b",
        ["base_num_decoder_layers=4"],
        "olmo3",
        dict(num_hidden_layers=4),
        "fsdp=4,tensor=2",
    ),
}
BOTH = ("fsdp=4,tensor=2", "fsdp=2,tensor=2,expert=2")
# Gemma 4: one block of 5 local and 1 global layer; the global layers' keys are their values
# (share_kv_projections) and need as many KV heads as the tensor axis (MaxText refuses fewer).
GEMMA4 = ["base_num_decoder_layers=6", "global_head_dim=128", "global_num_kv_heads=2"]
GEMMA4_HF = dict(
    num_hidden_layers=6, global_head_dim=128, num_global_key_value_heads=2, attention_k_eq_v=True,
    hidden_size_per_layer_input=0, tie_word_embeddings=True,
)  # fmt: skip
GDN = [
    "base_num_decoder_layers=4", "num_experts=4", "num_experts_per_tok=2",
    "base_moe_mlp_dim=128", "gdn_key_head_dim=32", "gdn_value_head_dim=32",
    "gdn_num_key_heads=2", "gdn_num_value_heads=4", *MOE,
]  # fmt: skip
GDN_HF = dict(
    num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128,
    shared_expert_intermediate_size=128, linear_key_head_dim=32, linear_value_head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_conv_kernel_dim=4,
)  # fmt: skip
# The families added later, each on both meshes, with the settings bench/_maxtext_families.py
# gives MaxText for them (narrowed to the widths above).
FAMILIES |= {
    "gemma4": (
        "gemma4-26b",
        [*GEMMA4, "num_experts=4", "num_experts_per_tok=2", "base_moe_mlp_dim=128", *MOE],
        "gemma4_text",
        dict(
            GEMMA4_HF,
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=128,
        ),  # fmt: skip
        BOTH,
    ),
    "gemma4-31b": ("gemma4-31b", GEMMA4, "gemma4_text", GEMMA4_HF, BOTH),
    "gemma4-small": (
        "gemma4-e2b",
        [
            "base_num_decoder_layers=10",
            "global_head_dim=128",
            "base_num_kv_heads=2",
            "hidden_size_per_layer_input=8",
            "vocab_size_per_layer_input=128",
            "num_kv_shared_layers=5",
            "scan_layers=false",
        ],  # fmt: skip
        "gemma4_text",
        dict(
            num_hidden_layers=10,
            num_kv_shared_layers=5,
            use_double_wide_mlp=True,
            layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2,
            hidden_size_per_layer_input=8,
            vocab_size_per_layer_input=128,
            global_head_dim=128,
            tie_word_embeddings=True,
        ),  # fmt: skip
        BOTH,
    ),
    "llama4": (
        "llama4-17b-16e",
        [
            "base_num_decoder_layers=4",
            "num_experts=4",
            "base_moe_mlp_dim=128",
            "interleave_moe_layer_step=2",
            *MOE,
        ],  # fmt: skip
        "llama4_text",
        dict(
            num_hidden_layers=4,
            num_local_experts=4,
            num_experts_per_tok=1,
            intermediate_size=128,
            intermediate_size_mlp=512,
            interleave_moe_layer_step=2,
        ),  # fmt: skip
        BOTH,
    ),
    "qwen3-next": ("qwen3-next-80b-a3b", GDN, "qwen3_next", GDN_HF, BOTH),
    # 6 layers: a block of 4 and a remainder of 2 Gated DeltaNet layers, nested on local_layers
    "qwen3-next-remainder": (
        "qwen3-next-80b-a3b",
        [*GDN, "base_num_decoder_layers=6"],
        "qwen3_next",
        dict(GDN_HF, num_hidden_layers=6),
        BOTH,
    ),
    "qwen3.5": (
        "qwen3.5-35b-a3b",
        [*GDN, "use_mrope=false"],
        "qwen3_5_moe_text",
        GDN_HF,
        BOTH,
    ),  # fmt: skip
    # V3.2's settings on deepseek2-16b, as bench/_maxtext_families.py's: deepseek3.2-671b keeps
    # the router bias in MaxText's MoEBiasVar collection, where its converter never writes it
    "deepseek3.2": (
        "deepseek2-16b",
        [
            *MLA,
            "shared_experts=1",
            "routed_score_func=sigmoid",
            "routed_bias=true",
            "use_indexer=true",
            "indexer_n_heads=4",
            "indexer_head_dim=32",
            "indexer_topk=8",
            "attention=dot_product",
            *MOE,
        ],  # fmt: skip
        "deepseek_v32",
        dict(MLA_HF, index_n_heads=4, index_head_dim=32, index_topk=8),
        BOTH,
    ),
    "deepseek4": (
        "deepseek4-284b",
        [
            "base_num_decoder_layers=7",
            "base_num_kv_heads=1",
            "base_mlp_dim=128",
            "num_experts=8",
            "num_experts_per_tok=2",
            "base_moe_mlp_dim=128",
            "q_lora_rank=32",
            "o_groups=2",
            "o_lora_rank=32",
            "indexer_head_dim=32",
            "indexer_n_heads=4",
            "indexer_topk=4",
            "qk_rope_head_dim=16",
            "sliding_window_size=8",
            "attention=dot_product",
            *MOE,
        ],  # fmt: skip
        "deepseek_v4",
        dict(
            num_hidden_layers=7,
            num_key_value_heads=1,
            intermediate_size=128,
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=128,
            q_lora_rank=32,
            o_groups=2,
            o_lora_rank=32,
            index_n_heads=4,
            index_head_dim=32,
            index_topk=4,
            sliding_window=8,
            hc_mult=4,
            compress_ratios=[0, 0, 4, 128, 4, 128, 4],
            qk_rope_head_dim=16,
            num_hash_layers=3,
        ),  # fmt: skip
        ("fsdp=8", "fsdp=4,expert=2"),
    ),
}
# What tells a row from another of the same table and model.
VARIANTS = {
    "qwen3-next-remainder": "6 layers: a remainder",
    "qwen3-vl": "deepstack",
    "qwen3-omni": "deepstack",
}
# A row named other than its table, and the recipe of a table MaxText has unscanned only.
TABLES = {"gemma4-31b": "gemma4", "qwen3-next-remainder": "qwen3-next"}
LAYOUTS = {"gemma4-small": "maxtext-unscanned"}
# Whole multimodal models (use_multimodal=true, a narrow tower): the recipe, and the HF config
# as the folder's (text_config and vision_config)
GEMMA3_VISION = dict(
    model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=2, image_size=896, patch_size=14, vision_use_head=False,
)  # fmt: skip
VIT = [
    "use_multimodal=true", "hidden_size_for_vit=32", "intermediate_size_for_vit=64",
    "num_hidden_layers_for_vit=2", "num_attention_heads_for_vit=2",
]  # fmt: skip
FAMILIES |= {
    "gemma3-multimodal": (
        "gemma3-4b",
        ["base_num_decoder_layers=6", *VIT],
        "gemma3",
        dict(
            text_config=dict(
                HF,
                model_type="gemma3_text",
                num_hidden_layers=6,
                query_pre_attn_scalar=64,
                tie_word_embeddings=True,
            ),
            vision_config=GEMMA3_VISION,
            mm_tokens_per_image=256,
        ),  # fmt: skip
        BOTH,
    ),
}
GEMMA4_VISION = dict(
    model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    num_attention_heads=2, num_key_value_heads=2, head_dim=16, position_embedding_size=64,
    patch_size=16, pooling_kernel_size=3, standardize=True,
)  # fmt: skip
FAMILIES |= {
    "gemma4-multimodal": (
        "gemma4-26b",
        [
            *GEMMA4,
            "num_experts=4",
            "num_experts_per_tok=2",
            "base_moe_mlp_dim=128",
            *MOE,
            *VIT,
            "num_position_embeddings_for_vit=64",
        ],  # fmt: skip
        "gemma4",
        dict(
            text_config=dict(
                HF,
                **GEMMA4_HF,
                model_type="gemma4_text",
                enable_moe_block=True,
                num_experts=4,
                top_k_experts=2,
                moe_intermediate_size=128,
            ),
            vision_config=GEMMA4_VISION,
            audio_config=None,
        ),  # fmt: skip
        BOTH,
    ),
}
QWEN_VISION = dict(
    depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=256,
    patch_size=4, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=2304,
)  # fmt: skip
QWEN_VIT = [
    "use_multimodal=true", "hidden_size_for_vit=32", "intermediate_size_for_vit=64",
    "num_attention_heads_for_vit=2", "num_hidden_layers_for_vit=2", "patch_size_for_vit=4",
    "temporal_patch_size_for_vit=2", "spatial_merge_size_for_vit=2",
    "out_hidden_size_for_vit=256", "num_position_embeddings_for_vit=2304",
]  # fmt: skip
FAMILIES |= {
    "qwen3.5-multimodal": (
        "qwen3.5-35b-a3b",
        [*GDN, "use_mrope=false", *QWEN_VIT],
        "qwen3_5_moe",
        dict(
            text_config=dict(HF, **GDN_HF, model_type="qwen3_5_moe_text"),
            vision_config=dict(QWEN_VISION, model_type="qwen3_5_moe_vision"),
        ),
        BOTH,
    ),
}
# Qwen3-VL (as bench/_maxtext_qwen3_vl.py): MaxText runs deepstack mergers unscanned only
VL_TEXT = dict(HF, num_hidden_layers=2)
VL_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128)
VL = [
    "base_num_decoder_layers=2", "logits_via_embedding=False", "mrope_section=[16,8,8]",
    *(item for item in QWEN_VIT if not item.startswith("num_position")),
    "num_position_embeddings_for_vit=2304", "image_size_for_vit=16",
]  # fmt: skip
VL_MOE_MAXTEXT = [
    "num_experts=4", "num_experts_per_tok=2", "base_moe_mlp_dim=128", "base_mlp_dim=128", *MOE,
]  # fmt: skip


def _vl(moe: bool, deepstack: list[int]) -> dict:
    kind = "qwen3_vl_moe" if moe else "qwen3_vl"
    return dict(
        text_config=dict(VL_TEXT, **(VL_MOE if moe else {}), model_type=f"{kind}_text"),
        vision_config=dict(
            QWEN_VISION, model_type=f"{kind}_vision", deepstack_visual_indexes=deepstack
        ),
    )


FAMILIES |= {
    "qwen3-vl": (
        "qwen3-vl-30b-a3b",
        [*VL, *VL_MOE_MAXTEXT, "deepstack_visual_indexes_for_vit=[0]", "scan_layers=false"],
        "qwen3_vl_moe",
        _vl(True, [0]),
        BOTH,
    ),
    "qwen3-vl-moe-scanned": (
        "qwen3-vl-30b-a3b",
        [*VL, *VL_MOE_MAXTEXT, "deepstack_visual_indexes_for_vit=[]", "scan_layers=true"],
        "qwen3_vl_moe",
        _vl(True, []),
        BOTH,
    ),
    "qwen3-vl-dense": (
        "qwen3-vl-2b",
        [*VL, "deepstack_visual_indexes_for_vit=[]", "scan_layers=true"],
        "qwen3_vl",
        _vl(False, []),
        BOTH,
    ),
}
AUDIO = dict(
    num_mel_bins=16, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=64, d_model=32,
    output_dim=256, downsample_hidden_size=8, max_source_positions=64, n_window=50,
    n_window_infer=100, conv_chunksize=50,
)  # fmt: skip
OMNI_AUDIO = ["use_audio=true"] + [
    f"{name}_for_audio={AUDIO[name]}"
    for name in (
        "d_model", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
        "num_mel_bins", "downsample_hidden_size", "output_dim", "max_source_positions",
        "n_window", "n_window_infer", "conv_chunksize",
    )
]  # fmt: skip


def _omni(deepstack: list[int]) -> dict:
    return dict(
        thinker_config=dict(
            text_config=dict(VL_TEXT, **VL_MOE, model_type="qwen3_omni_moe_text"),
            vision_config=dict(QWEN_VISION, deepstack_visual_indexes=deepstack),
            audio_config=AUDIO,
        )
    )


FAMILIES |= {
    "qwen3-omni": (
        "qwen3-omni-30b-a3b",
        [
            *VL,
            *VL_MOE_MAXTEXT,
            *OMNI_AUDIO,
            "deepstack_visual_indexes_for_vit=[0]",
            "scan_layers=false",
        ],  # fmt: skip
        "qwen3_omni_moe",
        _omni([0]),
        BOTH,
    ),
    "qwen3-omni-scanned": (
        "qwen3-omni-30b-a3b",
        [
            *VL,
            *VL_MOE_MAXTEXT,
            *OMNI_AUDIO,
            "deepstack_visual_indexes_for_vit=[]",
            "scan_layers=true",
        ],  # fmt: skip
        "qwen3_omni_moe",
        _omni([]),
        BOTH,
    ),
}
TABLES |= {
    "qwen3-vl-moe-scanned": "qwen3-vl",
    "qwen3-vl-dense": "qwen3-vl",
    "qwen3-omni-scanned": "qwen3-omni",
}
WHOLE = {
    "qwen3-omni": "qwen3-omni:maxtext-unscanned",
    "qwen3-omni-scanned": "qwen3-omni:maxtext",
    "qwen3-vl": "qwen3-vl:maxtext-unscanned",
    "qwen3-vl-moe-scanned": "qwen3-vl:maxtext",
    "qwen3-vl-dense": "qwen3-vl:maxtext",
    "gemma3-multimodal": "gemma3:maxtext-multimodal",
    "gemma4-multimodal": "gemma4:maxtext-multimodal",
    "qwen3.5-multimodal": "qwen3.5:maxtext-multimodal",
}


def maxtext_axes(
    python: Path, model: str, overrides: list[str], mesh: str, record: Path, recorded: bool
) -> dict:
    """MaxText's report (`bench/_maxtext_axes.py`), recorded in `record`; with `recorded`, the
    one recorded there by an earlier run."""
    if recorded and record.exists():
        return json.loads(record.read_text())
    command = [
        str(python), "-P", str(BENCH_DIR / "_maxtext_axes.py"), f"model_name={model}",
        *SMALL, *overrides, *MESHES[mesh], "hardware=cpu", "skip_jax_distributed_system=True",
        "per_device_batch_size=1", "max_target_length=16", "run_name=axes",
    ]  # fmt: skip
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False, cwd=WORK)
    line = next((x for x in done.stdout.splitlines() if x.startswith("AXES ")), None)
    if line is None:
        raise RuntimeError(f"MaxText's {model} failed:\n{done.stderr[-3000:]}")
    record.write_text(line.removeprefix("AXES "))
    return json.loads(line.removeprefix("AXES "))


def suture_shards(recipe_name: str, model_type: str, fields: dict, found: dict) -> dict:
    """{MaxText path: shard} of suture's built-in recipe `recipe_name` on MaxText's mesh:
    each leaf's spec from the table's logical_axes under suture's copy of MaxText's rules,
    over the tree of MaxText's own paths and shapes."""
    import jax
    import numpy as np
    import transformers

    import suture
    from suture._save.mesh import shards_of
    from suture.families import get_recipe
    from suture.families._logical_axes import MAXTEXT_AXIS_RULES, recipe_rules

    rules = [
        (name, axes if isinstance(axes, str) else tuple(axes))
        for name, axes in found["logical_axis_rules"]
    ]
    if [(n, a if isinstance(a, str) else tuple(a)) for n, a in MAXTEXT_AXIS_RULES] != rules:
        raise RuntimeError(
            "MaxText's logical_axis_rules are not suture's copy (MAXTEXT_AXIS_RULES)"
        )
    whole = {"text_config", "thinker_config"} & set(fields)  # a multimodal folder's config
    config = transformers.AutoConfig.for_model(
        model_type, **(fields if whole else {**HF, **fields})
    )
    config = config.to_dict()
    recipe = get_recipe(recipe_name)
    tree = {
        f"params/{path}": jax.ShapeDtypeStruct(tuple(shape), np.float32)
        for path, shape in found["shapes"].items()
    }
    target = suture.TargetSharding(found["mesh"], recipe_rules(recipe, config, tree))
    shards = shards_of(target, tree)
    return {
        path: shards.get(f"params/{path}", tuple(found["shapes"][path])) for path in found["shapes"]
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--maxtext-venv", type=Path, default=Path("/tmp/mtvenv"))
    parser.add_argument("--families", nargs="*", default=list(FAMILIES))
    parser.add_argument(
        "--recorded", action="store_true", help="MaxText's reports recorded by an earlier run"
    )
    arguments = parser.parse_args()
    python = arguments.maxtext_venv / "bin" / "python"
    WORK.mkdir(parents=True, exist_ok=True)
    rows, notes = [], []
    for family in arguments.families:
        model, overrides, model_type, fields, meshes = FAMILIES[family]
        table = TABLES.get(family, family)
        recipe = WHOLE.get(family, f"{table}:{LAYOUTS.get(table, 'maxtext')}")
        for mesh in (meshes,) if isinstance(meshes, str) else meshes:
            record = WORK / f"{family}.{mesh.replace(',', '.').replace('=', '')}.json"
            found = maxtext_axes(python, model, overrides, mesh, record, arguments.recorded)
            ours = suture_shards(recipe, model_type, fields, found)
            differ = [
                f"{path}: suture {tuple(ours[path])}, MaxText {tuple(shard)}"
                for path, shard in found["shards"].items()
                if tuple(ours[path]) != tuple(shard)
            ]
            count = len(found["shards"])
            sharded = sum(1 for p, s in found["shards"].items() if s != found["shapes"][p])
            scanned = any(
                str(axis).endswith(("layers", "scanned_blocks"))
                for axes in found["leaves"].values()
                for axis in axes
            )
            label = f"`{family}`" if table == family else f"`{table}`"
            variant = f", {VARIANTS[family]}" if family in VARIANTS else ""
            rows.append(
                f"| {label} ({model}, small, {'scanned' if scanned else 'unscanned'}{variant}) "
                f"| {mesh} | {count} "
                f"| {sharded} | {count - len(differ)} of {count} |"
            )
            notes += [f"- `{family}` on {mesh}: {line}" for line in differ]
            print(rows[-1], flush=True)
    body = "\n".join(
        [
            "## maxtext_sharding: the built-in MaxText recipes' logical axes against MaxText's own sharding (issue 42)",
            "",
            f"`python -m bench.maxtext_sharding --maxtext-venv /tmp/mtvenv` — {machine()}; "
            f"MaxText 0.2.5 builds each model abstractly (widths 256/512, 8 CPU devices, the mesh "
            f"as ici_*_parallelism) and reports, per parameter, the shard of its training "
            f"sharding (`nn.logical_to_mesh_sharding` under its config's `logical_axis_rules`). "
            f"suture's built-in `FAMILY:maxtext` recipe, with no rules file, gives each of "
            f"MaxText's parameters its spec from the table's `logical_axes` under suture's copy "
            f"of MaxText's default rules (checked equal to the config's in each run), as "
            f"`suture convert HF OUT --recipe FAMILY:maxtext --mesh ...` does; a whole "
            f"multimodal model (`use_multimodal=true`, a narrow tower) through its whole recipe, "
            f"its towers by their tables' axes. The families from `gemma4` on run on both "
            f"meshes. MaxText's reports are recorded in "
            f"`bench/_data/maxtext-sharding/` (`--recorded` reads them back).",
            "",
            "| family | mesh | parameters | sharded by MaxText | suture's shard = MaxText's |",
            "| --- | --- | --- | --- | --- |",
            *merged_rows(rows),
            "",
            *(notes or ["- Every parameter's shard is MaxText's own."]),
            *(line for line in kept_notes(arguments.families) if line not in NOTES),
            *NOTES,
        ]
    )
    write_section("maxtext-sharding", body)
    print(body)


NOTES = [
    "- Where MaxText gives a parameter no logical axes (Gated DeltaNet's `A_log`, `dt_bias` and "
    "`conv1d`, DeepSeek's indexer `k_norm`, DeepSeek-V4's `position_bias` and hash tables, most "
    "of the towers' norms, biases and MLPs), the tables say null for each axis: replicated, as "
    "MaxText's. Where it gives a norm only its scan's axis (`[layers]` on a `[dim, layers]` "
    "scale: Qwen3-Next's and Qwen3.5's norms), the tables put `layers` on the layer axis: the "
    "same shards wherever the mesh's `stage` axis is 1, as on both meshes here.",
    "- `deepseek4` runs on `fsdp=8` and `fsdp=4,expert=2`: MaxText 0.2.5 refuses to build its "
    "one KV head on a mesh with a tensor axis (`IndivisibleError`). `deepseek3.2` is built on "
    "`deepseek2-16b` with V3.2's settings (the indexer on, `attention=dot_product`), as "
    "`bench/_maxtext_families.py` does: `deepseek3.2-671b` keeps the router bias in the "
    "`MoEBiasVar` collection, where MaxText's converter never writes it. `gemma4-small` is "
    "`gemma4-e2b` unscanned (MaxText has it unscanned only), with KV-shared layers. Qwen3-VL "
    "and Qwen3-Omni run whole, unscanned with a deepstack merger (MaxText runs deepstack "
    "unscanned only) and scanned without one; their text tables' axes are the whole model's.",
]


def _section() -> list[str]:
    text = RESULTS.read_text() if RESULTS.exists() else ""
    start, end = "<!-- bench:maxtext-sharding -->", "<!-- /bench:maxtext-sharding -->"
    if start not in text:
        return []
    return text.split(start, 1)[1].split(end, 1)[0].splitlines()


def _family_of(row: str) -> str:
    return row.split("`")[1] if row.count("`") >= 2 else ""


def _key(row: str) -> tuple[str, str]:
    """(what ran, mesh) of a row: its first two cells."""
    cells = [cell.strip() for cell in row.split("|")]
    return cells[1], cells[2]


def merged_rows(rows: list[str]) -> list[str]:
    """The section's rows (in RESULTS.md), each replaced by its new one from `rows`, then the
    rows not there before."""
    new = {_key(row): row for row in rows}
    old = [row for row in _section() if row.startswith("| `") and _family_of(row) != "family"]
    kept = [new.pop(_key(row), row) for row in old]
    return kept + [row for row in rows if _key(row) in new]


def kept_notes(families: list[str]) -> list[str]:
    """The section's notes but those on a difference of a family run this time."""
    ran = set(families) | {TABLES.get(family, family) for family in families}
    differ = tuple(f"- `{family}`{tail}" for family in ran for tail in (": ", " on "))
    return [
        line
        for line in _section()
        if line.startswith("- ") and not line.startswith(("- Every parameter", *differ))
    ]


if __name__ == "__main__":
    main()
