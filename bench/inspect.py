"""`suture inspect --json` on a 10,000-leaf Orbax checkpoint vs orbax.checkpoint.v1.metadata.

Both sides are whole processes (start-up and imports included), as a user meets them:
the command line against a Python process that imports orbax and reads the metadata.
Goal (issue 2): suture no slower than Orbax, ideally well under 1 s.

Run from the repository root: `.venv/bin/python -m bench.inspect` (or `make bench`).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import numpy as np

from bench._common import DATA_DIR, machine, measure, write_section

LEAVES = 10_000
CHECKPOINT = DATA_DIR / "inspect_10k"

ORBAX_METADATA = (
    "import sys; from orbax.checkpoint import v1 as ocp; "
    "tree = ocp.metadata(sys.argv[1]).metadata; "
    "import jax; print(len(jax.tree.leaves(tree)))"
)


def write_checkpoint() -> None:
    import orbax.checkpoint as ocp

    if (CHECKPOINT / "_METADATA").exists():
        return
    shutil.rmtree(CHECKPOINT, ignore_errors=True)
    rng = np.random.default_rng(0)
    tree = {
        f"block{b:03d}": {
            f"leaf{i:02d}": rng.standard_normal((8, 16), dtype=np.float32) for i in range(100)
        }
        for b in range(LEAVES // 100)
    }
    started = time.perf_counter()
    ocp.PyTreeCheckpointer().save(CHECKPOINT, tree)
    print(f"wrote {LEAVES} leaves in {time.perf_counter() - started:.1f} s")


def main() -> None:
    import compileall

    import suture

    # Like pip for installed packages (Orbax's included): byte-compiled, so that the command
    # does not recompile itself at start-up where PYTHONDONTWRITEBYTECODE is set.
    compileall.compile_dir(Path(suture.__file__).parent, quiet=1)
    DATA_DIR.mkdir(exist_ok=True)
    write_checkpoint()
    suture_cli = str(Path(sys.executable).with_name("suture"))
    results = {
        "suture inspect --json": measure([suture_cli, "inspect", str(CHECKPOINT), "--json"]),
        "orbax v1 metadata": measure([sys.executable, "-c", ORBAX_METADATA, str(CHECKPOINT)]),
    }
    ours, peer = results["suture inspect --json"], results["orbax v1 metadata"]
    rows = "\n".join(
        f"| {name} | {r['wall_s']:.2f} s | {r['wall_s_min']:.2f} s | {r['peak_rss_bytes'] / 2**20:.0f} MiB |"
        for name, r in results.items()
    )
    body = f"""## inspect: 10,000-leaf Orbax checkpoint (issue 2)

`python -m bench.inspect` — whole processes, median of {ours["repeats"]} runs, warm page cache; {machine()}.
Checkpoint: {LEAVES} float32 leaves of shape (8, 16), PyTreeCheckpointer defaults (OCDBT, zarr).

| route | median wall | best wall | peak RSS |
| --- | --- | --- | --- |
{rows}

Time ratio suture / Orbax: **{ours["wall_s"] / peer["wall_s"]:.2f}x** (goal: at most 1.0x, ideally well under 1 s).
"""
    write_section("inspect", body)
    print(body)


if __name__ == "__main__":
    main()
