"""One DeepSeek-V3 MoE layer in FP8, dequantized and converted to bfloat16 Orbax: one pass
against two (issue 28).

The source: one MoE layer at DeepSeek-V3's full width, as its published checkpoint stores
it: hidden 7168, `--experts` routed experts (256 by default) and one shared expert of
intermediate 2048, each `gate_proj`/`up_proj`/`down_proj` an F8_E4M3 `weight` with a float32
`weight_scale_inv` per 128 x 128 block, the router (`mlp.gate.weight`, bfloat16) and its
bias; about 11 GiB in shards of about 4 GiB with `model.safetensors.index.json` and a
`config.json` holding the FP8 `quantization_config`. Written a tensor at a time (random FP8
bytes, NaN codes excluded; scales around 1e-3).

Routes, each in a fresh process after dropping the page cache:
- one pass: `suture convert SRC OUT --dequantize` (Orbax, bfloat16), default budget;
- two passes: the reference dequantization, then `suture convert BF16 OUT`. The reference
  is DeepSeek-V3's `inference/fp8_cast_bf16.py` loop (each shard loaded whole with
  `safetensors.torch.load_file`, every weight with a scale dequantized, the shard saved as
  bfloat16 with `save_file`, the index rewritten without the scales), with transformers'
  CPU `Fp8Dequantize` in place of its Triton `weight_dequant` (which needs a GPU).

Floors, in the same run: a cold read of the source (`cat`) and an fsync'd write of the
one-pass output's size (`dd`). Values of one expert are checked against transformers'
dequantization in each output as soon as it is written. At full size the outputs do not
all fit beside the source on a small disk, so each route's output is deleted once checked
and measured (the bfloat16 copy once converted), and where the disk cannot hold the source,
the bfloat16 copy and the two-pass output at once, the last repeat deletes the source once
the copy is written. Everything made is deleted at the end. Run from the
repository root: ``.venv/bin/python -m bench.quantized [--experts N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench._common import (
    DATA_DIR,
    drop_caches,
    folder_bytes,
    machine,
    peak_rss_bytes,
    write_safetensors_shards,
    write_section,
)

HIDDEN, INTERMEDIATE, BLOCK = 7168, 2048, 128
SHARD_BYTES = 4 << 30  # DeepSeek-V3's shards hold about 4.3 GB
ROOT = DATA_DIR / "quantized"
SOURCE, BF16, ONE, TWO = ROOT / "fp8", ROOT / "bf16", ROOT / "one_pass", ROOT / "two_pass"
PREFIX = "model.layers.3.mlp"  # DeepSeek-V3's first MoE layer
GiB = 1 << 30


def tensors(experts: int) -> list[tuple[str, tuple[int, ...], str]]:
    """``(name, shape, safetensors dtype)`` of the layer, in the published order."""
    found: list[tuple[str, tuple[int, ...], str]] = []
    projections = {"down_proj": (HIDDEN, INTERMEDIATE), "gate_proj": (INTERMEDIATE, HIDDEN)}
    projections["up_proj"] = (INTERMEDIATE, HIDDEN)
    owners = [f"{PREFIX}.experts.{e}" for e in range(experts)] + [f"{PREFIX}.shared_experts"]
    for owner in owners:
        for projection, shape in projections.items():
            name = f"{owner}.{projection}.weight"
            found.append((name, shape, "F8_E4M3"))
            scales = (math.ceil(shape[0] / BLOCK), math.ceil(shape[1] / BLOCK))
            found.append((f"{name}_scale_inv", scales, "F32"))
    found.append((f"{PREFIX}.gate.weight", (experts, HIDDEN), "BF16"))
    found.append((f"{PREFIX}.gate.e_score_correction_bias", (experts,), "F32"))
    return found


ITEMSIZE = {"F8_E4M3": 1, "F32": 4, "BF16": 2}


def values(shape: tuple[int, ...], dtype: str, seed: int):
    import numpy as np

    rng = np.random.default_rng(seed)
    if dtype == "F8_E4M3":
        raw = rng.integers(0, 256, shape, dtype=np.uint8)
        raw[(raw & 0x7F) == 0x7F] = 0x40  # E4M3's two NaN codes -> 2.0
        return raw
    if dtype == "F32":
        return (rng.random(shape, dtype=np.float32) * 2e-3 + 1e-4).astype(np.float32)
    return (rng.standard_normal(shape, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)


def write_source(experts: int) -> None:
    """Shards written a tensor at a time with the safetensors layout (header, then bytes)."""
    if (SOURCE / "model.safetensors.index.json").exists():
        return
    config = {
        "model_type": "deepseek_v3",
        "hidden_size": HIDDEN,
        "moe_intermediate_size": INTERMEDIATE,
        "n_routed_experts": experts,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [BLOCK, BLOCK],
        },
    }
    write_safetensors_shards(
        SOURCE,
        tensors(experts),
        ITEMSIZE,
        SHARD_BYTES,
        lambda name, shape, dtype, seed: values(shape, dtype, seed),
        config,
    )


def reference_dequantize() -> None:
    """DeepSeek-V3's fp8_cast_bf16.py, on CPU: transformers' Fp8Dequantize as weight_dequant."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    dequantize = Fp8Dequantize(None)._dequantize_one
    BF16.mkdir(parents=True)
    index = json.loads((SOURCE / "model.safetensors.index.json").read_text())
    weight_map = index["weight_map"]
    for shard in sorted(set(weight_map.values())):
        state = load_file(SOURCE / shard)
        out = {}
        for name, tensor in state.items():
            if name.endswith("_scale_inv"):
                continue
            if tensor.element_size() == 1:  # FP8: its scale may sit in another shard
                scale_name = f"{name}_scale_inv"
                scale = state.get(scale_name)
                if scale is None:
                    scale = load_file(SOURCE / weight_map[scale_name])[scale_name]
                out[name] = dequantize(tensor, scale, output_dtype=torch.bfloat16)
            else:
                out[name] = tensor
        save_file(out, BF16 / shard, metadata={"format": "pt"})
        del state, out
    index["weight_map"] = {k: v for k, v in weight_map.items() if not k.endswith("_scale_inv")}
    (BF16 / "model.safetensors.index.json").write_text(json.dumps(index))
    config = json.loads((SOURCE / "config.json").read_text())
    del config["quantization_config"]
    (BF16 / "config.json").write_text(json.dumps(config))


def worker(route: str) -> None:
    import suture

    started = time.perf_counter()
    if route == "one":
        suture.convert(SOURCE, ONE, dequantize=True, progress=False)
    elif route == "dequantize":
        reference_dequantize()
    else:
        suture.convert(BF16, TWO, progress=False)
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "wall_s": wall,
                "peak_rss_bytes": peak_rss_bytes(),
                "cpu_s": usage.ru_utime + usage.ru_stime,
                "sys_s": usage.ru_stime,
            }
        )
    )


def run(route: str) -> dict:
    cold = drop_caches()
    environment = {**os.environ, "SUTURE_TUNE_ALLOCATOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.quantized", "--worker", route],
        capture_output=True,
        text=True,
        env=environment,
    )
    if done.returncode:
        raise RuntimeError(f"{route} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["cold"] = cold
    return result


def timed(command: list[str]) -> tuple[float, float]:
    """Wall seconds of `command` and the CPU seconds it took (user and system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def floors(output_bytes: int) -> dict:
    drop_caches()
    files = [str(p) for p in sorted(SOURCE.glob("*.safetensors"))]
    read, read_cpu = timed(["sh", "-c", 'cat "$@" > /dev/null', "cat", *files])
    target = ROOT / "write_floor.bin"
    count = max(1, output_bytes // (64 << 20))
    write, write_cpu = timed(
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
    return {
        "read_s": read,
        "write_s": write * share,
        "read_cpu_s": read_cpu,
        "write_cpu_s": write_cpu * share,
    }


CHECKED = f"{PREFIX}.experts.1.up_proj.weight"


def expected_values():  # noqa: ANN201
    """One expert's weight as transformers' FP8 dequantization gives it, in bfloat16."""
    import ml_dtypes
    import torch
    from safetensors import safe_open
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    name = CHECKED
    shard = json.loads((SOURCE / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(SOURCE / shard[name], "pt") as file:  # one tensor, not the whole shard
        weight = file.get_tensor(name)
    with safe_open(SOURCE / shard[name + "_scale_inv"], "pt") as file:
        scale = file.get_tensor(name + "_scale_inv")
    expected = Fp8Dequantize(None)._dequantize_one(weight, scale, output_dtype=torch.float32)
    return expected.numpy().astype(ml_dtypes.bfloat16)


def check_values(output: Path, expected) -> None:  # noqa: ANN001
    import numpy as np

    import suture

    path = CHECKED.replace(".", "/")
    np.testing.assert_array_equal(suture.open(output)[path].read(), expected)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--experts", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the source afterwards")
    arguments = parser.parse_args()
    ROOT.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()  # other work on the machine slows every route alike
    write_source(arguments.experts)
    source_bytes = folder_bytes(SOURCE)
    expected = expected_values()
    # On disk at once: the source and one output, then the source and the bfloat16 copy
    # (twice the source's bytes), then the copy and the two-pass output. Where that last
    # does not fit beside the source, the last repeat deletes the source once the copy is
    # written (nothing reads it after that).
    free = shutil.disk_usage(ROOT).free
    if free < 2 * 2 * source_bytes - source_bytes:
        raise SystemExit(f"{free / GiB:.1f} GiB free: too little for the routes")
    drop_source = free < 2 * 2 * source_bytes + (4 << 30)  # 4 GiB to spare
    results: dict[str, list[dict]] = {"one": [], "dequantize": [], "two": []}
    written: dict[str, int] = {}
    floor: dict = {}
    try:
        for repeat in range(arguments.repeats):
            for folder in (ONE, TWO, BF16):
                shutil.rmtree(folder, ignore_errors=True)
            results["one"].append(run("one"))
            check_values(ONE, expected)
            written["one"] = folder_bytes(ONE)
            shutil.rmtree(ONE)
            if not floor:
                floor = floors(written["one"])
            results["dequantize"].append(run("dequantize"))
            written["bf16"] = folder_bytes(BF16)
            if drop_source and repeat == arguments.repeats - 1:
                shutil.rmtree(SOURCE)
            results["two"].append(run("two"))
            shutil.rmtree(BF16)
            check_values(TWO, expected)
            written["two"] = folder_bytes(TWO)
            shutil.rmtree(TWO)
    finally:
        for folder in (ONE, TWO, BF16):
            shutil.rmtree(folder, ignore_errors=True)
        if not arguments.keep or drop_source:
            shutil.rmtree(ROOT, ignore_errors=True)
    report(arguments, results, written, floor, source_bytes, load)


def report(arguments, results, written, floor, source_bytes, load) -> None:  # noqa: ANN001
    def median(route: str, key: str) -> float:
        return statistics.median(run[key] for run in results[route])

    def peak(route: str) -> float:
        return max(r["peak_rss_bytes"] for r in results[route]) / GiB

    one_wall, deq_wall, two_wall = (median(r, "wall_s") for r in ("one", "dequantize", "two"))
    one_cpu, deq_cpu, two_cpu = (median(r, "cpu_s") for r in ("one", "dequantize", "two"))
    one_sys = median("one", "sys_s")
    floor_s = floor["read_s"] + floor["write_s"]
    floor_cpu = floor["read_cpu_s"] + floor["write_cpu_s"]
    source_gib = source_bytes / GiB
    cold = all(r["cold"] for runs in results.values() for r in runs)
    full = arguments.experts == 256
    size = "full size" if full else f"**REDUCED: {arguments.experts} of 256 experts**"
    body = f"""## quantized: one DeepSeek-V3 MoE layer, FP8 -> bfloat16 Orbax, one pass against two (issue 28)

`python -m bench.quantized --experts {arguments.experts} --repeats {arguments.repeats}` — {machine()}; {size};
median of {arguments.repeats} run(s) per route, each a fresh process, {"page cache dropped before every run" if cold else "**warm page cache: dropping caches was not permitted**"};
load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min) when it started (other work shares the cores).
Source: one MoE layer at full width (hidden {HIDDEN}, {arguments.experts} routed experts + 1 shared of
intermediate {INTERMEDIATE}, F8_E4M3 with float32 128x128 block scales, bfloat16 router):
{source_gib:.2f} GiB in shards with an index. Each route's output is deleted once measured.

| route | wall | CPU (user + sys) | peak RSS | bytes written |
| --- | --- | --- | --- | --- |
| one pass: `suture convert SRC OUT --dequantize` | {one_wall:.1f} s | {one_cpu:.1f} s | {peak("one"):.2f} GiB | {written["one"] / GiB:.2f} GiB |
| two passes, 1: reference dequantization (fp8_cast_bf16.py's loop, CPU) | {deq_wall:.1f} s | {deq_cpu:.1f} s | {peak("dequantize"):.2f} GiB | {written["bf16"] / GiB:.2f} GiB |
| two passes, 2: `suture convert BF16 OUT` | {two_wall:.1f} s | {two_cpu:.1f} s | {peak("two"):.2f} GiB | {written["two"] / GiB:.2f} GiB |
| two passes, total | {deq_wall + two_wall:.1f} s | {deq_cpu + two_cpu:.1f} s | {max(peak("dequantize"), peak("two")):.2f} GiB | {(written["bf16"] + written["two"]) / GiB:.2f} GiB |
| cold floor: `cat` the source + `dd conv=fsync` of the output's size | {floor_s:.1f} s | {floor_cpu:.1f} s | | |

- Cold floor: reading the source {floor["read_s"]:.1f} s + an fsync'd write of the output's size
  {floor["write_s"]:.1f} s = {floor_s:.1f} s. One pass: **{one_wall / floor_s:.2f}x** the floor (goal: within 1.3x);
  peak RSS **{peak("one"):.2f} GiB** (goal: under 1.5 GiB).
- CPU per GiB of source: one pass {one_cpu / source_gib:.2f} s ({one_sys / source_gib:.2f} s of it in the
  kernel), the floor {floor_cpu / source_gib:.2f} s; two passes {(deq_cpu + two_cpu) / source_gib:.2f} s.
- One pass against two: {one_wall / (deq_wall + two_wall):.2f}x the wall, {written["one"] / (written["bf16"] + written["two"]):.2f}x the bytes
  written (the two-pass route also writes a {written["bf16"] / GiB:.2f} GiB bfloat16 copy).
- Values of an expert checked against transformers' FP8 dequantization, in both outputs.
- Runs (wall s): one {", ".join(f"{r['wall_s']:.1f}" for r in results["one"])}; reference
  {", ".join(f"{r['wall_s']:.1f}" for r in results["dequantize"])}; convert {", ".join(f"{r['wall_s']:.1f}" for r in results["two"])}.
"""
    write_section("quantized", body)
    print(body)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
