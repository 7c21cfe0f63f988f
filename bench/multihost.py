"""A 2 GiB streamed surgery under jax.distributed with 1, 2 and 4 processes: suture vs stock Orbax.

The source (stock Orbax, 32 MiB chunks): ``params`` of 15 layers of (4096, 8192) float32
and a (8192, 4096) head (2 GiB), plus Adam's ``mu`` of the same shapes (dropped). The
surgery: drop the optimizer state, stack the layers, cast to bfloat16.

- suture: every process calls ``suture.save(suture.transform(rules, src), dst)``; each reads
  and writes its share (tests/multihost_worker.py, scenario ``surgery``).
- peer: stock Orbax's multi-process restore of the params onto a global sharding, the same
  edit in jax, stock Orbax's multi-process save (scenario ``orbax``).

Each process has 2 CPU devices and joins jax.distributed on 127.0.0.1. Reported: wall time
from launch to the last process's exit, and per process the TensorStore bytes read and
written, CPU seconds and peak RSS. This machine has 2 cores, so N processes share them: the
bytes per process are the scaling figure, the wall time is as measured.
Run from the repository root: ``.venv/bin/python -m bench.multihost``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from bench._common import DATA_DIR, REPO_ROOT, drop_caches, machine, write_section

WORKDIR = DATA_DIR / "multihost"
WORKER = REPO_ROOT / "tests" / "multihost_worker.py"
LAYERS, ROWS, COLUMNS = 15, 4096, 8192
COUNTS = (1, 2, 4)
ROUTES = {"suture": ("surgery", "lazy_out"), "orbax": ("orbax", "orbax_out")}
GIB = 1 << 30
MIB = 1 << 20


def write_source(path: Path) -> None:
    """The source checkpoint, written once by stock Orbax."""
    import numpy as np
    import orbax.checkpoint as ocp

    if (path / "_METADATA").exists():
        return
    shutil.rmtree(path, ignore_errors=True)
    rng = np.random.default_rng(0)
    params = {
        f"layer{i}": rng.standard_normal((ROWS, COLUMNS), dtype=np.float32) for i in range(LAYERS)
    }
    params["head"] = rng.standard_normal((COLUMNS, ROWS), dtype=np.float32)
    tree = {"params": params, "opt_state": {"mu": params}}
    save_args = {
        "params": {name: ocp.SaveArgs(chunk_byte_size=32 * MIB) for name in params},
        "opt_state": {"mu": {name: ocp.SaveArgs(chunk_byte_size=32 * MIB) for name in params}},
    }
    with ocp.PyTreeCheckpointer() as checkpointer:
        checkpointer.save(path, args=ocp.args.PyTreeSave(tree, save_args=save_args))


def run(scenario: str, count: int) -> dict:
    """One run of `count` processes; their reports and the wall time until the last exits."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    drop_caches()
    started = time.perf_counter()
    processes = [
        subprocess.Popen(
            [sys.executable, str(WORKER), scenario, str(i), str(count), str(port), str(WORKDIR)],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(count)
    ]
    try:
        outputs = [process.communicate(timeout=600)[0] for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    wall = time.perf_counter() - started
    for process, output in zip(processes, outputs, strict=True):
        if process.returncode:
            raise RuntimeError(f"{scenario} with {count} processes failed:\n{output[-3000:]}")
    reports = [
        json.loads((WORKDIR / f"report-{scenario}-{i}.json").read_text()) for i in range(count)
    ]
    return {"wall_s": wall, "reports": reports}


def check_same(first: Path, second: Path) -> None:
    """Both outputs hold the same leaves with the same values (read with suture)."""
    import numpy as np

    import suture

    a, b = suture.open(first), suture.open(second)
    assert sorted(suture.flatten(a.tree)) == sorted(suture.flatten(b.tree))
    for path in suture.flatten(a.tree):
        step = max(1, (64 * MIB) // (a[path].nbytes // a[path].shape[0]))  # 64 MiB at a time
        for rows in range(0, a[path].shape[0], step):
            np.testing.assert_array_equal(
                a[path][rows : rows + step].read(), b[path][rows : rows + step].read()
            )


def spread(values: list[float]) -> str:
    """``min-max`` over the processes (one number for one process)."""
    return f"{min(values):.0f}-{max(values):.0f}" if len(values) > 1 else f"{values[0]:.0f}"


def table(results: dict) -> str:
    lines = [
        "| route | processes | wall (s) | per process: read (MiB) | written (MiB) | CPU (s) "
        "| peak RSS (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for (route, count), result in results.items():
        reports = result["reports"]
        read = [report["io"]["read"] / MIB for report in reports]
        written = [report["io"]["written"] / MIB for report in reports]
        cpu = [report["cpu_seconds"] for report in reports]
        rss = [report["peak_rss_bytes"] / MIB for report in reports]
        lines.append(
            f"| {route} | {count} | {result['wall_s']:.1f} | {spread(read)} | {spread(written)} "
            f"| {min(cpu):.1f}-{max(cpu):.1f} | {spread(rss)} |"
        )
    return "\n".join(lines)


def main() -> None:
    WORKDIR.mkdir(parents=True, exist_ok=True)
    try:
        # In a child: the workers' memory is measured apart from the source's.
        subprocess.run(
            [
                sys.executable,
                "-c",
                "from bench.multihost import *; write_source(WORKDIR / 'source')",
            ],
            cwd=REPO_ROOT,
            check=True,
        )
        results = {}
        load_before = os.getloadavg()[0]
        for count in COUNTS:
            for route, (scenario, output) in ROUTES.items():
                shutil.rmtree(WORKDIR / output, ignore_errors=True)
                results[(route, count)] = run(scenario, count)
                print(route, count, f"{results[(route, count)]['wall_s']:.1f} s", flush=True)
            check_same(WORKDIR / "lazy_out", WORKDIR / "orbax_out")
        ratios = ", ".join(
            f"{count}: {results[('suture', count)]['wall_s'] / results[('orbax', count)]['wall_s']:.2f}"
            for count in COUNTS
        )
        body = f"""## Multi-host streamed surgery (`python -m bench.multihost`)

Machine: {machine()}. A 2 GiB streamed surgery (source: {LAYERS} layers of ({ROWS}, {COLUMNS})
float32 and a ({COLUMNS}, {ROWS}) head, plus Adam's `mu`, in 32 MiB chunks; drop `opt_state`,
stack the layers, cast to bfloat16) run by 1, 2 and 4 JAX processes on this machine
(`jax.distributed` on 127.0.0.1, 2 CPU devices each), one run each, page cache dropped
before each. suture: every process calls `suture.save(suture.transform(...))`. Peer: stock
Orbax multi-process restore onto a global sharding, the edit in jax, stock Orbax
multi-process save. Both outputs compared equal after each pair of runs. Bytes are
TensorStore's file counters of each process (min-max over the processes); the 2 cores are
shared by all processes, so the bytes per process are the scaling figure and the wall time is
as measured.

{table(results)}

Wall time suture / Orbax by process count: {ratios}.

Load average over this run: {load_before:.0f} at the start, {os.getloadavg()[0]:.0f} at the end.
"""
        write_section("multihost", body)
        print(body)
    finally:
        shutil.rmtree(WORKDIR, ignore_errors=True)


if __name__ == "__main__":
    main()
