"""Overlapped stages: a conversion from this checkout beside one from another, same folder.

    git archive <commit> src | tar -x -C /tmp/base
    python -m bench.overlap --base-src /tmp/base/src [--layers 2] [--repeats 2] [--keep DIR]
        [--recipe qwen3.5:maxtext]

Generates the full-width Qwen3-MoE folder of ``bench.families_moe`` (``--layers`` layers,
one per shard; kept in ``--keep DIR`` across runs when given), or with ``--recipe
qwen3.5:maxtext`` the Qwen3.5 folder of ``bench.families_qwen35`` (a multiple of 4 layers),
then alternates ``suture convert --recipe RECIPE`` from this checkout's ``src`` and from ``--base-src``,
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

from bench import families_qwen35
from bench._common import DATA_DIR, REPO_ROOT, machine, write_section
from bench.families import timed
from bench.families_moe import QWEN3_30B_A3B, generate

RECIPES = ("qwen3-moe:maxtext", "qwen3.5:maxtext")

GIB = 1024**3


def convert(src: Path, hf: Path, out: Path, recipe: str) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    command = ["env", f"PYTHONPATH={src}", sys.executable, "-m", "suture", "convert"]
    command += [str(hf), str(out), "--recipe", recipe, "--no-progress"]
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
    parser.add_argument("--recipe", choices=RECIPES, default=RECIPES[0])
    parser.add_argument(
        "--no-record", action="store_true", help="print the table; leave bench/RESULTS.md as is"
    )
    args = parser.parse_args()
    qwen35 = args.recipe == "qwen3.5:maxtext"
    work = DATA_DIR / "overlap"
    hf = args.keep or work / "hf"
    work.mkdir(parents=True, exist_ok=True)
    try:
        if not (hf / "config.json").exists() and qwen35:
            families_qwen35.generate(hf, args.layers)
        elif not (hf / "config.json").exists():
            generate(hf, {**QWEN3_30B_A3B, "num_hidden_layers": args.layers})
        size = sum(f.stat().st_size for f in hf.glob("*.safetensors"))
        copied = timed(["cp", "-r", str(hf), str(work / "copy")])
        shutil.rmtree(work / "copy")
        runs: dict[str, list[dict]] = {"base": [], "this": []}
        for _ in range(args.repeats):
            for name, src in (("base", args.base_src), ("this", REPO_ROOT / "src")):
                runs[name].append(convert(src.resolve(), hf, work / "out", args.recipe))
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

    recipe_flag = f" --recipe {args.recipe}" if qwen35 else ""
    model, generator = ("Qwen3.5", "families_qwen35") if qwen35 else ("Qwen3-MoE", "families_moe")
    body = f"""## Overlapped stages: a conversion beside the same one from another checkout (`python -m bench.overlap`)

`python -m bench.overlap --base-src BASE/src --layers {args.layers} --repeats {args.repeats}{recipe_flag}` —
{machine()}. Full-width {model} folder of `bench.{generator}`, {args.layers} layers,
{size / GIB:.2f} GiB; `suture convert --recipe {args.recipe}`, cold, fresh process,
the two checkouts alternating. Cold `cp -r` of the folder: {copied["wall_s"]:.1f} s,
{copied["cpu_s"]:.1f} CPU s.

| checkout | wall (s, each run) | median wall / cold copy | CPU s (each run) | peak RSS | load average at start |
| --- | --- | --- | --- | --- | --- |
{row("base (`--base-src`)", runs["base"])}
{row("this checkout", runs["this"])}
"""
    if not args.no_record:
        write_section("overlap-qwen35" if qwen35 else "overlap", body)
    print(body)


if __name__ == "__main__":
    main()
