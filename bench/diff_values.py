"""`suture diff --values` against loading both checkpoints and comparing them in numpy.

Two Orbax checkpoints of 128 MiB (32 float32 (1024, 1024) kernels and their biases,
written by stock Orbax) that differ in one element.

- suture: `diff(a, b, values=True)` (what `suture diff --values` runs);
- peer: stock Orbax `ocp.load` of both, then per leaf the largest absolute difference in
  numpy.

Each route runs in fresh processes after dropping the page cache (blocks per route, the
first run of each block discarded). Goal (issue 18): suture no slower than the peer.
Run from the repository root: `.venv/bin/python -m bench.diff_values`.
"""

from __future__ import annotations

import shutil
import sys

from bench._common import (
    DATA_DIR,
    cache_note,
    machine,
    medians,
    run_routes,
    runs_line,
    timed_route,
    write_section,
)

LAYERS, WIDTH = 32, 1024
FIRST, SECOND = DATA_DIR / "diff_a", DATA_DIR / "diff_b"
REPEATS = 3


def write_checkpoints() -> None:
    import numpy as np
    import orbax.checkpoint as ocp

    rng = np.random.default_rng(0)
    tree = {
        f"layer{i}": {
            "kernel": rng.standard_normal((WIDTH, WIDTH), dtype=np.float32),
            "bias": rng.standard_normal(WIDTH, dtype=np.float32),
        }
        for i in range(LAYERS)
    }
    checkpointer = ocp.StandardCheckpointer()
    for path, change in ((FIRST, 0.0), (SECOND, 0.5)):
        shutil.rmtree(path, ignore_errors=True)
        tree["layer7"]["kernel"][3, 3] += change
        checkpointer.save(path, tree)
        checkpointer.wait_until_finished()


def suture_route() -> None:
    from suture.cli.diff import diff

    result = diff(FIRST, SECOND, values=True, progress=False)
    assert [path for path, d in result.values.items() if not d.equal] == ["layer7/kernel"]


def peer_route() -> None:
    import jax
    import numpy as np
    from orbax.checkpoint import v1 as ocp

    first, second = ocp.load(FIRST), ocp.load(SECOND)
    largest = jax.tree.map(
        lambda x, y: float(np.abs(np.asarray(x, np.float64) - np.asarray(y)).max()), first, second
    )
    assert largest["layer7"]["kernel"] > 0 and largest["layer6"]["kernel"] == 0


def worker(route: str) -> None:
    timed_route({"suture": suture_route, "peer": peer_route}[route], DATA_DIR / "diff_none")


def main() -> None:
    DATA_DIR.mkdir(exist_ok=True)
    write_checkpoints()
    try:
        runs = run_routes("bench.diff_values", ["suture", "peer"], REPEATS)
    finally:
        shutil.rmtree(FIRST, ignore_errors=True)
        shutil.rmtree(SECOND, ignore_errors=True)
    typical = medians(runs, ["wall_s", "peak_rss_bytes"])
    ratio = typical["suture"]["wall_s"] / typical["peer"]["wall_s"]
    body = f"""## diff --values (two 128 MiB Orbax checkpoints)

`python -m bench.diff_values` on {machine()}; {cache_note(runs)}; median of {REPEATS} runs.

| route | wall s | peak RSS |
|---|---|---|
| suture `diff(values=True)` | {typical["suture"]["wall_s"]:.2f} | {typical["suture"]["peak_rss_bytes"] / 2**20:.0f} MiB |
| peer: `ocp.load` both + numpy | {typical["peer"]["wall_s"]:.2f} | {typical["peer"]["peak_rss_bytes"] / 2**20:.0f} MiB |

suture / peer wall: {ratio:.2f}x (goal: at most 1.0x). Every run: {runs_line(runs)}.
"""
    write_section("diff_values", body)
    print(body)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
