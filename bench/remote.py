"""Open + params-only load of a ~1 GiB Orbax checkpoint on a local GCS server: suture vs Orbax.

A stock Orbax checkpoint (params + Adam mu and nu, random float32, ~0.94 GiB) is written
locally, uploaded to a fake-gcs-server started on 127.0.0.1, and loaded from ``gs://``
in fresh processes, params only:

- suture: ``suture.load(url, suture.placeholders(url, skip="opt_state"))``
- Orbax:  v1 ``ocp.load(url, tree)`` with ``PLACEHOLDER`` under opt_state (the Orbax
  partial-loading guide's way), ``epath`` reaching the server through gcsfs.

Both read array data through TensorStore's gcs driver, so its counters (bytes fetched,
read requests) measure both routes alike; Orbax's metadata reads through gcsfs are not in
them (a few KiB). Goal (issue 15): no more bytes than Orbax and no slower.
Run from the repository root: ``.venv/bin/python -m bench.remote``.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time

from bench._common import (
    DATA_DIR,
    machine,
    orbax_load_params_only,
    peak_rss_bytes,
    run_cold_worker,
    write_adam_checkpoint,
    write_section,
)

LAYERS = 5
WIDTH = 4096
CHECKPOINT = DATA_DIR / "remote"
REPEATS = 3


def worker(route: str, url: str) -> None:
    import jax
    from etils import epath
    from orbax.checkpoint import v1  # noqa: F401 (both routes import before the clock starts)

    import suture
    from suture._iostats import bytes_read, remote_requests

    started = time.perf_counter()
    bytes_before, requests_before = bytes_read(), remote_requests()
    if route == "suture":
        loaded = suture.load(url, suture.placeholders(url, skip="opt_state"))
    else:
        loaded = orbax_load_params_only(epath.Path(url))
    jax.block_until_ready(jax.tree.leaves(loaded["params"]))
    print(
        json.dumps(
            {
                "wall_s": time.perf_counter() - started,
                "bytes": bytes_read() - bytes_before,
                "requests": remote_requests() - requests_before,
                "peak_rss_bytes": peak_rss_bytes(),
                "params_bytes": sum(leaf.nbytes for leaf in jax.tree.leaves(loaded["params"])),
            }
        )
    )


def main() -> None:
    from tests.remote_servers import BUCKET, gcs_server, upload

    DATA_DIR.mkdir(exist_ok=True)
    write_adam_checkpoint(CHECKPOINT, LAYERS, WIDTH)
    stored = sum(p.stat().st_size for p in CHECKPOINT.rglob("*") if p.is_file())
    server_root = DATA_DIR / "remote-gcs"
    shutil.rmtree(server_root, ignore_errors=True)
    try:
        with gcs_server(server_root):
            url = f"gs://{BUCKET}/remote/ckpt"
            upload(CHECKPOINT, url)
            runs: dict[str, list[dict]] = {}
            for route in ("suture", "orbax"):
                run_cold_worker("bench.remote", route, url)  # discarded: warms the server
                runs[route] = [run_cold_worker("bench.remote", route, url) for _ in range(REPEATS)]
    finally:
        shutil.rmtree(server_root, ignore_errors=True)
        shutil.rmtree(CHECKPOINT, ignore_errors=True)
    summary = {
        route: {key: statistics.median(r[key] for r in results) for key in results[0]}
        for route, results in runs.items()
    }
    ours, peer = summary["suture"], summary["orbax"]
    gib = 2**30
    rows = "\n".join(
        f"| {name} | {s['wall_s']:.2f} s | {s['bytes'] / gib:.3f} GiB | {s['requests']:.0f} "
        f"| {s['peak_rss_bytes'] / gib:.2f} GiB |"
        for name, s in (("suture.load + placeholders", ours), ("orbax v1 load + PLACEHOLDER", peer))
    )
    body = f"""## remote: params-only load of a 1 GiB Orbax checkpoint from gs:// (issue 15)

`python -m bench.remote` — {machine()}; fake-gcs-server on 127.0.0.1 (filesystem backend),
median of {REPEATS} runs per route, each a fresh process (wall: from before opening to the
arrays being ready, imports excluded), after one discarded run per route.
Checkpoint: stock `StandardCheckpointer`, {LAYERS} layers of ({WIDTH}, {WIDTH}) float32 kernels
+ biases for params, mu and nu; {stored / gib:.3f} GiB stored, params
{ours["params_bytes"] / gib:.3f} GiB in memory.

| route | open + load wall | bytes fetched (TensorStore gcs) | read requests | peak RSS |
| --- | --- | --- | --- | --- |
{rows}

- Bytes fetched ratio suture / Orbax: **{ours["bytes"] / peer["bytes"]:.3f}x**; wall time ratio:
  **{ours["wall_s"] / peer["wall_s"]:.2f}x** (goal: at most 1x each).
- Wall times of every run: suture {", ".join(f"{r['wall_s']:.2f}" for r in runs["suture"])};
  Orbax {", ".join(f"{r['wall_s']:.2f}" for r in runs["orbax"])}.
- Orbax reads `_METADATA` and its other JSON files through gcsfs, outside TensorStore's
  counters; suture reads them through TensorStore, so its count includes them.
"""
    write_section("remote", body)
    print(body)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        main()
