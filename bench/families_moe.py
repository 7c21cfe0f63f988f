"""A mixture-of-experts model at full width to MaxText's layout: suture beside MaxText.

    python -m bench.families_moe [--layers 8 16] [--maxtext-venv PATH [--maxtext-layers 8]]

Generates a random Qwen3-30B-A3B-shaped Hugging Face folder (hidden 2048, 32 query and 4 KV
heads of 128, 128 experts of 768, vocab 151936, bfloat16, one tensor per expert as published)
with a few layers, one layer per shard (never more than one shard in memory), drops the page
cache and converts it with ``suture convert --recipe qwen3-moe:maxtext`` in a fresh process:
wall, CPU seconds, peak RSS, beside a cold read of the same files (the floor) and a cold
copy of them (``cp -r``: what reading the source and writing as many bytes costs, with no
transformation at all). Each stacked expert weight, (128 experts, layers, 2048, 768), is the
largest array of the output and is written in pieces. Twice the layers shows that the memory
does not grow with the model.

With ``--maxtext-venv PATH`` (the environment ``bench.families --maxtext-venv`` makes), MaxText
0.2.5's own converter (``to_maxtext``, lazy tensor loading, scanned, bfloat16) runs on the same
folder of ``--maxtext-layers`` layers, cold, in a fresh process, and its tree is compared with
suture's leaf by leaf. MaxText maps names from its built-in 48-layer Qwen3-30B-A3B config: the
launcher sets that config's layer count to the folder's (``hf_config.num_hidden_layers``).
Everything it made is deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from bench import _maxtext
from bench._common import DATA_DIR, folder_bytes, machine, write_hf_shards, write_section
from bench.families import cold_copies, timed

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


def maxtext_settings(layers: int) -> list[str]:
    """MaxText's qwen3-30b-a3b at full width with `layers` layers (its HF config's too):
    scanned, the dense MoE path (megablox kernels need an accelerator)."""
    return [
        "model_name=qwen3-30b-a3b",
        "override_model_config=True",
        f"base_num_decoder_layers={layers}",
        f"hf_config.num_hidden_layers={layers}",
        "sparse_matmul=False",
        "scan_layers=True",
    ]


def run(layers: int, maxtext: Path | None = None) -> dict:
    """Converts a `layers`-layer folder with suture (and MaxText, given its Python), cold."""
    config = {**QWEN3_30B_A3B, "num_hidden_layers": layers}
    shutil.rmtree(WORK, ignore_errors=True)
    hf, out = WORK / "hf", WORK / "maxtext"
    try:
        size = generate(hf, config)
        shards = sorted(str(p) for p in hf.glob("*.safetensors"))
        floor = timed(["sh", "-c", 'cat "$@" > /dev/null', "sh", *shards])
        copied, durable = cold_copies(hf, WORK / "copy")
        suture_cli = str(Path(sys.executable).with_name("suture"))
        converted = timed(
            [suture_cli, "convert", str(hf), str(out), "--recipe", "qwen3-moe:maxtext"]
            + ["--no-progress"]
        )
        import suture

        wi_0 = suture.open(out)["params/params/decoder/layers/moe_block/wi_0"]
        expected = suture.open(hf)[f"model/layers/{layers - 1}/mlp/experts/127/gate_proj/weight"]
        same = np.array_equal(wi_0[127, layers - 1].read(), expected.read().T)
        written = folder_bytes(out)
        # the same conversion with Orbax's own codec for every chunk (--compression zstd)
        plain_out = WORK / "maxtext-plain"
        plain = timed(
            [suture_cli, "convert", str(hf), str(plain_out), "--recipe", "qwen3-moe:maxtext"]
            + ["--no-progress", "--compression", "zstd"]
        )
        plain_leaf = suture.open(plain_out)["params/params/decoder/layers/moe_block/wi_0"]
        same = same and np.array_equal(plain_leaf[127, layers - 1].read(), expected.read().T)
        plain_written = folder_bytes(plain_out)
        shutil.rmtree(plain_out)
        row = dict(
            layers=layers,
            size=size,
            floor=floor,
            copy=copied,
            durable=durable,
            suture=converted,
            leaf=wi_0.nbytes,
            same=same,
            written=written,
            plain=plain,
            plain_written=plain_written,
        )
        if maxtext is not None:
            theirs = WORK / "maxtext-own"
            row["maxtext"] = timed(
                _maxtext.maxtext_command(maxtext, maxtext_settings(layers), hf, theirs)
            )
            row["compared"], _ = _maxtext.compare_trees(theirs / "0" / "items", out)
        return row
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


def _route(name: str, run: dict, floor: dict) -> str:
    return (
        f"| {name} | {run['wall_s']:.1f} s | {run['wall_s'] / floor['wall_s']:.2f}x | "
        f"{run['cpu_s']:.1f} | {run['peak_rss_bytes'] / GIB:.2f} GiB |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--maxtext-venv", type=Path, help="MaxText's environment (bench._maxtext)")
    parser.add_argument(
        "--maxtext-layers", type=int, default=8, help="the layer count MaxText converts too"
    )
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    maxtext = _maxtext.ensure_venv(args.maxtext_venv) if args.maxtext_venv else None
    rows = [
        run(layers, maxtext if layers == args.maxtext_layers else None) for layers in args.layers
    ]
    table = "\n".join(
        f"| {r['layers']} | {r['size'] / GIB:.2f} GiB | {r['leaf'] / GIB:.2f} GiB | "
        f"{r['floor']['wall_s']:.1f} s | {r['copy']['wall_s']:.1f} s "
        f"({r['copy']['wall_s'] / r['floor']['wall_s']:.2f}x) | {r['suture']['wall_s']:.1f} s "
        f"({r['suture']['wall_s'] / r['floor']['wall_s']:.2f}x) | "
        f"**{r['suture']['wall_s'] / r['copy']['wall_s']:.2f}x** | {r['durable']['wall_s']:.1f} s | "
        f"{r['suture']['wall_s'] / r['durable']['wall_s']:.2f}x | {r['suture']['cpu_s']:.1f} | "
        f"{r['suture']['peak_rss_bytes'] / GIB:.2f} GiB | {'yes' if r['same'] else 'NO'} |"
        for r in rows
    )
    plain_table = "\n".join(
        f"| {r['layers']} | {r['suture']['wall_s']:.1f} s ({r['suture']['wall_s'] / r['copy']['wall_s']:.2f}x), "
        f"{r['suture']['cpu_s']:.1f} CPU s, {r['written'] / GIB:.2f} GiB | "
        f"{r['plain']['wall_s']:.1f} s (**{r['plain']['wall_s'] / r['copy']['wall_s']:.2f}x**), "
        f"{r['plain']['cpu_s']:.1f} CPU s, {r['plain_written'] / GIB:.2f} GiB | "
        f"{r['plain']['peak_rss_bytes'] / GIB:.2f} GiB |"
        for r in rows
    )
    beside = "\n\n".join(
        f"""### {r["layers"]} layers of full width, beside MaxText 0.2.5's `to_maxtext` on the same folder

| route | wall | wall / cold read | CPU s | peak RSS |
| --- | --- | --- | --- | --- |
{_route("cold read (`cat`)", r["floor"], r["floor"])}
{_route("cold copy (`cp -r`)", r["copy"], r["floor"])}
{_route("cold copy, fsync'd (`cp -r`, then `sync` of its files)", r["durable"], r["floor"])}
{_route("suture `convert --recipe qwen3-moe:maxtext`", r["suture"], r["floor"])}
{_route("MaxText `to_maxtext` (lazy_load_tensors, scanned, bfloat16)", r["maxtext"], r["floor"])}

Leaf by leaf: """
        + "; ".join(r["compared"])
        + "."
        for r in rows
        if "maxtext" in r
    )
    body = f"""## Model families: a full-width MoE to MaxText's layout (`python -m bench.families_moe`)

{machine()}; load average {load_before:.1f} at the start and {os.getloadavg()[0]:.1f} at the
end (other work on the machine slows every route). Random Qwen3-30B-A3B-shaped HF folders (hidden 2048, 32 query and 4 KV heads of
128, 128 experts of 768, vocab 151936, bfloat16, one tensor per expert as published, one layer
per shard), converted cold with `suture convert HF OUT --recipe qwen3-moe:maxtext` into one
scanned Orbax checkpoint; the floor is a cold read of the same files (`cat > /dev/null`).
"stacked leaf" is one expert weight, `moe_block/wi_0` of shape (128, layers, 2048, 768).

"cold copy" is `cp -r` of the folder, cold: reading the source and writing as many bytes,
with nothing transformed or compressed (the issue's yardstick). `cp` returns while its
writes are still in the page cache; suture returns once its output is on the disk (it fsyncs
every file before publishing the checkpoint), so "fsync'd copy" is `cp -r` followed by
`sync` of the copied files, the copy that does the same.

| layers | source | stacked leaf | floor (cold read) | cold copy | suture wall | suture / cold copy | fsync'd copy | suture / fsync'd copy | suture CPU s | suture peak RSS | last expert checked |
| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
{table}

The same conversions with `--compression zstd` (zstd level 1 for every chunk, Orbax's own
codec and suture's default before bit-shuffled LZ4) in the same run, against the cold copy.

| layers | suture (`auto`, the default): wall (/ cold copy), CPU, written | `--compression zstd`: wall (/ cold copy), CPU, written | its peak RSS |
| --- | --- | --- | --- |
{plain_table}

{beside}
"""
    write_section("families-moe", body)
    print(body)


if __name__ == "__main__":
    main()
