"""One Kimi-K2.6 MoE layer, compressed-tensors INT4 -> bfloat16 MaxText in one pass (issue 39).

    python -m bench.kimi [--experts 128] [--repeats 2] [--maxtext-venv DIR [--peer-experts 6]]

The source: Kimi K2.6 as published (``KimiK25ForConditionalGeneration``: the causal LM under
``language_model.``, the ``quantization_config`` in ``text_config``, a vision tower beside it),
cut to one MoE layer at full width: hidden 7168, `--experts` routed experts (128 of 384) of
width 2048, each ``gate_proj``/``up_proj``/``down_proj`` packed by compressed-tensors
(``weight_packed`` int32, eight 4-bit values a word; ``weight_scale`` bfloat16 per 32 inputs;
``weight_shape``), the shared expert, the router and its bias, and the layer's multi-head latent
attention (64 heads), in bfloat16. MaxText's DeepSeek converter needs a dense layer first
(K2.6's layer 0): it is there with its full attention and an MLP of width 256 (K2.6's is
18432), and the vocabulary has 1024 rows (K2.6's 163840), so that the MoE layer is nearly all
the bytes. One tensor of a vision tower stands for K2.6's (left out by both routes).

The route: ``suture convert SRC OUT --recipe kimi-k2:maxtext --dequantize`` (bfloat16 Orbax,
default budget), each run in a fresh process after dropping the page cache. Floors, in the same
run: a cold read of the source (``cat``) and an fsync'd write of the output's size (``dd``).
One expert of the output is checked against compressed-tensors' own decompressor (bfloat16).

MaxText 0.2.5's own route for these checkpoints is ``convert_deepseek_family_ckpt.py``
(``--model_size kimi-k2.6-text``): it dequantizes every INT4 weight as it loads the whole
checkpoint into a dict, then stacks and saves, so it holds the model in memory. With
``--maxtext-venv DIR`` (MaxText 0.2.5's environment, with torch, which the script imports) it
runs beside suture (`bench/_kimi_maxtext.py`), cold, on a source of `--peer-experts` experts
(the same layer with fewer experts, so that its memory fits this machine), and suture runs on
that source too. Everything made is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from bench._common import (
    DATA_DIR,
    REPO_ROOT,
    drop_caches,
    folder_bytes,
    machine,
    write_safetensors_shards,
    write_section,
)

HIDDEN, MOE, DENSE, VOCAB, HEADS = 7168, 2048, 256, 1024, 64
Q_RANK, KV_RANK, NOPE, ROPE, V = 1536, 512, 128, 64, 128
GROUP = 32
FULL = dict(layers=61, experts=384, vocab=163840, dense=18432)  # Kimi K2.6's text model
SHARD_BYTES = 4 << 30
ROOT = DATA_DIR / "kimi"
SOURCE, ONE = ROOT / "int4", ROOT / "suture"
LM = "language_model."
GiB = 1 << 30
CHECKED_EXPERT = 3
ITEMSIZE = {"I32": 4, "F32": 4, "BF16": 2}


def attention(layer: int) -> list[tuple[str, tuple[int, ...], str]]:
    p = f"{LM}model.layers.{layer}"
    return [
        (f"{p}.input_layernorm.weight", (HIDDEN,), "BF16"),
        (f"{p}.post_attention_layernorm.weight", (HIDDEN,), "BF16"),
        (f"{p}.self_attn.q_a_proj.weight", (Q_RANK, HIDDEN), "BF16"),
        (f"{p}.self_attn.q_a_layernorm.weight", (Q_RANK,), "BF16"),
        (f"{p}.self_attn.q_b_proj.weight", (HEADS * (NOPE + ROPE), Q_RANK), "BF16"),
        (f"{p}.self_attn.kv_a_proj_with_mqa.weight", (KV_RANK + ROPE, HIDDEN), "BF16"),
        (f"{p}.self_attn.kv_a_layernorm.weight", (KV_RANK,), "BF16"),
        (f"{p}.self_attn.kv_b_proj.weight", (HEADS * (NOPE + V), KV_RANK), "BF16"),
        (f"{p}.self_attn.o_proj.weight", (HIDDEN, HEADS * V), "BF16"),
    ]


def mlp(prefix: str, width: int) -> list[tuple[str, tuple[int, ...], str]]:
    shapes = {
        "gate_proj": (width, HIDDEN),
        "up_proj": (width, HIDDEN),
        "down_proj": (HIDDEN, width),
    }
    return [(f"{prefix}.{name}.weight", shape, "BF16") for name, shape in shapes.items()]


def packed(prefix: str) -> list[tuple[str, tuple[int, ...], str]]:
    """A routed expert as compressed-tensors stores it: words, scales, logical shape."""
    found = []
    for name, (rows, cols) in {
        "gate_proj": (MOE, HIDDEN),
        "up_proj": (MOE, HIDDEN),
        "down_proj": (HIDDEN, MOE),
    }.items():
        found.append((f"{prefix}.{name}.weight_packed", (rows, cols // 8), "I32"))
        found.append((f"{prefix}.{name}.weight_scale", (rows, cols // GROUP), "BF16"))
        found.append((f"{prefix}.{name}.weight_shape", (2,), "I32"))
    return found


def tensors(experts: int) -> list[tuple[str, tuple[int, ...], str]]:
    """``(name, shape, safetensors dtype)`` of the source, in the published order."""
    found = [
        (f"{LM}model.embed_tokens.weight", (VOCAB, HIDDEN), "BF16"),
        (f"{LM}model.norm.weight", (HIDDEN,), "BF16"),
        (f"{LM}lm_head.weight", (VOCAB, HIDDEN), "BF16"),
        ("vision_tower.patch_embed.proj.weight", (1152, 3, 14, 14), "BF16"),
    ]
    found += attention(0) + mlp(f"{LM}model.layers.0.mlp", DENSE) + attention(1)
    moe = f"{LM}model.layers.1.mlp"
    for expert in range(experts):
        found += packed(f"{moe}.experts.{expert}")
    found += mlp(f"{moe}.shared_experts", MOE)
    found.append((f"{moe}.gate.weight", (experts, HIDDEN), "BF16"))
    found.append((f"{moe}.gate.e_score_correction_bias", (experts,), "F32"))
    return found


def values(name: str, shape: tuple[int, ...], dtype: str, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    if name.endswith("weight_shape"):
        rows_cols = {"down_proj": (HIDDEN, MOE)}.get(name.split(".")[-2], (MOE, HIDDEN))
        return np.array(rows_cols, np.int32)
    if dtype == "I32":  # every nibble value, as INT4 codes use them
        return rng.integers(-(1 << 31), 1 << 31, shape, dtype=np.int64).astype(np.int32)
    if dtype == "F32":
        return rng.standard_normal(shape, dtype=np.float32) * 0.01
    std = 1e-3 if name.endswith("weight_scale") else 0.02
    floats = rng.standard_normal(shape, dtype=np.float32) * std
    if name.endswith("weight_scale"):  # positive, as a symmetric scale is
        floats = np.abs(floats) + std / 4
    return (floats.view(np.uint32) >> 16).astype(np.uint16)


def text_config(experts: int) -> dict:
    """K2.6's text_config (model_type kimi_k2) with this layer's counts."""
    quantization = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 4,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": GROUP,
                    "dynamic": False,
                    "observer": "minmax",
                },
                "input_activations": None,
                "output_activations": None,
            }
        },
        "ignore": [
            "lm_head",
            "re:.*self_attn.*",
            "re:.*shared_experts.*",
            "re:.*mlp\\.(gate|up|down)_proj.*",
        ],
        "kv_cache_scheme": None,
    }
    return {
        "model_type": "kimi_k2",
        "architectures": ["DeepseekV3ForCausalLM"],
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": DENSE,
        "moe_intermediate_size": MOE,
        "num_hidden_layers": 2,
        "first_k_dense_replace": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "n_routed_experts": experts,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "n_group": 1,
        "topk_group": 1,
        "q_lora_rank": Q_RANK,
        "kv_lora_rank": KV_RANK,
        "qk_nope_head_dim": NOPE,
        "qk_rope_head_dim": ROPE,
        "v_head_dim": V,
        "num_nextn_predict_layers": 0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization_config": quantization,
    }


def write_source(experts: int) -> None:
    """Shards written a tensor at a time with the safetensors layout (header, then bytes)."""
    config = {
        "model_type": "kimi_k25",
        "architectures": ["KimiK25ForConditionalGeneration"],
        "tie_word_embeddings": False,
        "text_config": text_config(experts),
        "vision_config": {"hidden_size": 1152, "patch_size": 14},
    }
    write_safetensors_shards(SOURCE, tensors(experts), ITEMSIZE, SHARD_BYTES, values, config)


_TIMED = r"""
import json, resource, subprocess, sys, time
started = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
wall = time.perf_counter() - started
if done.returncode:
    sys.stderr.write(done.stderr.decode()[-4000:]); sys.exit(done.returncode)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
                  "sys_s": usage.ru_stime, "peak_rss_bytes": usage.ru_maxrss * 1024}))
"""


def timed(command: list[str], env: dict | None = None) -> dict:
    """Wall, CPU seconds and peak RSS of `command`, run cold in a fresh process."""
    cold = drop_caches()
    done = subprocess.run(
        [sys.executable, "-c", _TIMED, *command],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
    )
    if done.returncode:
        raise RuntimeError(f"{command[:4]} failed:\n{done.stderr[-4000:]}")
    return {**json.loads(done.stdout), "cold": cold}


def floors(output_bytes: int) -> dict:
    files = [str(p) for p in sorted(SOURCE.glob("*.safetensors"))]
    read = timed(["sh", "-c", 'cat "$@" > /dev/null', "cat", *files])
    target = ROOT / "write_floor.bin"
    count = max(1, output_bytes // (64 << 20))
    write = timed(
        [
            "dd",
            "if=/dev/zero",
            f"of={target}",
            "bs=64M",
            f"count={count}",
            "conv=fsync",
            "status=none",
        ]
    )
    target.unlink()
    share = output_bytes / (count * (64 << 20))
    return {"read_s": read["wall_s"], "write_s": write["wall_s"] * share}


WI_0 = "decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/wi_0"


def expected_expert():  # noqa: ANN201
    """Expert CHECKED_EXPERT's gate_proj as compressed-tensors' decompressor gives it (bf16),
    transposed as MaxText holds it."""
    import ml_dtypes
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from safetensors import safe_open

    name = f"{LM}model.layers.1.mlp.experts.{CHECKED_EXPERT}.gate_proj"
    weight_map = json.loads((SOURCE / "model.safetensors.index.json").read_text())["weight_map"]
    state = {}
    for key in ("weight_packed", "weight_scale", "weight_shape"):
        with safe_open(SOURCE / weight_map[f"{name}.{key}"], "pt") as file:
            state[key] = file.get_tensor(f"{name}.{key}")
    state["weight_scale"] = state["weight_scale"].float()  # float32: the contract
    args = QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=GROUP
    )
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    weight = PackedQuantizationCompressor.decompress(state, scheme)["weight"]
    return weight.to(torch.float32).numpy().T.astype(ml_dtypes.bfloat16)


def leaf(folder: Path, path: str):  # noqa: ANN201
    import suture

    ckpt = suture.open(folder)
    found = [key for key in ckpt.paths() if key.endswith(path)]
    return ckpt[found[0]]


def params_count(layers: int, experts: int, vocab: int, dense: int) -> int:
    """Parameters of a K2.6-shaped text model (layer 0 dense, the others MoE)."""
    attn = sum(math.prod(shape) for _, shape, _ in attention(0))
    moe_layer = experts * 3 * MOE * HIDDEN + 3 * MOE * HIDDEN + experts * HIDDEN + experts
    return (
        2 * vocab * HIDDEN + HIDDEN + layers * attn + 3 * dense * HIDDEN + (layers - 1) * moe_layer
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--compression",
        default="auto",
        choices=["auto", "zstd", "none"],
        help="suture's --compression (zstd and none: sections of their own, kimi-zstd and "
        "kimi-none)",
    )
    parser.add_argument("--maxtext-venv", type=Path, help="MaxText 0.2.5's environment (torch)")
    parser.add_argument(
        "--peer-experts",
        type=int,
        default=6,
        help="experts of MaxText's run (its peak: ~1.4 GiB each)",
    )
    arguments = parser.parse_args()
    import numpy as np

    load = os.getloadavg()
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    suture_cli = [sys.executable, "-m", "suture", "convert", str(SOURCE), str(ONE)]
    suture_cli += ["--recipe", "kimi-k2:maxtext", "--dequantize", "--no-progress"]
    suture_cli += ["--compression", arguments.compression]
    env = {"PYTHONPATH": str(REPO_ROOT / "src"), "SUTURE_TUNE_ALLOCATOR": "1"}
    runs: list[dict] = []
    try:
        write_source(arguments.experts)
        source_bytes = folder_bytes(SOURCE)
        expected = expected_expert()
        for _ in range(arguments.repeats):
            shutil.rmtree(ONE, ignore_errors=True)
            runs.append(timed(suture_cli, env))
            got = leaf(ONE, WI_0)[CHECKED_EXPERT, 0].read()
            np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))
            output_bytes = folder_bytes(ONE)
        shutil.rmtree(ONE)  # the floor's write needs the room
        floor = floors(output_bytes)
        peer = None
        if arguments.maxtext_venv is not None:
            peer = peer_runs(arguments, suture_cli, env)
    finally:
        shutil.rmtree(ROOT, ignore_errors=True)
    report(arguments, runs, floor, source_bytes, output_bytes, load, peer)


def maxtext_python(venv: Path) -> Path:
    """The Python of MaxText's environment (made by `bench._maxtext` when missing), with
    torch, which ``convert_deepseek_family_ckpt.py`` imports, installed when it lacks it."""
    from bench._maxtext import ensure_venv

    python = ensure_venv(venv)
    if subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode:
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "torch"], check=True)
    return python


def peer_runs(arguments, suture_cli: list[str], env: dict) -> dict:  # noqa: ANN001
    """suture and MaxText's own script, each cold, on a source of `--peer-experts` experts."""
    experts = arguments.peer_experts
    if experts != arguments.experts:
        write_source(experts)
    python = maxtext_python(arguments.maxtext_venv)
    script = REPO_ROOT / "bench" / "_kimi_maxtext.py"
    theirs = ROOT / "maxtext"
    found = {"experts": experts, "source_bytes": folder_bytes(SOURCE)}
    shutil.rmtree(ONE, ignore_errors=True)
    found["suture"] = timed(suture_cli, env)
    found["suture_bytes"] = folder_bytes(ONE)
    # -P: bench/ holds an inspect.py, which would shadow the standard library's
    found["maxtext"] = timed(
        [str(python), "-P", str(script), str(SOURCE), str(theirs), "2", str(experts)]
    )
    found["maxtext_bytes"] = folder_bytes(theirs)
    found["same"] = same_experts(theirs / "0", min(CHECKED_EXPERT, experts - 1))
    shutil.rmtree(theirs)
    shutil.rmtree(ONE)
    return found


def same_experts(theirs: Path, expert: int) -> str:
    """Whether MaxText's float16 leaves of one expert equal suture's bfloat16 ones cast to
    float16 (its script casts every array to float16 before saving), as a sentence."""
    import numpy as np

    block = "decoder/moe_layers/DeepSeekMoeBlock_0/MoeBlock_0/"
    found = []
    for name in ("wi_0", "wi_1", "wo"):
        ours = leaf(ONE, block + name)[expert, 0].read()
        them = leaf(theirs, block + name)[expert, 0].read()
        ours16 = ours.astype(np.float32).astype(np.float16)
        differ = int(np.count_nonzero(ours16.view(np.uint16) != them.view(np.uint16)))
        found.append(f"`{name}` {differ} of {them.size} differ")
    return f"expert {expert}: " + ", ".join(found)


def report(arguments, runs, floor, source_bytes, output_bytes, load, peer=None) -> None:  # noqa: ANN001
    def median(key: str) -> float:
        return statistics.median(run[key] for run in runs)

    wall, cpu, rss = median("wall_s"), median("cpu_s"), max(r["peak_rss_bytes"] for r in runs) / GiB
    floor_s = floor["read_s"] + floor["write_s"]
    cores = len(os.sched_getaffinity(0))
    cold = all(r["cold"] for r in runs)
    bench_params = params_count(2, arguments.experts, VOCAB, DENSE)
    full_params = params_count(FULL["layers"], FULL["experts"], FULL["vocab"], FULL["dense"])
    scale = full_params / bench_params
    lines = [
        f"| suture: `suture convert SRC OUT --recipe kimi-k2:maxtext --dequantize` | {arguments.experts} "
        f"| {wall:.1f} s | {cpu:.1f} s | **{rss:.2f} GiB** | {output_bytes / GiB:.2f} GiB (bfloat16) |"
    ]
    if peer is None:
        fitted = """
MaxText 0.2.5's own route for Kimi's INT4 checkpoints, `convert_deepseek_family_ckpt.py
--model_size kimi-k2.6-text`, was not run (no `--maxtext-venv`)."""
    else:
        ours, theirs = peer["suture"], peer["maxtext"]
        for name, run in (("suture", ours), ("MaxText", theirs)):
            label = (
                "suture: the same command"
                if name == "suture"
                else "MaxText 0.2.5: `convert_deepseek_family_ckpt.py --model_size kimi-k2.6-text`"
            )
            size = peer["suture_bytes" if name == "suture" else "maxtext_bytes"]
            lines.append(
                f"| {label} | {peer['experts']} | {run['wall_s']:.1f} s | {run['cpu_s']:.1f} s "
                f"| {run['peak_rss_bytes'] / GiB:.2f} GiB | {size / GiB:.2f} GiB |"
            )
        per_expert = (theirs["peak_rss_bytes"] / GiB) / peer["experts"]
        peer_scale = full_params / params_count(2, peer["experts"], VOCAB, DENSE)
        fitted = f"""
- MaxText's own route (`bench/_kimi_maxtext.py`: the script's `main`, with its `kimi-k2.6-text`
  entry's 61 layers and 384 experts set to this source's 2 and {peer["experts"]}, as it reads those from its table
  and not the folder) on a source of {peer["experts"]} experts ({peer["source_bytes"] / GiB:.2f} GiB), each route cold in a
  fresh process: MaxText {theirs["wall_s"] / ours["wall_s"]:.1f}x suture's wall, {theirs["cpu_s"] / ours["cpu_s"]:.1f}x its CPU,
  {theirs["peak_rss_bytes"] / ours["peak_rss_bytes"]:.0f}x its peak RSS. It loads every tensor of the checkpoint into one dict,
  dequantized to bfloat16 as it goes (its `dequantize_pack_quantized_int4`), then stacks and
  saves on 16 simulated devices: its memory grows with the model ({per_expert:.2f} GiB of peak
  an expert here, its fixed part included; 7.9 GiB at 4 experts and 13.5 GiB at 8 when measured
  apart: about 1.4 GiB an expert), which is why it runs on {peer["experts"]} experts and not {arguments.experts}.
  Values ({peer["same"]}): MaxText's float16 leaves against suture's bfloat16 ones cast to
  float16 (its script saves every array as float16). For K2.6's text model it would hold at least the {2 * full_params / 1e12:.2f} TB of bfloat16 it dequantizes (maxtext#4071 reports
  2.3 TB on a 128 GB host), and take about {theirs["wall_s"] * peer_scale / 3600:.1f} h here at this run's rate (suture: about
  {ours["wall_s"] * peer_scale / 3600:.1f} h at its rate on this source). suture's peak stays at its budget."""
    peer_flags = "" if peer is None else f" --maxtext-venv DIR --peer-experts {peer['experts']}"
    compression = arguments.compression
    if compression != "auto":
        peer_flags += f" --compression {compression}"
        lines[0] = lines[0].replace("--dequantize`", f"--dequantize --compression {compression}`")
    body = f"""## kimi: one Kimi-K2.6 MoE layer, compressed-tensors INT4 -> bfloat16 MaxText in one pass (issue 39)

`python -m bench.kimi --experts {arguments.experts} --repeats {arguments.repeats}{peer_flags}` — {machine()};
{"page cache dropped before every run" if cold else "**warm page cache: dropping caches was not permitted**"}; load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} when it started
(other work shares the cores and the disk). Source: K2.6's published layout (`language_model.`
prefix, `quantization_config` in `text_config`, a vision-tower tensor) cut to one MoE layer at
full width: hidden {HIDDEN}, {arguments.experts} of 384 routed experts of width {MOE}, INT4 group {GROUP} as published
(int32 words, bfloat16 scales), the shared expert, router and bias, the layer's attention (64
heads, MLA); before it the dense layer 0 MaxText's converter needs (full attention, MLP width
{DENSE}), a vocabulary of {VOCAB} rows: {source_bytes / GiB:.2f} GiB in shards of 4 GiB with an index.

| route | experts | wall | CPU (user + sys) | peak RSS | written |
| --- | --- | --- | --- | --- | --- |
{chr(10).join(lines)}
| cold floor: `cat` the source + `dd conv=fsync` of suture's output size | {arguments.experts} | {floor_s:.1f} s | | | |

- Floor: reading the source {floor["read_s"]:.1f} s + an fsync'd write of the output's size
  {floor["write_s"]:.1f} s = {floor_s:.1f} s. suture: **{wall / floor_s:.2f}x** the floor (goal: within 1.3x),
  peak RSS **{rss:.2f} GiB** (goal: under 1.5 GiB). Runs (wall s): {", ".join(f"{r['wall_s']:.1f}" for r in runs)}.
- CPU: the pass spends {cpu:.0f} s of CPU ({cpu / (output_bytes / GiB):.1f} s per GiB written: INT4
  decode, bfloat16 rounding, bit-shuffled LZ4 and checksums), {cpu / cores:.0f} s of wall on these {cores} cores
  if it had them to itself ({cpu / cores / floor_s:.2f}x the floor); the floor's `cat` and `dd` do none of
  that work (bench/write_floor.py measures Orbax's write alone against the read).
- Values: expert {CHECKED_EXPERT}'s `gate_proj` in suture's output equals compressed-tensors' decompressor
  (bfloat16) bit for bit.
- Extrapolated to K2.6's whole text model (61 layers, 384 experts, vocabulary 163840: {full_params / 1e9:.0f}B
  parameters, {scale:.0f}x this source's): suture's pass streams, so its memory stays at this
  budget and its wall grows with the bytes: about {wall * scale / 3600:.1f} h here (the floor
  {floor_s * scale / 3600:.1f} h), {2 * full_params / 1e12:.2f} TB of bfloat16 written.
{fitted}
"""
    stored = {
        "zstd": ("chunks zstd-compressed as Orbax writes them", "zstd and its checksums"),
        "none": ("chunks stored uncompressed", "crc32c checksums, no compression"),
    }
    if compression in stored:
        chunks, work = stored[compression]
        body = body.replace("in one pass (issue 39)", f"in one pass, {chunks} (issue 39)", 1)
        body = body.replace("bit-shuffled LZ4 and checksums", work)
    write_section("kimi" if compression == "auto" else f"kimi-{compression}", body)
    print(body)


if __name__ == "__main__":
    main()
