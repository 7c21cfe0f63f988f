"""What writing Orbax's default format costs on this machine, beside a cold read of as many bytes.

    python -m bench.write_floor [--gib 4]

The family and quantized benchmarks hold suture's conversions to 1.3x a cold read of the
source. A conversion also writes its output in Orbax's default layout (OCDBT, zarr3 chunks
compressed with zstd level 1 and checksummed), as MaxText's converter does. This benchmark
measures that write alone, done by stock Orbax from arrays already in memory (no reading, no
transformation), beside a cold read of the same number of bytes (`cat` of a raw file, after
the page cache is dropped), in the same run and on the same disk. The arrays are random
normal values times 0.02 in bfloat16, shaped like a MoE model's stacked expert weights
(128 experts x layers x 2048 x 768), as the other benchmarks generate them. Each step runs in
a fresh process; everything it made is deleted at the end.

If stock Orbax's write alone takes longer than 1.3x the cold read, no tool that reads a
model and writes Orbax's default layout can finish within 1.3x of the cold read here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench._common import DATA_DIR, drop_caches, machine, write_section
from bench.families import timed

WORK = DATA_DIR / "write-floor"
GIB = 1024**3
LEAF = (128, 2048, 768)  # one layer of one stacked expert weight, in bfloat16: 384 MiB

_WRITE = r"""
import json, os, resource, sys, time
import ml_dtypes, numpy as np
import orbax.checkpoint as ocp
import suture
layers, path = int(sys.argv[1]), sys.argv[2]
block = (np.random.default_rng(0).standard_normal(1_000_003, dtype=np.float32) * 0.02)
block = block.astype(ml_dtypes.bfloat16)
shape = (128, layers, 2048, 768)
tree = {name: np.resize(np.roll(block, 7919 * k), shape) for k, name in enumerate(["wi_0", "wi_1", "wo"])}
before = resource.getrusage(resource.RUSAGE_SELF)
started = time.perf_counter()
if os.environ.get("BENCH_WRITER") == "suture":
    suture.save(tree, path, progress=False)
else:
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, tree)
    checkpointer.wait_until_finished()
wall = time.perf_counter() - started
after = resource.getrusage(resource.RUSAGE_SELF)
cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
if sys.argv[3:]:
    with open(sys.argv[3], "wb") as raw:  # the same bytes, uncompressed, for the read floor
        for array in tree.values():
            array.tofile(raw)
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "bytes": sum(a.nbytes for a in tree.values())}))
"""


def _write(layers: int, path: Path, writer: str) -> tuple[dict, int]:
    """The write's own wall and CPU (printed by the child), and the bytes it put on disk."""
    drop_caches()
    done = subprocess.run(
        [sys.executable, "-c", _WRITE, str(layers), str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "BENCH_WRITER": writer},
    )
    on_disk = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    shutil.rmtree(path)
    return json.loads(done.stdout.strip().splitlines()[-1]), on_disk


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=4.0, help="bytes written, about")
    args = parser.parse_args()
    layers = max(1, round(args.gib * GIB / (3 * 2 * 128 * 2048 * 768)))
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    try:
        raw = WORK / "raw.bin"
        prepared = subprocess.run(
            [sys.executable, "-c", _WRITE, str(layers), str(WORK / "prepare"), str(raw)],
            capture_output=True,
            text=True,
            check=True,
        )
        shutil.rmtree(WORK / "prepare")
        size = json.loads(prepared.stdout)["bytes"]
        read = timed(["cat", str(raw)])  # drops the page cache first
        raw.unlink()
        write, written = _write(layers, WORK / "orbax", "orbax")
        ours, _ = _write(layers, WORK / "suture", "suture")
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    print(json.dumps({"read": read, "write": write, "suture": ours}, indent=2))
    body = f"""## Writing Orbax's default layout: the floor under every conversion (`python -m bench.write_floor`)

{machine()}. Stock Orbax (`StandardCheckpointer().save`) writing {size / GIB:.2f} GiB of
bfloat16 arrays already in memory (3 stacked expert weights of shape (128, {layers}, 2048, 768),
random normal x 0.02), in Orbax's default layout (OCDBT, zarr chunks, zstd level 1):
{written / GIB:.2f} GiB on disk; `suture.save` writes the same database with zarr3 chunks in its
default codecs (bfloat16 bit-shuffled, then LZ4, with a crc32c; `compression="zstd"` would
write Orbax's). Beside it, a cold read (`cat`, page cache dropped)
of a raw file of the same {size / GIB:.2f} GiB, in the same run. Each in a fresh process; the
write's time and CPU exclude making the arrays.

| route | wall | CPU s | CPU s per GiB | wall / cold read |
| --- | --- | --- | --- | --- |
| cold read (`cat`) | {read["wall_s"]:.1f} s | {read["cpu_s"]:.1f} | {read["cpu_s"] / (size / GIB):.2f} | 1.00x |
| Orbax write from memory | {write["wall_s"]:.1f} s | {write["cpu_s"]:.1f} | {write["cpu_s"] / (size / GIB):.2f} | **{write["wall_s"] / read["wall_s"]:.2f}x** |
| suture.save of the same arrays | {ours["wall_s"]:.1f} s | {ours["cpu_s"]:.1f} | {ours["cpu_s"] / (size / GIB):.2f} | {ours["wall_s"] / read["wall_s"]:.2f}x |

A conversion reads its source and writes this layout; when the write alone takes more than
1.3x the cold read, 1.3x of the cold read is out of reach for any tool writing Orbax's default
layout on this machine, however it reads and transforms.
"""
    write_section("write-floor", body)
    print(body)


if __name__ == "__main__":
    main()
