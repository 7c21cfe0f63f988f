"""Streaming surgery on a 6 GiB Orbax checkpoint: suture vs restore-edit-save, with `cp` as the floor.

The checkpoint: 32 layers of (4096, 4096) float32 kernels plus biases, and Adam's mu and nu
of the same shapes (about 6 GiB). The surgery, in one pass: drop the optimizer state,
stack `layer{i}` into `layers` for scan, cast to bfloat16, write an Orbax checkpoint.

- suture: `suture.save(suture.transform(rules, src), dst)`.
- peer (what users do today): stock Orbax restore of the params (optimizer state skipped with
  placeholders), numpy stacking and casting, stock Orbax save.
- floor: `cp` of a file as large as the params' stored bytes (what any route must read).

Each route runs in fresh processes after dropping the page cache; the routes run in blocks,
the first run of each block discarded (see bench/partial_load.py for why).
Goals (issue 5): suture's peak RSS at most 1.5 GiB and at most 0.3x the peer's; wall time at
most 0.8x the peer's. Run from the repository root: `.venv/bin/python -m bench.streaming`.
suture's worker sets SUTURE_TUNE_ALLOCATOR=1 (one malloc arena, as `import suture` once did).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

from bench._common import (
    DATA_DIR,
    cache_note,
    drop_caches,
    machine,
    medians,
    run_routes,
    runs_line,
    timed_route,
    write_adam_checkpoint,
    write_section,
)

LAYERS = 32
WIDTH = 4096
SOURCE = DATA_DIR / "streaming_source"
OUTPUT = DATA_DIR / "streaming_output"
REPEATS = 3


def write_checkpoint() -> None:
    write_adam_checkpoint(SOURCE, LAYERS, WIDTH)


def suture_route() -> None:
    os.environ["SUTURE_TUNE_ALLOCATOR"] = "1"  # read when suture is imported
    import suture
    from suture import rules

    surgery = [
        rules.drop("opt_state|step"),
        rules.stack(r"params/layer(?P<i>\d+)", into="params/layers"),
        rules.cast("params", "bfloat16"),
    ]
    suture.save(suture.transform(surgery, SOURCE), OUTPUT, progress=False)


def peer_route() -> None:
    import jax
    import ml_dtypes
    import numpy as np
    import orbax.checkpoint as ocp_v0
    from orbax.checkpoint import v1 as ocp

    def placeholder(path, leaf):
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        return ocp.PLACEHOLDER if not name.startswith("params") else leaf

    tree = jax.tree.map_with_path(placeholder, ocp.metadata(SOURCE).metadata)
    params = ocp.load(SOURCE, tree)["params"]
    stacked = {
        "kernel": np.stack(
            [np.asarray(params[f"layer{i}"]["kernel"]) for i in range(LAYERS)]
        ).astype(ml_dtypes.bfloat16),
        "bias": np.stack([np.asarray(params[f"layer{i}"]["bias"]) for i in range(LAYERS)]).astype(
            ml_dtypes.bfloat16
        ),
    }
    del params
    checkpointer = ocp_v0.StandardCheckpointer()
    checkpointer.save(OUTPUT, {"params": {"layers": stacked}})
    checkpointer.wait_until_finished()


def worker(route: str) -> None:
    timed_route({"suture": suture_route, "peer": peer_route}[route], OUTPUT)


def verify_output() -> None:
    """The last route's output restores with stock Orbax and holds the stacked layers."""
    import numpy as np
    import orbax.checkpoint as ocp_v0

    import suture

    restored = suture.open(OUTPUT)
    kernel = restored["params/layers/kernel"]
    assert kernel.shape == (LAYERS, WIDTH, WIDTH) and kernel.dtype.name == "bfloat16", kernel
    source = suture.open(SOURCE)["params/layer7/kernel"].read()
    np.testing.assert_array_equal(kernel[7].read(), source.astype(kernel.dtype))
    ocp_v0.StandardCheckpointer().metadata(OUTPUT)


def stored_bytes(prefix: str) -> int:
    import suture

    ckpt = suture.open(SOURCE)
    total_memory = ckpt.nbytes
    memory = sum(leaf.nbytes for path, leaf in ckpt.arrays().items() if path.startswith(prefix))
    on_disk = sum(p.stat().st_size for p in SOURCE.rglob("*") if p.is_file())
    return int(on_disk * memory / total_memory)


def cp_floor(size: int) -> float:
    """Seconds for `cp` of a file of `size` bytes, cold (the data any route must read)."""
    blob, copy = DATA_DIR / "cp_floor.bin", DATA_DIR / "cp_floor.copy"
    if not blob.exists() or blob.stat().st_size != size:
        with open(blob, "wb") as out:
            chunk = b"\x5a" * (64 << 20)
            for _ in range(size // len(chunk)):
                out.write(chunk)
            out.write(b"\x5a" * (size % len(chunk)))
    timings = []
    for _ in range(REPEATS):
        copy.unlink(missing_ok=True)
        drop_caches()
        started = time.perf_counter()
        subprocess.run(["cp", str(blob), str(copy)], check=True)
        subprocess.run(["sync"], check=True)
        timings.append(time.perf_counter() - started)
    copy.unlink(missing_ok=True)
    return statistics.median(timings)


def main() -> None:
    DATA_DIR.mkdir(exist_ok=True)
    write_checkpoint()
    params_stored = stored_bytes("params/")
    runs = run_routes("bench.streaming", ("suture", "peer"), REPEATS, check=verify_output)
    floor = cp_floor(params_stored)
    summary = medians(runs, ("wall_s", "peak_rss_bytes"))
    ours, peer = summary["suture"], summary["peer"]
    gib = 2**30
    source_size = sum(p.stat().st_size for p in SOURCE.rglob("*") if p.is_file())
    body = f"""## streaming: 6 GiB checkpoint -> drop optimizer, stack 32 layers, bfloat16, Orbax (issue 5)

`python -m bench.streaming` — {machine()}; median of {REPEATS} runs per route, each a fresh process,
{cache_note(runs)}; the routes run in blocks whose first run is discarded.
Source: {LAYERS} x ({WIDTH}, {WIDTH}) float32 kernels + biases for params, mu and nu, {source_size / gib:.2f} GiB on disk
(params about {params_stored / gib:.2f} GiB). Output: params stacked to ({LAYERS}, {WIDTH}, {WIDTH}) bfloat16, Orbax.

| route | wall time | peak RSS |
| --- | --- | --- |
| suture.save(suture.transform(rules, src), dst) | {ours["wall_s"]:.1f} s | {ours["peak_rss_bytes"] / gib:.2f} GiB |
| Orbax restore params + numpy stack/cast + Orbax save | {peer["wall_s"]:.1f} s | {peer["peak_rss_bytes"] / gib:.2f} GiB |
| floor: `cp` of {params_stored / gib:.2f} GiB (+ sync) | {floor:.1f} s | |

- Peak RSS: suture {ours["peak_rss_bytes"] / gib:.2f} GiB (goal: at most 1.5 GiB), **{ours["peak_rss_bytes"] / peer["peak_rss_bytes"]:.2f}x** the peer's (goal: at most 0.3x).
- Wall time: **{ours["wall_s"] / peer["wall_s"]:.2f}x** the peer's (goal: at most 0.8x); {ours["wall_s"] / floor:.1f}x the `cp` floor.
- Runs (wall s): {runs_line(runs)}.
"""
    write_section("streaming", body)
    print(body)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
