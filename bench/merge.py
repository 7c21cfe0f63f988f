"""Merging: suture against numpy on Orbax checkpoints, and against mergekit on HF models.

Part 1 (issue 9), three 1 GiB Orbax checkpoints, weighted average:
- suture: `suture.save(suture.merge([a, b, c], "linear", weights=...), out)`, default budget.
- peer: stock Orbax restore of the three models, numpy weighted average, stock Orbax save.
Each route runs in fresh processes after dropping the page cache, in blocks whose first run is
discarded (see bench/partial_load.py). Goal: suture's peak RSS under 1 GiB.

Part 2 (issue 17), three small Llama models as Hugging Face folders, linear and TIES, one
mergekit config each: `suture merge CONFIG -o OUT` against `mergekit-yaml CONFIG OUT`
(mergekit installed by the benchmark into its own venv), wall time, peak RSS, and the
largest difference of the outputs. Goal: <= 1e-6 relative, faster and leaner than mergekit.

Run from the repository root: `.venv/bin/python -m bench.merge` (both parts), or
`.venv/bin/python -m bench.merge mergekit` (part 2 only).
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

MODELS = 3
LEAVES = 16
SHAPE = (4096, 4096)  # float32: 64 MiB a leaf, 1 GiB a model
WEIGHTS = [0.5, 0.3, 0.2]
OUTPUT = DATA_DIR / "merge_output"
REPEATS = 3


def model_path(index: int):
    return DATA_DIR / f"merge_model_{index}"


def write_models() -> None:
    import numpy as np
    import orbax.checkpoint as ocp

    for index in range(MODELS):
        path = model_path(index)
        if (path / "_METADATA").exists():
            continue
        shutil.rmtree(path, ignore_errors=True)
        rng = np.random.default_rng(index)
        tree = {
            f"layer{i}": {"kernel": rng.standard_normal(SHAPE, dtype=np.float32)}
            for i in range(LEAVES)
        }
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(path, tree)
        checkpointer.wait_until_finished()
        del tree


def suture_route() -> None:
    import suture

    merged = suture.merge([model_path(i) for i in range(MODELS)], "linear", weights=WEIGHTS)
    suture.save(merged, OUTPUT, progress=False)


def peer_route() -> None:
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    models = [ocp.StandardCheckpointer().restore(model_path(i)) for i in range(MODELS)]
    total = sum(WEIGHTS)
    merged = jax.tree.map(
        lambda *leaves: (
            sum(w * np.asarray(x) for w, x in zip(WEIGHTS, leaves, strict=True)) / total
        ),
        *models,
    )
    del models
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(OUTPUT, merged)
    checkpointer.wait_until_finished()


def worker(route: str) -> None:
    timed_route({"suture": suture_route, "peer": peer_route}[route], OUTPUT)


def verify_output() -> None:
    import numpy as np

    import suture

    leaves = [suture.open(model_path(i))["layer3/kernel"][:64].read() for i in range(MODELS)]
    expected = sum(w * x for w, x in zip(WEIGHTS, leaves, strict=True)) / sum(WEIGHTS)
    np.testing.assert_allclose(
        suture.open(OUTPUT)["layer3/kernel"][:64].read(), expected, rtol=1e-5, atol=1e-6
    )


def main() -> None:
    DATA_DIR.mkdir(exist_ok=True)
    write_models()
    runs = run_routes("bench.merge", ("suture", "peer"), REPEATS, check=verify_output)
    summary = medians(runs, ("wall_s", "peak_rss_bytes"))
    ours, peer = summary["suture"], summary["peer"]
    gib = 2**30
    body = f"""## merge: three 1 GiB checkpoints, weighted average (issue 9)

`python -m bench.merge` — {machine()}; median of {REPEATS} runs per route, each a fresh process,
{cache_note(runs)}; the routes run in blocks whose first run is discarded.
Models: {MODELS} Orbax checkpoints of {LEAVES} float32 leaves of {SHAPE} (1 GiB each); weights {WEIGHTS}.

| route | wall time | peak RSS |
| --- | --- | --- |
| suture.save(suture.merge(models, "linear"), out) | {ours["wall_s"]:.1f} s | {ours["peak_rss_bytes"] / gib:.2f} GiB |
| Orbax restore x3 + numpy average + Orbax save | {peer["wall_s"]:.1f} s | {peer["peak_rss_bytes"] / gib:.2f} GiB |

- Peak RSS: suture **{ours["peak_rss_bytes"] / gib:.2f} GiB** (goal: under 1 GiB), {ours["peak_rss_bytes"] / peer["peak_rss_bytes"]:.2f}x the peer's.
- Wall time: {ours["wall_s"] / peer["wall_s"]:.2f}x the peer's.
- Runs (wall s): {runs_line(runs)}.
"""
    write_section("merge", body)
    print(body)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    elif sys.argv[1:] == ["mergekit"]:
        from bench.merge_mergekit import main as against_mergekit

        against_mergekit()
    else:
        main()
        from bench.merge_mergekit import main as against_mergekit

        against_mergekit()
