"""Sharded safetensors (2 GiB) -> Orbax: suture vs loading every tensor and saving with Orbax.

- suture: `suture.convert(hf_folder, out)`, streamed.
- peer (what people do today): `safetensors.numpy.load_file` for every shard, build the tree,
  stock Orbax `StandardCheckpointer().save`.

Each route runs in fresh processes after dropping the page cache, in blocks whose first run is
discarded (see bench/partial_load.py). Goals (issue 6): suture's peak RSS at most 0.3x the
peer's; wall time at most 1.0x. Run from the repository root: `.venv/bin/python -m bench.convert`.
"""

from __future__ import annotations

import json
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

SHARDS = 4
TENSORS_PER_SHARD = 8
SHAPE = (4096, 4096)  # float32: 64 MiB per tensor, 2 GiB in all
SOURCE = DATA_DIR / "convert_hf"
OUTPUT = DATA_DIR / "convert_orbax"
REPEATS = 3


def write_source() -> None:
    import numpy as np
    from safetensors.numpy import save_file

    if (SOURCE / "model.safetensors.index.json").exists():
        return
    shutil.rmtree(SOURCE, ignore_errors=True)
    SOURCE.mkdir(parents=True)
    rng = np.random.default_rng(0)
    weight_map = {}
    for shard in range(1, SHARDS + 1):
        filename = f"model-{shard:05d}-of-{SHARDS:05d}.safetensors"
        tensors = {
            f"model.layers.{(shard - 1) * TENSORS_PER_SHARD + i}.mlp.weight": rng.standard_normal(
                SHAPE, dtype=np.float32
            )
            for i in range(TENSORS_PER_SHARD)
        }
        save_file(tensors, SOURCE / filename, metadata={"format": "pt"})
        weight_map.update({name: filename for name in tensors})
    total = SHARDS * TENSORS_PER_SHARD * 4 * SHAPE[0] * SHAPE[1]
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (SOURCE / "model.safetensors.index.json").write_text(json.dumps(index))
    (SOURCE / "config.json").write_text(json.dumps({"model_type": "toy"}))


def suture_route() -> None:
    import suture

    suture.convert(SOURCE, OUTPUT, progress=False)


def peer_route() -> None:
    import orbax.checkpoint as ocp
    from safetensors.numpy import load_file

    flat = {}
    for shard in sorted(SOURCE.glob("*.safetensors")):
        flat.update(load_file(shard))
    tree: dict = {}
    for name, array in flat.items():
        node = tree
        *parents, leaf = name.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = array
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(OUTPUT, tree)
    checkpointer.wait_until_finished()


def worker(route: str) -> None:
    timed_route({"suture": suture_route, "peer": peer_route}[route], OUTPUT)


def verify_output() -> None:
    import numpy as np
    from safetensors.numpy import load_file

    import suture

    expected = load_file(SOURCE / f"model-00002-of-{SHARDS:05d}.safetensors")[
        "model.layers.9.mlp.weight"
    ]
    np.testing.assert_array_equal(suture.open(OUTPUT)["model/layers/9/mlp/weight"].read(), expected)


def main() -> None:
    DATA_DIR.mkdir(exist_ok=True)
    write_source()
    runs = run_routes("bench.convert", ("suture", "peer"), REPEATS, check=verify_output)
    summary = medians(runs, ("wall_s", "peak_rss_bytes"))
    ours, peer = summary["suture"], summary["peer"]
    gib = 2**30
    body = f"""## convert: sharded safetensors (2 GiB) -> Orbax (issue 6)

`python -m bench.convert` — {machine()}; median of {REPEATS} runs per route, each a fresh process,
{cache_note(runs)}; the routes run in blocks whose first run is discarded.
Source: {SHARDS} shards x {TENSORS_PER_SHARD} float32 tensors of {SHAPE} (2 GiB), index json, config.json.

| route | wall time | peak RSS |
| --- | --- | --- |
| suture.convert(hf_folder, out) | {ours["wall_s"]:.1f} s | {ours["peak_rss_bytes"] / gib:.2f} GiB |
| safetensors.numpy.load_file per shard + Orbax save | {peer["wall_s"]:.1f} s | {peer["peak_rss_bytes"] / gib:.2f} GiB |

- Peak RSS: **{ours["peak_rss_bytes"] / peer["peak_rss_bytes"]:.2f}x** the peer's (goal: at most 0.3x).
- Wall time: **{ours["wall_s"] / peer["wall_s"]:.2f}x** the peer's (goal: at most 1.0x).
- Runs (wall s): {runs_line(runs)}.
"""
    write_section("convert", body)
    print(body)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
