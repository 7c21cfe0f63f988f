"""Qwen3-VL-30B-A3B whole, at full width, to MaxText's layout: suture beside MaxText's eager converter.

    python -m bench.families_qwen3_vl [--layers 2] [--maxtext-venv PATH] [--suture-layers 6]

Generates a random Hugging Face folder in the published layout of
Qwen/Qwen3-VL-30B-A3B-Instruct (its config.json's widths: text hidden 2048, 32 query and 4 KV
heads of 128, 128 experts of 768 fused as published, ``gate_up_proj`` (E, H, 2I) and
``down_proj`` (E, I, H), 8 routed per token, vocab 151936, an untied ``lm_head``; the vision
tower whole, 27 blocks of hidden 1152, MLP 4304, 16 heads, 2304 positions, deepstack mergers
after blocks 8, 16 and 24; bfloat16, sharded with an index: the embeddings, the tower, then one
text layer per shard) with a few text layers, and runs each route cold (page cache dropped) in
a fresh process: a read of the shards (``cat``), ``cp -r``, ``suture convert --recipe
qwen3-vl:maxtext-unscanned``, and, with ``--maxtext-venv``, MaxText 0.2.5's ``to_maxtext`` on
its eager path (``use_multimodal=True`` refuses lazy loading: the whole folder is read into
memory), ``scan_layers=False``, bfloat16, its built-in HF config's layer count set to the
folder's. Wall, CPU seconds (user + sys) and peak RSS of each; the two outputs are compared leaf
by leaf (the tower's last block's query kernel and the last layer's stacked ``wi_0`` named).
``--suture-layers`` runs the read, the copy and suture alone on larger folders, to show how
suture's figures grow with the layer count.
Everything it made is deleted at the end.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
from pathlib import Path

from bench import _maxtext
from bench._common import DATA_DIR, machine, write_hf_shards, write_section
from bench.families import timed
from bench.families_moe import _route

WORK = DATA_DIR / "families-qwen3-vl"
GIB = 1024**3
LM, VIS = "model.language_model", "model.visual"
TEXT = dict(  # the published config.json's text_config
    attention_bias=False,
    decoder_sparse_step=1,
    head_dim=128,
    hidden_act="silu",
    hidden_size=2048,
    intermediate_size=6144,
    max_position_embeddings=262144,
    mlp_only_layers=[],
    model_type="qwen3_vl_moe_text",
    moe_intermediate_size=768,
    norm_topk_prob=True,
    num_attention_heads=32,
    num_experts=128,
    num_experts_per_tok=8,
    num_key_value_heads=4,
    rms_norm_eps=1e-6,
    rope_scaling={"mrope_interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
    rope_theta=5000000,
    vocab_size=151936,
)
VISION = dict(  # its vision_config
    deepstack_visual_indexes=[8, 16, 24],
    depth=27,
    hidden_act="gelu_pytorch_tanh",
    hidden_size=1152,
    in_channels=3,
    intermediate_size=4304,
    model_type="qwen3_vl_moe_vision",
    num_heads=16,
    num_position_embeddings=2304,
    out_hidden_size=2048,
    patch_size=16,
    spatial_merge_size=2,
    temporal_patch_size=2,
)
PUBLISHED_LAYERS = 48
TOWER_LEAF = "params/params/vision_encoder/Qwen3VLVisionEncoder_0/blocks_26/attn/attn/query/kernel"


def _text_layer(i: int) -> dict[str, tuple[int, ...]]:
    e, m, x, d = (
        TEXT[k] for k in ("hidden_size", "moe_intermediate_size", "num_experts", "head_dim")
    )
    h, kv = TEXT["num_attention_heads"], TEXT["num_key_value_heads"]
    at = f"{LM}.layers.{i}"
    return {
        f"{at}.input_layernorm.weight": (e,),
        f"{at}.post_attention_layernorm.weight": (e,),
        f"{at}.self_attn.q_proj.weight": (h * d, e),
        f"{at}.self_attn.k_proj.weight": (kv * d, e),
        f"{at}.self_attn.v_proj.weight": (kv * d, e),
        f"{at}.self_attn.o_proj.weight": (e, h * d),
        f"{at}.self_attn.q_norm.weight": (d,),
        f"{at}.self_attn.k_norm.weight": (d,),
        f"{at}.mlp.gate.weight": (x, e),
        f"{at}.mlp.experts.gate_up_proj": (x, e, 2 * m),  # as published: (E, H, 2I)
        f"{at}.mlp.experts.down_proj": (x, m, e),  # (E, I, H)
    }


def _merger(at: str, norm: int) -> dict[str, tuple[int, ...]]:
    merged = VISION["hidden_size"] * VISION["spatial_merge_size"] ** 2
    return {
        f"{at}.norm.weight": (norm,),
        f"{at}.norm.bias": (norm,),
        f"{at}.linear_fc1.weight": (merged, merged),
        f"{at}.linear_fc1.bias": (merged,),
        f"{at}.linear_fc2.weight": (VISION["out_hidden_size"], merged),
        f"{at}.linear_fc2.bias": (VISION["out_hidden_size"],),
    }


def _tower() -> dict[str, tuple[int, ...]]:
    c, f = VISION["hidden_size"], VISION["intermediate_size"]
    p, t = VISION["patch_size"], VISION["temporal_patch_size"]
    shapes = {
        f"{VIS}.patch_embed.proj.weight": (c, VISION["in_channels"], t, p, p),
        f"{VIS}.patch_embed.proj.bias": (c,),
        f"{VIS}.pos_embed.weight": (VISION["num_position_embeddings"], c),
    }
    for i in range(VISION["depth"]):
        at = f"{VIS}.blocks.{i}"
        shapes |= {
            f"{at}.norm1.weight": (c,),
            f"{at}.norm1.bias": (c,),
            f"{at}.norm2.weight": (c,),
            f"{at}.norm2.bias": (c,),
            f"{at}.attn.qkv.weight": (3 * c, c),
            f"{at}.attn.qkv.bias": (3 * c,),
            f"{at}.attn.proj.weight": (c, c),
            f"{at}.attn.proj.bias": (c,),
            f"{at}.mlp.linear_fc1.weight": (f, c),
            f"{at}.mlp.linear_fc1.bias": (f,),
            f"{at}.mlp.linear_fc2.weight": (c, f),
            f"{at}.mlp.linear_fc2.bias": (c,),
        }
    shapes |= _merger(f"{VIS}.merger", c)  # the final merger's norm is before the merge
    for j in range(len(VISION["deepstack_visual_indexes"])):
        shapes |= _merger(f"{VIS}.deepstack_merger_list.{j}", c * VISION["spatial_merge_size"] ** 2)
    return shapes


def generate(folder: Path, layers: int) -> tuple[int, int]:
    """Writes the HF folder; returns its size and the tower's, in bytes."""
    e, v = TEXT["hidden_size"], TEXT["vocab_size"]
    embeddings = {
        f"{LM}.embed_tokens.weight": (v, e),
        f"{LM}.norm.weight": (e,),
        "lm_head.weight": (v, e),
    }
    tower = _tower()
    config = {
        "architectures": ["Qwen3VLMoeForConditionalGeneration"],
        "image_token_id": 151655,
        "model_type": "qwen3_vl_moe",
        "text_config": {**TEXT, "num_hidden_layers": layers, "dtype": "bfloat16"},
        "tie_word_embeddings": False,
        "video_token_id": 151656,
        "vision_config": VISION,
        "vision_end_token_id": 151653,
        "vision_start_token_id": 151652,
    }
    shards = [embeddings, tower] + [_text_layer(i) for i in range(layers)]
    size = write_hf_shards(folder, shards, config, "bfloat16")
    return size, 2 * sum(math.prod(shape) for shape in tower.values())


def maxtext_settings(layers: int) -> list[str]:
    """MaxText's qwen3-vl-30b-a3b with `layers` text layers (its HF text config's too),
    multimodal, unscanned (deepstack requires it), its eager loader reading with numpy."""
    return [
        "model_name=qwen3-vl-30b-a3b",
        "override_model_config=True",
        f"base_num_decoder_layers={layers}",
        f"hf_config.text_config.num_hidden_layers={layers}",
        "use_multimodal=True",
        "scan_layers=False",
        "sparse_matmul=False",
    ]


def run(layers: int, maxtext: Path | None) -> dict:
    shutil.rmtree(WORK, ignore_errors=True)
    hf, ours, theirs = WORK / "hf", WORK / "suture", WORK / "maxtext"
    try:
        size, tower = generate(hf, layers)
        shards = sorted(str(p) for p in hf.glob("*.safetensors"))
        row = dict(layers=layers, size=size, tower=tower)
        row["layer"] = 2 * sum(math.prod(shape) for shape in _text_layer(0).values())
        row["embedding"] = 2 * TEXT["vocab_size"] * TEXT["hidden_size"]
        row["floor"] = timed(["sh", "-c", 'cat "$@" > /dev/null', "sh", *shards])
        row["copy"] = timed(["cp", "-r", str(hf), str(WORK / "copy")])
        shutil.rmtree(WORK / "copy")
        suture_cli = str(Path(sys.executable).with_name("suture"))
        row["suture"] = timed(
            [suture_cli, "convert", str(hf), str(ours), "--recipe", "qwen3-vl:maxtext-unscanned"]
            + ["--no-progress"]
        )
        if maxtext is not None:
            command = _maxtext.maxtext_command(maxtext, maxtext_settings(layers), hf, theirs)
            command = [item for item in command if item != "lazy_load_tensors=True"]
            command += ["lazy_load_tensors=False", "eager_load_method=safetensors"]
            row["maxtext"] = timed([*command, "eager_numpy=True"])
            lines, identical = _maxtext.compare_trees(theirs / "0" / "items", ours)
            expert = f"params/params/decoder/layers_{layers - 1}/moe_block/wi_0"
            row["named"] = [
                f"`{path.removeprefix('params/params/')}` "
                + ("bit-identical" if path in identical else "DIFFERS")
                for path in (TOWER_LEAF, expert)
            ]
            row["compared"] = lines
        return row
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--maxtext-venv", type=Path, help="MaxText's environment (bench._maxtext)")
    parser.add_argument(
        "--suture-layers",
        type=int,
        nargs="*",
        default=[],
        help="more layer counts that suture (and the read and copy) alone run at",
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    maxtext = _maxtext.ensure_venv(args.maxtext_venv) if args.maxtext_venv else None
    r = run(args.layers, maxtext)
    more = [run(n, None) for n in args.suture_layers]
    load_after = os.getloadavg()
    routes = [
        _route("cold read (`cat`)", r["floor"], r["floor"]),
        _route("cold copy (`cp -r`)", r["copy"], r["floor"]),
        _route("suture `convert --recipe qwen3-vl:maxtext-unscanned`", r["suture"], r["floor"]),
    ]
    if "maxtext" in r:
        routes.append(
            _route("MaxText `to_maxtext` (eager, unscanned, bf16)", r["maxtext"], r["floor"])
        )
    beside = (
        "Beside MaxText's output: "
        + "; ".join(r["named"])
        + ". Leaf by leaf: "
        + "; ".join(r["compared"])
        + "."
        if "maxtext" in r
        else "MaxText's converter not run (no `--maxtext-venv`)."
    )
    alone = "".join(
        f"\n\nsuture alone at {m['layers']} layers ({m['size'] / GIB:.2f} GiB), the same way:"
        f" {m['suture']['wall_s']:.1f} s ({m['suture']['wall_s'] / m['floor']['wall_s']:.2f}x the"
        f" cold read, {m['suture']['wall_s'] / m['copy']['wall_s']:.2f}x the cold copy),"
        f" {m['suture']['cpu_s']:.1f} CPU s, peak RSS {m['suture']['peak_rss_bytes'] / GIB:.2f} GiB."
        for m in more
    )
    full = r["size"] + (PUBLISHED_LAYERS - r["layers"]) * r["layer"]
    grow = full / r["size"]
    scaled = (
        f"At the published {PUBLISHED_LAYERS} layers the folder is {full / GIB:.1f} GiB; scaled by"
        f" bytes, suture's conversion would take about {r['suture']['wall_s'] * grow / 60:.0f} min"
        " (at this load) with its peak RSS about where it is (unscanned, each layer's arrays are"
        f" written on their own, and the largest arrays, the {r['embedding'] / GIB:.2f} GiB"
        " embedding tables, do not grow with the layer count)"
    )
    if "maxtext" in r:
        scaled += (
            f", MaxText's about {r['maxtext']['wall_s'] * grow / 60:.0f} min with a peak RSS near"
            f" {r['maxtext']['peak_rss_bytes'] * grow / GIB:.0f} GiB"
            f" ({r['maxtext']['peak_rss_bytes'] / r['size']:.1f}x the folder, as here)"
        )
    body = f"""## Model families: Qwen3-VL-30B-A3B whole, at full width, to MaxText's layout (`python -m bench.families_qwen3_vl`)

{machine()}; load average (1, 5, 15 min) {", ".join(f"{x:.1f}" for x in load_before)} at the
start and {", ".join(f"{x:.1f}" for x in load_after)} at the end (other work shares the
machine and slows every route). A random HF folder in the published layout of
Qwen3-VL-30B-A3B-Instruct (`model.language_model.` and `model.visual.`; text hidden 2048, 32
query and 4 KV heads of 128, 128 experts of 768 fused as published, `gate_up_proj` (E, H, 2I)
and `down_proj` (E, I, H), vocab 151936, untied `lm_head`; the vision tower whole: 27 blocks of
hidden 1152, MLP 4304, fused `qkv`, 2304 positions, deepstack mergers after blocks 8, 16, 24;
bfloat16, sharded with an index: embeddings, tower, one text layer per shard) with
{r["layers"]} text layers: {r["size"] / GIB:.2f} GiB, of which the tower {r["tower"] / GIB:.2f}
GiB. Each route cold (page cache dropped) in a fresh process; MaxText 0.2.5's `to_maxtext` runs
`model_name=qwen3-vl-30b-a3b use_multimodal=True scan_layers=False lazy_load_tensors=False
save_dtype=bfloat16` (its multimodal path refuses lazy loading and reads the whole folder into
memory; here with numpy, as its environment has no torch) with its built-in HF config's layer
count set to the folder's.

| route | wall | wall / cold read | CPU s (user + sys) | peak RSS |
| --- | --- | --- | --- | --- |
{chr(10).join(routes)}

{beside}{alone}

{scaled}.
"""
    write_section("families-qwen3-vl", body)
    print(body)


if __name__ == "__main__":
    main()
