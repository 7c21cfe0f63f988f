"""A Hugging Face folder loaded onto an 8-device mesh: Orbax 0.12.8's safetensors layout
beside `suture.load`, with and without a cast (issue 42, item 3).

    python -m bench.load_mesh [--layers 12] [--repeats 3]

Generates a Llama-shaped float16 folder (hidden 2048, intermediate 5632, vocab 32000) and
loads every tensor onto 8 CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``,
``PartitionSpec("fsdp", None)`` where the first axis divides by 8, replicated otherwise),
as bfloat16 (the cast) and as stored: Orbax with ``ctx.checkpoint_layout = "safetensors"``
and an abstract tree of ``jax.ShapeDtypeStruct``, suture with ``suture.load(folder,
target)``, both targets built from the files' headers. Each load is a fresh process with the
page cache dropped, the routes alternating: wall (from before the load, which opens the
folder, to every array ready; imports excluded), CPU seconds and peak RSS
of the process; both routes must load the same values (a digest of every array, by name).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from bench._common import DATA_DIR, drop_caches, machine, write_section

WORK = DATA_DIR / "load-mesh"
GIB = 1024**3
LLAMA = dict(
    hidden_size=2048,
    intermediate_size=5632,
    num_attention_heads=32,
    num_key_value_heads=4,
    vocab_size=32000,
    rms_norm_eps=1e-5,
    max_position_embeddings=2048,
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    tie_word_embeddings=False,
    rope_theta=10000.0,
)

WORKER = r"""
import json, os, resource, sys, time
route, cast, folder = sys.argv[1:]
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((8,), ("fsdp",))

def sharding(shape):
    return NamedSharding(mesh, P("fsdp", None) if len(shape) == 2 and shape[0] % 8 == 0 else P())

def header(path):
    with open(path, "rb") as stream:
        return json.loads(stream.read(int.from_bytes(stream.read(8), "little")))

names = {}
for file in sorted(os.listdir(folder)):
    if file.endswith(".safetensors"):
        names.update({k: v for k, v in header(os.path.join(folder, file)).items() if k != "__metadata__"})

def dtype(stored):
    return jnp.bfloat16 if cast == "cast" else {"F16": jnp.float16, "BF16": jnp.bfloat16, "F32": jnp.float32}[stored]

if route == "orbax":
    import orbax.checkpoint.experimental.v1 as ocp
    target = {n: jax.ShapeDtypeStruct(tuple(v["shape"]), dtype(v["dtype"]), sharding=sharding(tuple(v["shape"]))) for n, v in names.items()}
    started, cpu = time.perf_counter(), time.process_time()
    ctx = ocp.Context()
    ctx.checkpoint_layout = "safetensors"
    with ctx:
        loaded = ocp.load(folder, target)
else:
    import suture
    target = {}  # the same headers, nested as suture names an HF folder's tensors
    for n, v in names.items():
        *outer, last = n.split(".")
        node = target
        for key in outer:
            node = node.setdefault(key, {})
        node[last] = jax.ShapeDtypeStruct(tuple(v["shape"]), dtype(v["dtype"]), sharding=sharding(tuple(v["shape"])))
    started, cpu = time.perf_counter(), time.process_time()
    loaded = suture.load(folder, target, progress=False)  # opening it counts, as in Orbax
jax.block_until_ready(loaded)
wall, cpu = time.perf_counter() - started, time.process_time() - cpu
leaves = jax.tree.leaves(loaded)
with open("/proc/self/status") as status:  # before the digest gathers each array on the host
    peak = int(next(l for l in status if l.startswith("VmHWM:")).split()[1]) * 1024
import hashlib
digest = hashlib.sha256()  # the values, by dotted name: the routes must agree
flat = jax.tree_util.tree_flatten_with_path(loaded)[0]
named = {".".join(str(getattr(k, "key", k)) for k in path): leaf for path, leaf in flat}
for name in sorted(named):
    digest.update(name.encode() + np.asarray(named[name]).tobytes())
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_rss_bytes": peak, "leaves": len(leaves),
                  "bytes": sum(x.nbytes for x in leaves), "digest": digest.hexdigest()}))
"""


def run_route(route: str, cast: str, folder: Path) -> dict:
    drop_caches()
    environment = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, route, cast, str(folder)],
        capture_output=True,
        text=True,
        env=environment,
    )
    if done.returncode:
        raise RuntimeError(f"{route} {cast} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    from bench.families import generate

    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    folder = WORK / "hf"
    try:
        size = generate(folder, {**LLAMA, "num_hidden_layers": args.layers}, "float16")
        runs: dict[tuple[str, str], list[dict]] = {}
        for _ in range(args.repeats):
            for cast in ("cast", "as-stored"):
                for route in ("orbax", "suture"):
                    runs.setdefault((route, cast), []).append(run_route(route, cast, folder))
    finally:
        shutil.rmtree(WORK, ignore_errors=True)

    for cast in ("cast", "as-stored"):
        digests = {r["digest"] for route in ("orbax", "suture") for r in runs[(route, cast)]}
        if len(digests) != 1:
            raise SystemExit(f"The routes loaded different values ({cast}).")

    def median(route: str, cast: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[(route, cast)])

    rows = []
    for cast in ("cast", "as-stored"):
        for route in ("orbax", "suture"):
            each = runs[(route, cast)]
            ratio = {
                key: median(route, cast, key) / median("orbax", cast, key)
                for key in ("wall_s", "cpu_s", "peak_rss_bytes")
            }
            walls, cpus, peaks = (
                ", ".join(format(r[key] / scale, spec) for r in each)
                for key, scale, spec in (
                    ("wall_s", 1, ".2f"),
                    ("cpu_s", 1, ".1f"),
                    ("peak_rss_bytes", GIB, ".2f"),
                )
            )
            dtype = "to bfloat16" if cast == "cast" else "as stored"
            rows.append(
                f"| {route} | {dtype} | {walls} | {cpus} | {peaks} | {ratio['wall_s']:.2f}x / "
                f"{ratio['cpu_s']:.2f}x / {ratio['peak_rss_bytes']:.2f}x |"
            )
    table = "\n".join(rows)
    body = f"""## Loading an HF folder onto an 8-device mesh, beside Orbax's safetensors layout (`python -m bench.load_mesh`)

`python -m bench.load_mesh --layers {args.layers} --repeats {args.repeats}` — {machine()}.
A Llama-shaped float16 folder ({size / GIB:.2f} GiB: hidden 2048, intermediate 5632, vocab
32000, {args.layers} layers) loaded onto 8 CPU devices (`PartitionSpec("fsdp", None)` where
the first axis divides by 8, replicated otherwise); each load a fresh process, page cache
dropped, routes alternating. Orbax 0.12.8: `ocp.load` under `checkpoint_layout =
"safetensors"` with a `jax.ShapeDtypeStruct` tree; suture: `suture.load(folder, target)`.

| route | dtype | wall s (each) | CPU s (each) | peak RSS GiB (each) | median wall / CPU / RSS against Orbax |
| --- | --- | --- | --- | --- | --- |
{table}
"""
    write_section("load-mesh", body)
    print(body)


if __name__ == "__main__":
    main()
