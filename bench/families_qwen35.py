"""Qwen3.5 at full width to MaxText's layout: suture beside a cold copy and MaxText's converter.

    python -m bench.families_qwen35 [--layers 8] [--maxtext-venv PATH [--maxtext-layers 8]]

Generates a random Qwen3.5-35B-A3B-shaped Hugging Face folder in the published layout (the
language model under ``model.language_model.``, a multimodal config with its ``text_config``;
hidden 2048, 16 query and 2 KV heads of 256, Gated DeltaNet with 16 key and 32 value heads of
128, 256 fused experts of 512 and a shared expert, vocab 248320, bfloat16; no vision tower, to
spare the disk) with a few layers, one layer per shard, drops the page cache and converts it
with ``suture convert --recipe qwen3.5:maxtext`` in a fresh process: wall, CPU seconds and peak
RSS, beside a cold read and a cold ``cp -r`` of the same files (bench.families_moe's floor and
copy). With ``--maxtext-venv``, MaxText 0.2.5's ``to_maxtext`` (lazy tensor loading, scanned,
bfloat16) runs on the folder of ``--maxtext-layers`` layers, cold, and its tree is compared
with suture's leaf by leaf; suture's output is deleted first, so that the disk holds one output
at a time. Everything it made is deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from bench import _maxtext
from bench._common import DATA_DIR, machine, write_hf_shards, write_section
from bench.families import cold_copies, timed
from bench.families_moe import _route

WORK = DATA_DIR / "families-qwen35"
GIB = 1024**3
LM = "model.language_model"
QWEN35_35B_A3B = dict(  # the published config.json's text_config
    hidden_size=2048,
    num_attention_heads=16,
    num_key_value_heads=2,
    head_dim=256,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    num_experts=256,
    num_experts_per_tok=8,
    vocab_size=248320,
    rms_norm_eps=1e-6,
    full_attention_interval=4,
    model_type="qwen3_5_moe_text",
    tie_word_embeddings=False,
    attention_bias=False,
)


def _layer(i: int, c: dict) -> dict[str, tuple[int, ...]]:
    e, m, x = c["hidden_size"], c["moe_intermediate_size"], c["num_experts"]
    at = f"{LM}.layers.{i}"
    shapes = {
        f"{at}.input_layernorm.weight": (e,),
        f"{at}.post_attention_layernorm.weight": (e,),
        f"{at}.mlp.gate.weight": (x, e),
        f"{at}.mlp.experts.gate_up_proj": (x, 2 * m, e),
        f"{at}.mlp.experts.down_proj": (x, e, m),
        f"{at}.mlp.shared_expert.gate_proj.weight": (m, e),
        f"{at}.mlp.shared_expert.up_proj.weight": (m, e),
        f"{at}.mlp.shared_expert.down_proj.weight": (e, m),
        f"{at}.mlp.shared_expert_gate.weight": (1, e),
    }
    if i % 4 == 3:
        h, kv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        shapes |= {
            f"{at}.self_attn.q_proj.weight": (2 * h * d, e),  # the query and its output gate
            f"{at}.self_attn.k_proj.weight": (kv * d, e),
            f"{at}.self_attn.v_proj.weight": (kv * d, e),
            f"{at}.self_attn.o_proj.weight": (e, h * d),
            f"{at}.self_attn.q_norm.weight": (d,),
            f"{at}.self_attn.k_norm.weight": (d,),
        }
        return shapes
    keys = c["linear_num_key_heads"] * c["linear_key_head_dim"]
    heads = c["linear_num_value_heads"]
    values = heads * c["linear_value_head_dim"]
    return shapes | {
        f"{at}.linear_attn.in_proj_qkv.weight": (2 * keys + values, e),
        f"{at}.linear_attn.in_proj_z.weight": (values, e),
        f"{at}.linear_attn.in_proj_b.weight": (heads, e),
        f"{at}.linear_attn.in_proj_a.weight": (heads, e),
        f"{at}.linear_attn.conv1d.weight": (2 * keys + values, 1, c["linear_conv_kernel_dim"]),
        f"{at}.linear_attn.A_log": (heads,),
        f"{at}.linear_attn.dt_bias": (heads,),
        f"{at}.linear_attn.norm.weight": (c["linear_value_head_dim"],),
        f"{at}.linear_attn.out_proj.weight": (e, values),
    }


def generate(folder: Path, layers: int) -> int:
    """Writes the HF folder one layer per shard; returns its size in bytes."""
    text = {**QWEN35_35B_A3B, "num_hidden_layers": layers}
    text["layer_types"] = [
        "full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)
    ]
    e, v = text["hidden_size"], text["vocab_size"]
    embeddings = {
        f"{LM}.embed_tokens.weight": (v, e),
        "lm_head.weight": (v, e),
        f"{LM}.norm.weight": (e,),
    }
    shards = [embeddings] + [_layer(i, text) for i in range(layers)]
    config = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False,
        "text_config": text,
    }
    return write_hf_shards(folder, shards, config, "bfloat16")


def maxtext_settings(layers: int) -> list[str]:
    """MaxText's qwen3.5-35b-a3b with `layers` layers (its HF text config's too): scanned, the
    dense MoE path (megablox kernels need an accelerator)."""
    return [
        "model_name=qwen3.5-35b-a3b",
        "override_model_config=True",
        f"base_num_decoder_layers={layers}",
        f"hf_config.text_config.num_hidden_layers={layers}",
        "sparse_matmul=False",
        "scan_layers=True",
    ]


def run(layers: int, maxtext: Path | None = None) -> dict:
    shutil.rmtree(WORK, ignore_errors=True)
    hf, out = WORK / "hf", WORK / "maxtext"
    try:
        size = generate(hf, layers)
        shards = sorted(str(p) for p in hf.glob("*.safetensors"))
        floor = timed(["sh", "-c", 'cat "$@" > /dev/null', "sh", *shards])
        copied, durable = cold_copies(hf, WORK / "copy")
        suture_cli = str(Path(sys.executable).with_name("suture"))
        converted = timed(
            [suture_cli, "convert", str(hf), str(out), "--recipe", "qwen3.5:maxtext"]
            + ["--no-progress"]
        )
        import suture

        last = f"params/params/decoder/layers/layer_{(layers - 1) % 4}/mlp/routed_experts/wi_1"
        wi_1 = suture.open(out)[last]
        fused = suture.open(hf)[
            f"{LM.replace('.', '/')}/layers/{layers - 1}/mlp/experts/gate_up_proj"
        ]
        up = fused[255].read()[512:]
        same = np.array_equal(wi_1[255, (layers - 1) // 4].read(), up.T)
        # the same conversion with Orbax's own codec for every chunk (--compression zstd)
        plain_out = WORK / "maxtext-plain"
        plain = timed(
            [suture_cli, "convert", str(hf), str(plain_out), "--recipe", "qwen3.5:maxtext"]
            + ["--no-progress", "--compression", "zstd"]
        )
        plain_leaf = suture.open(plain_out)[last]
        same = same and np.array_equal(plain_leaf[255, (layers - 1) // 4].read(), up.T)
        shutil.rmtree(plain_out)
        row = dict(layers=layers, size=size, floor=floor, copy=copied, suture=converted, same=same)
        row["plain"] = plain
        row["durable"] = durable
        row["leaf"] = wi_1.nbytes
        if maxtext is not None:
            theirs = WORK / "maxtext-own"
            keep = {  # a few leaves of suture's output, to compare once it is deleted
                path: suture.open(out)[path].read()
                for path in (
                    last,
                    "params/params/decoder/layers/layer_0/attention/in_proj_qkvz/kernel",
                )
            }
            shutil.rmtree(out)
            row["maxtext"] = timed(
                _maxtext.maxtext_command(maxtext, maxtext_settings(layers), hf, theirs)
            )
            mine = suture.open(theirs / "0" / "items")
            row["compared"] = [
                f"`{path.removeprefix('params/params/')}` "
                + ("bit-identical" if np.array_equal(mine[path].read(), value) else "DIFFERS")
                for path, value in keep.items()
            ]
        return row
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, nargs="+", default=[8])
    parser.add_argument("--maxtext-venv", type=Path, help="MaxText's environment (bench._maxtext)")
    parser.add_argument("--maxtext-layers", type=int, default=8)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    maxtext = _maxtext.ensure_venv(args.maxtext_venv) if args.maxtext_venv else None
    rows = [run(n, maxtext if n == args.maxtext_layers else None) for n in args.layers]
    sections = []
    for r in rows:
        routes = [
            _route("cold read (`cat`)", r["floor"], r["floor"]),
            _route("cold copy (`cp -r`)", r["copy"], r["floor"]),
            _route(
                "cold copy, fsync'd (`cp -r`, then `sync` of its files)", r["durable"], r["floor"]
            ),
            _route("suture `convert --recipe qwen3.5:maxtext`", r["suture"], r["floor"]),
            _route(
                "suture, the same with `--compression zstd` (Orbax's codec)", r["plain"], r["floor"]
            ),
        ]
        if "maxtext" in r:
            routes.append(
                _route("MaxText `to_maxtext` (lazy, scanned, bf16)", r["maxtext"], r["floor"])
            )
        sections.append(
            f"""### {r["layers"]} layers: {r["size"] / GIB:.2f} GiB, stacked `wi_1` {r["leaf"] / GIB:.2f} GiB

| route | wall | wall / cold read | CPU s | peak RSS |
| --- | --- | --- | --- | --- |
{chr(10).join(routes)}

suture / cold copy: **{r["suture"]["wall_s"] / r["copy"]["wall_s"]:.2f}x**; suture / fsync'd copy:
{r["suture"]["wall_s"] / r["durable"]["wall_s"]:.2f}x; with `--compression zstd` (zstd level 1 for
every chunk, as Orbax writes): **{r["plain"]["wall_s"] / r["copy"]["wall_s"]:.2f}x** the cold copy. Last layer's last
expert checked against the source: {"yes" if r["same"] else "NO"}."""
            + (
                " Beside MaxText's output: " + "; ".join(r["compared"]) + "."
                if "compared" in r
                else ""
            )
        )
    body = f"""## Model families: Qwen3.5 at full width to MaxText's layout (`python -m bench.families_qwen35`)

{machine()}; load average {load_before:.1f} at the start and {os.getloadavg()[0]:.1f} at the
end. Random Qwen3.5-35B-A3B-shaped HF folders in the published layout (`model.language_model.`,
fused experts; hidden 2048, 16 query and 2 KV heads of 256, Gated DeltaNet 16 key and 32
value heads of 128, 256 experts of 512 and a shared expert, vocab 248320, bfloat16, one layer
per shard, no vision tower), converted cold with `suture convert HF OUT --recipe
qwen3.5:maxtext`; floor and copy as in `bench.families_moe`.

{(chr(10) * 2).join(sections)}
"""
    write_section("families-qwen35", body)
    print(body)


if __name__ == "__main__":
    main()
