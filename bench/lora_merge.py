"""Merging LoRA adapters into a 512 MiB base (``w + scale * (a @ b)``): suture streams by rows.

- suture: a transform function ``w + scale * (a @ b)`` per layer (``a @ b`` is a lazy
  product computed by blocks of output rows), streamed to safetensors under a 64 MiB budget,
  smaller than one leaf.
- peer: safetensors' own ``load_file`` of base and adapters, numpy merge, ``save_file``.

Each route runs in fresh processes after dropping the page cache, in blocks whose first run
is discarded (see bench/partial_load.py). Run from the repository root:
`.venv/bin/python -m bench.lora_merge`.
"""

from __future__ import annotations

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

LAYERS = 8
SHAPE = (4096, 4096)  # float32: 64 MiB a leaf, 512 MiB the base
RANK = 16
SCALE = 0.5
BUDGET = "64MiB"
BASE = DATA_DIR / "lora_base.safetensors"
ADAPTER = DATA_DIR / "lora_adapter.safetensors"
OUTPUT = DATA_DIR / "lora_merged.safetensors"
REPEATS = 3


def write_inputs() -> None:
    import numpy as np
    from safetensors.numpy import save_file

    if BASE.exists() and ADAPTER.exists():
        return
    rng = np.random.default_rng(0)
    save_file(
        {f"layer{i}.w": rng.standard_normal(SHAPE, dtype=np.float32) for i in range(LAYERS)},
        BASE,
    )
    adapter = {}
    for i in range(LAYERS):
        adapter[f"layer{i}.a"] = rng.standard_normal((SHAPE[0], RANK), dtype=np.float32)
        adapter[f"layer{i}.b"] = rng.standard_normal((RANK, SHAPE[1]), dtype=np.float32)
    save_file(adapter, ADAPTER)


def merge_lora(base, adapter):
    return {
        name: {"w": base[name]["w"] + SCALE * (adapter[name]["a"] @ adapter[name]["b"])}
        for name in base
    }


def suture_route() -> None:
    import suture

    merged = suture.transform(merge_lora, BASE, ADAPTER)
    suture.save(
        merged, OUTPUT, format="safetensors", max_memory=BUDGET, overwrite=True, progress=False
    )


def peer_route() -> None:
    from safetensors.numpy import load_file, save_file

    base, adapter = load_file(BASE), load_file(ADAPTER)
    merged = {}
    for i in range(LAYERS):
        a, b = adapter[f"layer{i}.a"], adapter[f"layer{i}.b"]
        merged[f"layer{i}.w"] = base.pop(f"layer{i}.w") + SCALE * (a @ b)
    save_file(merged, OUTPUT)


def worker(route: str) -> None:
    timed_route({"suture": suture_route, "peer": peer_route}[route], OUTPUT)


def verify_output() -> None:
    import numpy as np

    import suture

    base, adapter = suture.open(BASE), suture.open(ADAPTER)
    expected = base["layer3/w"][:64].read() + SCALE * (
        adapter["layer3/a"][:64].read() @ adapter["layer3/b"].read()
    )
    got = suture.open(OUTPUT)["layer3/w"][:64].read()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def main() -> None:
    DATA_DIR.mkdir(exist_ok=True)
    write_inputs()
    runs = run_routes("bench.lora_merge", ("suture", "peer"), REPEATS, check=verify_output)
    summary = medians(runs, ("wall_s", "peak_rss_bytes"))
    ours, peer = summary["suture"], summary["peer"]
    mib = 2**20
    body = f"""## lora_merge: LoRA adapters merged into a 512 MiB base, w + scale * (a @ b) (issue 14)

`python -m bench.lora_merge` — {machine()}; median of {REPEATS} runs per route, each a fresh
process, {cache_note(runs)}; the routes run in blocks whose first run is discarded.
Base: {LAYERS} float32 leaves of {SHAPE} (64 MiB each) in safetensors; rank-{RANK} adapters.

| route | wall time | peak RSS |
| --- | --- | --- |
| suture.save(suture.transform(merge_lora, base, adapter), max_memory={BUDGET}) | {ours["wall_s"]:.1f} s | {ours["peak_rss_bytes"] / mib:.0f} MiB |
| safetensors load_file x2 + numpy merge + save_file | {peer["wall_s"]:.1f} s | {peer["peak_rss_bytes"] / mib:.0f} MiB |

- Peak RSS: suture {ours["peak_rss_bytes"] / peer["peak_rss_bytes"]:.2f}x the peer's (the budget, {BUDGET}, is below one leaf; RSS also holds the interpreter, numpy and jax).
- Wall time: {ours["wall_s"] / peer["wall_s"]:.2f}x the peer's.
- Runs (wall s): {runs_line(runs)}.
"""
    write_section("lora_merge", body)
    print(body)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
