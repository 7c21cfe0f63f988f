"""A stacked checkpoint restored onto an 8-device CPU mesh (fsdp=8): from suture's default
layout, and from the layout `suture reshard` writes for that mesh (issue 42).

The checkpoint: four scanned MLP kernels of MaxText's shape (embed, layers, mlp) =
(2048, 16, 2048) float32, 1 GiB, written by `suture.save` of a lazy stack (its default
chunks: one layer per chunk, 16 MiB). The target: `PartitionSpec("fsdp", None, None)` on
`fsdp=8`, so each device needs 256 of every layer's 2048 rows.

Routes, each a fresh process (page cache dropped before each where permitted):
- restore: stock Orbax `StandardCheckpointer().restore` onto the mesh, from either layout,
  by 4 processes of 2 CPU devices each under `jax.distributed` (as 4 hosts would); bytes
  read are TensorStore's own count of the file bytes each process read, wall the slowest
  process's restore.
- reshard: `suture.save(SRC, OUT, target_sharding=...)` (`suture reshard`), streamed under
  the default 1 GiB budget; beside it the route of MaxText's `reshard_checkpoint.py` (restore
  onto the simulated mesh, then Orbax's save), run with stock Orbax on the same input.

Run from the repository root: `.venv/bin/python -m bench.reshard` (`--repeats N`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench._common import DATA_DIR, drop_caches, machine, peak_rss_bytes, write_section

EMBED, LAYERS, MLP = 2048, 16, 2048
NAMES = ("wi_0", "wi_1", "wo_t", "wq")
SOURCE = DATA_DIR / "reshard_source"
RESHARDED = DATA_DIR / "reshard_output"
PEER_OUTPUT = DATA_DIR / "reshard_peer_output"
RULES = {"leaves": {"params/decoder/layers/.*": ["fsdp", None, None]}}
MESH = "fsdp=8"
DEVICES = 8
PROCESSES = 4


def write_source() -> None:
    if SOURCE.exists():
        return
    DATA_DIR.mkdir(exist_ok=True)
    import numpy as np

    import suture

    rng = np.random.default_rng(0)
    layers = {
        name: suture.stack(
            [rng.standard_normal((EMBED, MLP), dtype=np.float32) for _ in range(LAYERS)], axis=1
        )
        for name in NAMES
    }
    suture.save({"params": {"decoder": {"layers": layers}}}, SOURCE, progress=False)


def _target() -> dict:
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((DEVICES,), ("fsdp",))
    sharding = NamedSharding(mesh, P("fsdp", None, None))
    array = jax.ShapeDtypeStruct((EMBED, LAYERS, MLP), np.float32, sharding=sharding)
    return {"params": {"decoder": {"layers": dict.fromkeys(NAMES, array)}}}


def _tensorstore_bytes_read() -> int:
    import tensorstore as ts

    name = "/tensorstore/kvstore/file/bytes_read"
    found = ts.experimental_collect_matching_metrics(name)
    return sum(v.get("value", 0) for m in found if m["name"] == name for v in m.get("values", []))


def restore_worker(index: str, port: str, path: str) -> None:
    """One of `PROCESSES` processes restoring `path` onto the global fsdp=8 mesh."""
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=PROCESSES,
        process_id=int(index),
        initialization_timeout=120,
    )
    import orbax.checkpoint as ocp

    before, started = _tensorstore_bytes_read(), time.perf_counter()
    restored = ocp.StandardCheckpointer().restore(Path(path).absolute(), _target())
    for layer in restored["params"]["decoder"]["layers"].values():
        layer.block_until_ready()
    wall = time.perf_counter() - started
    needed = sum(
        shard.data.nbytes
        for layer in restored["params"]["decoder"]["layers"].values()
        for shard in layer.addressable_shards
    )
    read = _tensorstore_bytes_read() - before
    print("RESULT", json.dumps({"wall_s": wall, "read": read, "needed": needed}), flush=True)


def worker(route: str, path: str) -> None:
    import orbax.checkpoint as ocp

    import suture

    started = time.perf_counter()
    if route == "reshard":
        shutil.rmtree(RESHARDED, ignore_errors=True)
        target = suture.TargetSharding(MESH, RULES)
        suture.save(SOURCE, RESHARDED, progress=False, target_sharding=target)
    elif route == "peer":  # reshard_checkpoint.py's route: restore onto the mesh, then save
        shutil.rmtree(PEER_OUTPUT, ignore_errors=True)
        restored = ocp.StandardCheckpointer().restore(SOURCE.absolute(), _target())
        with ocp.StandardCheckpointer() as saver:
            saver.save(PEER_OUTPUT.absolute(), restored)
    print(json.dumps({"wall_s": time.perf_counter() - started, "peak_rss_bytes": peak_rss_bytes()}))


def restore(path: Path) -> dict:
    """The restore by `PROCESSES` processes: the slowest wall, the most bytes one read."""
    cold = drop_caches()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES // PROCESSES}",
        "JAX_PLATFORMS": "cpu",
    }
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.reshard",
                "--restore-worker",
                str(i),
                str(port),
                str(path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for i in range(PROCESSES)
    ]
    reports = []
    for process in processes:
        output, _ = process.communicate(timeout=900)
        if process.returncode != 0:
            raise RuntimeError(output)
        line = next(line for line in output.splitlines() if line.startswith("RESULT "))
        reports.append(json.loads(line.removeprefix("RESULT ")))
    return {
        "wall_s": max(r["wall_s"] for r in reports),
        "read": max(r["read"] for r in reports),
        "needed": max(r["needed"] for r in reports),
        "cold": cold,
    }


def run(route: str, path: Path) -> dict:
    """`worker(route, path)` in a fresh process after dropping the page cache."""
    cold = drop_caches()
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES}",
        "JAX_PLATFORMS": "cpu",
    }
    done = subprocess.run(
        [sys.executable, "-m", "bench.reshard", "--worker", route, str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "cold": cold}


def chunk_of(folder: Path) -> tuple[int, ...]:
    import tensorstore as ts

    name = f"params.decoder.layers.{NAMES[0]}"
    kvstore = {"driver": "ocdbt", "base": f"file://{folder.absolute()}", "path": name}
    try:  # suture writes zarr3; Orbax's StandardCheckpointer zarr v2 by default
        metadata = ts.open({"driver": "zarr3", "kvstore": kvstore}).result().spec().to_json()
        return tuple(metadata["metadata"]["chunk_grid"]["configuration"]["chunk_shape"])
    except ValueError:
        metadata = ts.open({"driver": "zarr", "kvstore": kvstore}).result().spec().to_json()
        return tuple(metadata["metadata"]["chunks"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", nargs=2)
    parser.add_argument("--restore-worker", nargs=3)
    arguments = parser.parse_args()
    if arguments.worker:
        worker(*arguments.worker)
        return
    if arguments.restore_worker:
        restore_worker(*arguments.restore_worker)
        return
    write_source()
    runs: dict[str, list[dict]] = {"reshard": [], "peer": [], "default": [], "resharded": []}
    for _ in range(arguments.repeats):  # alternated, so that drift hits every route alike
        runs["reshard"].append(run("reshard", SOURCE))
        runs["peer"].append(run("peer", SOURCE))
        runs["default"].append(restore(SOURCE))
        runs["resharded"].append(restore(RESHARDED))
    write_section("reshard", report(runs))
    print(report(runs))


def report(runs: dict[str, list[dict]]) -> str:
    gib = 1 << 30
    median = {
        route: {key: statistics.median(r[key] for r in results) for key in results[0]}
        for route, results in runs.items()
    }
    cold = all(r["cold"] for results in runs.values() for r in results)
    size = len(NAMES) * EMBED * LAYERS * MLP * 4
    lines = [
        "## reshard: a stacked checkpoint restored onto an 8-device CPU mesh (issue 42)",
        "",
        f"`python -m bench.reshard --repeats {len(runs['default'])}` — {machine()}; each run "
        f"fresh processes, {'page cache dropped before each' if cold else '**warm page cache**'}, "
        f"routes alternated, medians. Input: {len(NAMES)} scanned kernels (embed, layers, mlp) = "
        f"({EMBED}, {LAYERS}, {MLP}) float32, {size / gib:.2f} GiB; target "
        f"`PartitionSpec('fsdp', None, None)` on fsdp={DEVICES}, restored by {PROCESSES} "
        f"`jax.distributed` processes of {DEVICES // PROCESSES} CPU devices each (as "
        f"{PROCESSES} hosts would); bytes read: TensorStore's count of each process's file reads.",
        "",
        "| restore onto fsdp=8 (stock Orbax) | chunk | read per process | per device | of what it needs | wall |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for route, label, folder in (
        ("default", "suture's default layout", SOURCE),
        ("resharded", "after `suture reshard --mesh fsdp=8`", RESHARDED),
    ):
        read, needed = median[route]["read"], median[route]["needed"]
        lines.append(
            f"| {label} | {chunk_of(folder)} | {read / gib:.3f} GiB | "
            f"{read / (DEVICES // PROCESSES) / gib:.3f} GiB | {read / needed:.2f}x | "
            f"{median[route]['wall_s']:.2f} s |"
        )
    lines += [
        "",
        "| reshard | wall | peak RSS |",
        "| --- | --- | --- |",
        f"| `suture reshard` (streamed, default 1 GiB budget) | {median['reshard']['wall_s']:.1f} s "
        f"| {median['reshard']['peak_rss_bytes'] / gib:.2f} GiB |",
        f"| Orbax restore onto the mesh + save (`reshard_checkpoint.py`'s route) | "
        f"{median['peer']['wall_s']:.1f} s | {median['peer']['peak_rss_bytes'] / gib:.2f} GiB |",
        "",
        f"- Both reshards' chunks tile the shards: the peer's {chunk_of(PEER_OUTPUT)} is a "
        f"whole shard (Orbax chunks a sharded array by its shards), suture's "
        f"{chunk_of(RESHARDED)} half of one (its 16 MiB chunk budget).",
        "- Bytes read are the stored (zstd-compressed) bytes, hence under 1x where a process "
        "reads only its shards; from the default layout each process reads every layer's "
        "whole chunk for its quarter of the rows.",
        "- The peer is the route of MaxText's `reshard_checkpoint.py` (restore onto the "
        "simulated mesh, then Orbax's save) run with stock Orbax: the script itself needs a "
        "MaxText model config and its checkpoint, and was not run here.",
        "- Runs (wall s): "
        + "; ".join(
            f"{route} {[round(r['wall_s'], 2) for r in results]}" for route, results in runs.items()
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
