"""A mixture-of-experts model at full width to MaxText's layout: suture's memory and wall.

    python -m bench.families_moe [--layers 8 16]

Generates a random Qwen3-30B-A3B-shaped Hugging Face folder (hidden 2048, 32 query and 4 KV
heads of 128, 128 experts of 768, vocab 151936, bfloat16, one tensor per expert as published)
with a few layers, one layer per shard (never more than one shard in memory), drops the page
cache and converts it with ``suture convert --recipe qwen3-moe:maxtext`` in a fresh process:
wall, CPU seconds, peak RSS, beside a cold read of the same files (the floor). Each stacked
expert weight, (128 experts, layers, 2048, 768), is the largest array of the output and is
written in pieces. Twice the layers shows that the memory does not grow with the model.
MaxText's own converter is not run at this size: it maps names from its built-in 48-layer
config, so it converts only a 48-layer model (``--maxtext-families`` compares it on a narrow
one). Everything it made is deleted at the end.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

from bench._common import DATA_DIR, machine, write_hf_shards, write_section
from bench.families import timed

WORK = DATA_DIR / "families-moe"
GIB = 1024**3
QWEN3_30B_A3B = dict(
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    vocab_size=151936,
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
    model_type="qwen3_moe",
    architectures=["Qwen3MoeForCausalLM"],
    tie_word_embeddings=False,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
)


def _layer(i: int, config: dict) -> dict[str, tuple[int, ...]]:
    e, m, d = config["hidden_size"], config["moe_intermediate_size"], config["head_dim"]
    h, kv = config["num_attention_heads"], config["num_key_value_heads"]
    prefix = f"model.layers.{i}"
    shapes = {
        f"{prefix}.self_attn.q_proj.weight": (h * d, e),
        f"{prefix}.self_attn.k_proj.weight": (kv * d, e),
        f"{prefix}.self_attn.v_proj.weight": (kv * d, e),
        f"{prefix}.self_attn.o_proj.weight": (e, h * d),
        f"{prefix}.self_attn.q_norm.weight": (d,),
        f"{prefix}.self_attn.k_norm.weight": (d,),
        f"{prefix}.mlp.gate.weight": (config["num_experts"], e),
        f"{prefix}.input_layernorm.weight": (e,),
        f"{prefix}.post_attention_layernorm.weight": (e,),
    }
    for x in range(config["num_experts"]):
        shapes[f"{prefix}.mlp.experts.{x}.gate_proj.weight"] = (m, e)
        shapes[f"{prefix}.mlp.experts.{x}.up_proj.weight"] = (m, e)
        shapes[f"{prefix}.mlp.experts.{x}.down_proj.weight"] = (e, m)
    return shapes


def generate(folder: Path, config: dict) -> int:
    """Writes the HF folder one layer per shard; returns its size in bytes."""
    e, v, layers = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
    embeddings = {
        "model.embed_tokens.weight": (v, e),
        "lm_head.weight": (v, e),
        "model.norm.weight": (e,),
    }
    shards = [embeddings] + [_layer(i, config) for i in range(layers)]
    return write_hf_shards(folder, shards, config, "bfloat16")


def run(layers: int) -> dict:
    config = {**QWEN3_30B_A3B, "num_hidden_layers": layers}
    shutil.rmtree(WORK, ignore_errors=True)
    hf, out = WORK / "hf", WORK / "maxtext"
    try:
        size = generate(hf, config)
        shards = sorted(str(p) for p in hf.glob("*.safetensors"))
        floor = timed(["sh", "-c", 'cat "$@" > /dev/null', "sh", *shards])
        suture_cli = str(Path(sys.executable).with_name("suture"))
        converted = timed(
            [suture_cli, "convert", str(hf), str(out), "--recipe", "qwen3-moe:maxtext"]
            + ["--no-progress"]
        )
        import suture

        wi_0 = suture.open(out)["params/params/decoder/layers/moe_block/wi_0"]
        expected = suture.open(hf)[f"model/layers/{layers - 1}/mlp/experts/127/gate_proj/weight"]
        same = np.array_equal(wi_0[127, layers - 1].read(), expected.read().T)
        return dict(
            layers=layers, size=size, floor=floor, suture=converted, leaf=wi_0.nbytes, same=same
        )
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 16])
    rows = [run(layers) for layers in parser.parse_args().layers]
    table = "\n".join(
        f"| {r['layers']} | {r['size'] / GIB:.2f} GiB | {r['leaf'] / GIB:.2f} GiB | "
        f"{r['floor']['wall_s']:.1f} s | {r['suture']['wall_s']:.1f} s "
        f"({r['suture']['wall_s'] / r['floor']['wall_s']:.2f}x) | {r['suture']['cpu_s']:.1f} | "
        f"{r['suture']['peak_rss_bytes'] / GIB:.2f} GiB | {'yes' if r['same'] else 'NO'} |"
        for r in rows
    )
    body = f"""## Model families: a full-width MoE to MaxText's layout (`python -m bench.families_moe`)

{machine()}. Random Qwen3-30B-A3B-shaped HF folders (hidden 2048, 32 query and 4 KV heads of
128, 128 experts of 768, vocab 151936, bfloat16, one tensor per expert as published, one layer
per shard), converted cold with `suture convert HF OUT --recipe qwen3-moe:maxtext` into one
scanned Orbax checkpoint; the floor is a cold read of the same files (`cat > /dev/null`).
"stacked leaf" is one expert weight, `moe_block/wi_0` of shape (128, layers, 2048, 768).

| layers | source | stacked leaf | floor (cold read) | suture wall | suture CPU s | suture peak RSS | last expert checked |
| --- | --- | --- | --- | --- | --- | --- | --- |
{table}

MaxText's own converter is not run at this size: it takes the layer count from its built-in
48-layer qwen3-30b-a3b config and converts only a 48-layer model (the side-by-side section
compares it on a narrow 48-layer one).
"""
    write_section("families-moe", body)
    print(body)


if __name__ == "__main__":
    main()
