"""Overlapped stages: a conversion from this checkout beside one from another, same folder.

    git archive <commit> src | tar -x -C /tmp/base
    python -m bench.overlap --base-src /tmp/base/src [--layers 2] [--repeats 2] [--keep DIR]

Generates the full-width Qwen3-MoE folder of ``bench.families_moe`` (``--layers`` layers,
one per shard; kept in ``--keep DIR`` across runs when given), then alternates ``suture
convert --recipe qwen3-moe:maxtext`` from this checkout's ``src`` and from ``--base-src``,
each cold in a fresh process (page cache dropped), beside a cold ``cp -r`` of the folder:
wall, CPU seconds (user + system) and peak RSS of each, and the load average when each
started (the machine is shared: CPU seconds are steadier than wall time).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

from bench._common import DATA_DIR, REPO_ROOT, machine, write_section
from bench.families import timed
from bench.families_moe import QWEN3_30B_A3B, generate

GIB = 1024**3


def convert(src: Path, hf: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    command = ["env", f"PYTHONPATH={src}", sys.executable, "-m", "suture", "convert"]
    command += [str(hf), str(out), "--recipe", "qwen3-moe:maxtext", "--no-progress"]
    load = os.getloadavg()[0]
    try:
        return {**timed(command), "load": load}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-src", type=Path, required=True, help="the other checkout's src")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="a folder to generate the model in once")
    args = parser.parse_args()
    work = DATA_DIR / "overlap"
    hf = args.keep or work / "hf"
    work.mkdir(parents=True, exist_ok=True)
    try:
        if not (hf / "config.json").exists():
            generate(hf, {**QWEN3_30B_A3B, "num_hidden_layers": args.layers})
        size = sum(f.stat().st_size for f in hf.glob("*.safetensors"))
        copied = timed(["cp", "-r", str(hf), str(work / "copy")])
        shutil.rmtree(work / "copy")
        runs: dict[str, list[dict]] = {"base": [], "this": []}
        for _ in range(args.repeats):
            for name, src in (("base", args.base_src), ("this", REPO_ROOT / "src")):
                runs[name].append(convert(src.resolve(), hf, work / "out"))
    finally:
        shutil.rmtree(work / "copy", ignore_errors=True)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)

    def row(name: str, each: list[dict]) -> str:
        walls = ", ".join(f"{r['wall_s']:.1f}" for r in each)
        cpus = ", ".join(f"{r['cpu_s']:.1f}" for r in each)
        loads = ", ".join(f"{r['load']:.1f}" for r in each)
        wall = statistics.median(r["wall_s"] for r in each)
        peak = max(r["peak_rss_bytes"] for r in each) / GIB
        return (
            f"| {name} | {walls} | {wall / copied['wall_s']:.2f}x | {cpus} | {peak:.2f} GiB "
            f"| {loads} |"
        )

    body = f"""## Overlapped stages: a conversion beside the same one from another checkout (`python -m bench.overlap`)

`python -m bench.overlap --base-src BASE/src --layers {args.layers} --repeats {args.repeats}` —
{machine()}. Full-width Qwen3-MoE folder of `bench.families_moe`, {args.layers} layers,
{size / GIB:.2f} GiB; `suture convert --recipe qwen3-moe:maxtext`, cold, fresh process,
the two checkouts alternating. Cold `cp -r` of the folder: {copied["wall_s"]:.1f} s,
{copied["cpu_s"]:.1f} CPU s.

| checkout | wall (s, each run) | median wall / cold copy | CPU s (each run) | peak RSS | load average at start |
| --- | --- | --- | --- | --- | --- |
{row("base (`--base-src`)", runs["base"])}
{row("this checkout", runs["this"])}
"""
    write_section("overlap", body)
    print(body)


if __name__ == "__main__":
    main()
