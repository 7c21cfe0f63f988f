"""HF Llama -> MaxText layout with a built-in family recipe, at 7B size, against MaxText's converter.

    python -m bench.families [--dtype float32|float16] [--layers 32] [--maxtext-venv PATH [--maxtext-only]]
    python -m bench.families --maxtext-venv PATH --maxtext-families [--families NAME,...]

Generates a random Llama-2-7B-shaped Hugging Face folder (hidden 4096, intermediate 11008,
32 heads, vocab 32000) shard by shard (never more than one shard in memory), drops the page
cache, and converts it with ``suture convert --recipe llama2:maxtext --dtype bfloat16`` (MaxText
saves bfloat16 by default) in a fresh process: wall, CPU seconds, peak RSS. The floor is a
cold read of the source (``cat > /dev/null``) in the same run. Values are checked against the
HF tensors for the first and last layer. Everything it made is deleted at the end.

MaxText's own converter (``maxtext.checkpoint_conversion.to_maxtext``) holds the whole model in
memory in its eager mode: about 0.8 GB + 1.7x the model (measured by the issue on a 1.66 GB
Llama); the 7B row records that estimate. With ``--maxtext-venv PATH`` (created with Python
3.12 and ``maxtext==0.2.5`` when missing; never a suture dependency) the benchmark also runs
MaxText's converter and suture on one smaller random Llama 3.1 folder (MaxText's converter maps
HF names from its built-in Llama-3.1-8B config, so the folder keeps its 32 layers and head_dim
128 and shrinks the width) and compares wall, CPU seconds, peak RSS and the two output trees
(paths, shapes, dtypes, values) in a section of its own (``--maxtext-only`` runs just that).
``--maxtext-families`` does the same for Qwen2.5, Qwen3-MoE, Mixtral, DeepSeek-V3, gpt-oss,
Gemma 3, OLMo 3, DeepSeek-V2 and Kimi K2-Thinking (INT4 experts), scanned and unscanned, and runs MaxText's model on suture's
scanned outputs of some (`bench/_maxtext_families.py`); ``--families olmo3,deepseek2`` runs only
those, into a section of their own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench import _maxtext, _maxtext_families
from bench._common import (
    DATA_DIR,
    REPO_ROOT,
    drop_caches,
    folder_bytes,
    machine,
    write_hf_shards,
    write_section,
)

WORK = DATA_DIR / "families"
LLAMA2_7B = dict(
    hidden_size=4096,
    intermediate_size=11008,
    num_attention_heads=32,
    num_key_value_heads=32,
    vocab_size=32000,
    rms_norm_eps=1e-5,
    max_position_embeddings=4096,
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    tie_word_embeddings=False,
    rope_theta=10000.0,
)
GIB = 1024**3


def _tensors_of_layer(i: int, config: dict) -> dict[str, tuple[int, ...]]:
    e, m, h = config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]
    d = e // h
    prefix = f"model.layers.{i}"
    return {
        f"{prefix}.self_attn.q_proj.weight": (h * d, e),
        f"{prefix}.self_attn.k_proj.weight": (config["num_key_value_heads"] * d, e),
        f"{prefix}.self_attn.v_proj.weight": (config["num_key_value_heads"] * d, e),
        f"{prefix}.self_attn.o_proj.weight": (e, h * d),
        f"{prefix}.mlp.gate_proj.weight": (m, e),
        f"{prefix}.mlp.up_proj.weight": (m, e),
        f"{prefix}.mlp.down_proj.weight": (e, m),
        f"{prefix}.input_layernorm.weight": (e,),
        f"{prefix}.post_attention_layernorm.weight": (e,),
    }


def generate(folder: Path, config: dict, dtype: str, layers_per_shard: int = 4) -> int:
    """Writes the HF folder shard by shard (embeddings first, then `layers_per_shard` layers
    each); returns its size in bytes."""
    e, v = config["hidden_size"], config["vocab_size"]
    layers = config["num_hidden_layers"]
    shards = [
        {"model.embed_tokens.weight": (v, e), "lm_head.weight": (v, e), "model.norm.weight": (e,)}
    ]
    for first in range(0, layers, layers_per_shard):
        group = range(first, min(first + layers_per_shard, layers))
        shards.append(
            {name: shape for i in group for name, shape in _tensors_of_layer(i, config).items()}
        )
    return write_hf_shards(folder, shards, config, dtype)


_TIMED = r"""
import json, resource, subprocess, sys, time
started = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
wall = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
if done.returncode:
    sys.stderr.write(done.stderr.decode()[-3000:]); sys.exit(done.returncode)
print(json.dumps({"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
                  "peak_rss_bytes": usage.ru_maxrss * 1024}))
"""


def timed(command: list[str], cwd: Path = REPO_ROOT) -> dict:
    """Wall, CPU seconds and peak RSS of `command` run cold in a fresh process."""
    cold = drop_caches()
    done = subprocess.run(
        [sys.executable, "-c", _TIMED, *command], capture_output=True, text=True, cwd=cwd
    )
    if done.returncode:
        raise RuntimeError(f"{command[:3]} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout), "cold": cold}


def cold_copies(folder: Path, copy: Path) -> tuple[dict, dict]:
    """A cold ``cp -r`` of `folder`, and one followed by an fsync of every copied file.

    `cp` returns with its writes still in the page cache, where suture's conversion returns
    once its output is on the disk (it fsyncs every file before publishing): the second is
    the copy that does the same, measured so that the two can be read side by side.
    """
    copied = timed(["cp", "-r", str(folder), str(copy)])
    shutil.rmtree(copy)
    durable = timed(["sh", "-c", 'cp -r "$1" "$2" && sync "$2"/*', "sh", str(folder), str(copy)])
    shutil.rmtree(copy)
    return copied, durable


def check_values(hf: Path, out: Path, config: dict) -> float:
    """Max abs difference of layer 0 and the last layer's q/o/gate against the HF tensors, in bf16."""
    import ml_dtypes

    import suture

    ckpt, source = suture.open(out), suture.open(hf)
    h = config["num_attention_heads"]
    e = config["hidden_size"]
    d = e // h
    worst = 0.0
    for layer in (0, config["num_hidden_layers"] - 1):
        q_hf = np.asarray(source[f"model/layers/{layer}/self_attn/q_proj/weight"], np.float32)
        expected = (q_hf.T.reshape(e, h, d) / np.float32(np.sqrt(d))).astype(ml_dtypes.bfloat16)
        got = ckpt["params/params/decoder/layers/self_attention/query/kernel"][:, layer].read()
        worst = max(
            worst, float(np.max(np.abs(got.astype(np.float32) - expected.astype(np.float32))))
        )
        wo = np.asarray(source[f"model/layers/{layer}/mlp/down_proj/weight"]).T.astype(
            ml_dtypes.bfloat16
        )
        got = ckpt["params/params/decoder/layers/mlp/wo/kernel"][:, layer].read()
        worst = max(worst, float(np.max(np.abs(got.astype(np.float32) - wo.astype(np.float32)))))
    return worst


def suture_command(hf: Path, out: Path) -> list[str]:
    suture_cli = str(Path(sys.executable).with_name("suture"))
    return [suture_cli, "convert", str(hf), str(out), "--recipe", "llama2:maxtext"] + [
        "--dtype",
        "bfloat16",
        "--no-progress",
    ]


def maxtext_needs(model_bytes: int) -> float:
    return 0.8e9 + 1.7 * model_bytes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument(
        "--maxtext-venv",
        type=Path,
        default=None,
        help="virtual environment with maxtext 0.2.5 (made when missing)",
    )
    parser.add_argument(
        "--maxtext-only",
        action="store_true",
        help="run only the smaller side-by-side comparison with MaxText's converter",
    )
    parser.add_argument(
        "--maxtext-families",
        action="store_true",
        help="with --maxtext-venv: the families of bench/_maxtext_families.py beside MaxText's "
        "converter instead of Llama 3.1 (then stops)",
    )
    parser.add_argument(
        "--families",
        default=None,
        help="with --maxtext-families: only these suture families, comma-separated "
        "(e.g. olmo3,deepseek2), into a RESULTS.md section of their own",
    )
    args = parser.parse_args()
    if args.families and not (args.maxtext_venv and args.maxtext_families):
        parser.error("--families selects among --maxtext-families (with --maxtext-venv)")
    if args.maxtext_venv is not None and args.maxtext_families:
        python = _maxtext.ensure_venv(args.maxtext_venv)
        only = args.families.split(",") if args.families else None
        _maxtext_families.compare(python, timed=timed, only=only)
        return
    if args.maxtext_venv is not None:
        _maxtext.compare(_maxtext.ensure_venv(args.maxtext_venv), timed=timed, generate=generate)
    if args.maxtext_only:
        return
    config = {**LLAMA2_7B, "num_hidden_layers": args.layers}
    shutil.rmtree(WORK, ignore_errors=True)
    hf, out = WORK / "hf", WORK / "maxtext"
    try:
        started = time.perf_counter()
        size = generate(hf, config, args.dtype)
        generated_s = time.perf_counter() - started
        shards = sorted(str(p) for p in hf.glob("*.safetensors"))
        floor = timed(["sh", "-c", 'cat "$@" > /dev/null', "sh", *shards])
        copies = cold_copies(hf, WORK / "copy")
        suture_run = timed(suture_command(hf, out))
        difference = check_values(hf, out, config)
        written = folder_bytes(out)
        shutil.rmtree(out)  # room for the same conversion with Orbax's own codec
        plain_run = timed(suture_command(hf, out) + ["--compression", "zstd"])
        difference = max(difference, check_values(hf, out, config))
        plain_written = folder_bytes(out)
        suture_run.update(written=written, plain=plain_run, plain_written=plain_written)
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        needed = maxtext_needs(size)
        # MaxText 0.2.5's to_maxtext converts llama3.1 but not llama2; its Llama 2 route is
        # standalone_scripts/llama_or_mistral_ckpt.py (torch, the whole model in memory).
        if needed > memory:
            maxtext_line = (
                f"not run: its converter holds the model, about 0.8 GB + 1.7 x {size / GIB:.1f} GiB "
                f"= {needed / GIB:.1f} GiB, more than this machine's {memory / GIB:.1f} GiB. "
                "Measured side by side on a smaller Llama 3.1 below."
            )
        else:
            maxtext_line = (
                f"not run at this size (estimate {needed / GIB:.1f} GiB on a shared machine); "
                "measured side by side on a smaller Llama 3.1 below."
            )
        report(args, config, size, generated_s, floor, copies, suture_run, difference, maxtext_line)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


def report(
    args, config, size, generated_s, floor, copies, suture_run, difference, maxtext_line
) -> None:
    copied, durable = copies
    wall = suture_run["wall_s"]
    rss = suture_run["peak_rss_bytes"] / GIB
    plain = suture_run["plain"]
    body = f"""## Model families: HF Llama -> MaxText layout (`python -m bench.families --dtype {args.dtype}`)

{machine()}. A random Llama-2-7B-shaped HF folder ({config["num_hidden_layers"]} layers, hidden
{config["hidden_size"]}, {args.dtype}): {size / GIB:.2f} GiB in {config["num_hidden_layers"] // 4 + 1} shards (generated in
{generated_s:.0f} s), converted cold with `suture convert --recipe llama2:maxtext --dtype bfloat16`
(MaxText's default save dtype) into one scanned Orbax checkpoint.

| route | wall | CPU s | peak RSS |
| --- | --- | --- | --- |
| cold read of the source (`cat > /dev/null`), the floor | {floor["wall_s"]:.1f} s | {floor["cpu_s"]:.1f} | {floor["peak_rss_bytes"] / 2**20:.0f} MiB |
| cold copy (`cp -r` of the folder) | {copied["wall_s"]:.1f} s | {copied["cpu_s"]:.1f} | {copied["peak_rss_bytes"] / 2**20:.0f} MiB |
| cold copy, fsync'd (`cp -r`, then `sync` of its files) | {durable["wall_s"]:.1f} s | {durable["cpu_s"]:.1f} | {durable["peak_rss_bytes"] / 2**20:.0f} MiB |
| suture convert --recipe llama2:maxtext | {wall:.1f} s ({wall / floor["wall_s"]:.2f}x the floor, **{wall / copied["wall_s"]:.2f}x the cold copy**, {wall / durable["wall_s"]:.2f}x the fsync'd copy) | {suture_run["cpu_s"]:.1f} | {rss:.2f} GiB |
| suture, the same with `--compression zstd` (Orbax's codec for every chunk) | {plain["wall_s"]:.1f} s ({plain["wall_s"] / floor["wall_s"]:.2f}x the floor, **{plain["wall_s"] / copied["wall_s"]:.2f}x the cold copy**, {plain["wall_s"] / durable["wall_s"]:.2f}x the fsync'd copy) | {plain["cpu_s"]:.1f} | {plain["peak_rss_bytes"] / GIB:.2f} GiB |
| MaxText `to_maxtext` | {maxtext_line} | | |

Written: {suture_run["written"] / GIB:.2f} GiB with suture's default (bit-shuffled LZ4 for
bfloat16), {suture_run["plain_written"] / GIB:.2f} GiB with `--compression zstd` (level 1, Orbax's).

Values checked against the HF tensors (query and MLP-out kernels of the first and last layer,
in bfloat16): max abs difference {difference:g}. Page cache dropped before each route:
{suture_run["cold"]}.
"""
    write_section("families", body)
    print(body)


if __name__ == "__main__":
    main()
