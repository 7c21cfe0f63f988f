"""Many hosts, one bucket: a streamed surgery saved by every process of a jax.distributed job.

Local processes stand in for hosts: this script starts PROCESSES copies of itself, each
joining ``jax.distributed`` on 127.0.0.1, and each calls ``suture.save`` with the same tree
and path, as on a real pod. Every process reads and writes about 1/N of the bytes, into its
own database under the destination; process 0 commits when all have finished.

Usage::

    python examples/many_hosts.py WORKDIR [DESTINATION]

DESTINATION defaults to ``WORKDIR/stacked``; a ``gs://bucket/prefix`` or ``s3://bucket/prefix``
works the same way (credentials and endpoints as in docs/guide/remote-storage.md).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

PROCESSES = 2


def host(index: int, port: int, workdir: Path, destination: str) -> None:
    """What each host runs: join the job, then the same save call everywhere."""
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=PROCESSES, process_id=index)

    import suture
    from suture import rules

    surgery = suture.transform(
        [
            rules.drop("opt_state"),  # evaluation needs no optimizer state
            rules.stack(r"params/layer(?P<i>\d+)", into="params/layers"),  # for nn.scan
            rules.cast("params", "bfloat16"),
        ],
        workdir / "trained",
    )
    result = suture.save(surgery, destination, progress=False)  # every process calls it
    print(f"process {index}: wrote {result.bytes_written:,} bytes of {destination}")
    jax.distributed.shutdown()


def main(workdir: Path, destination: str) -> None:
    """Writes a small trained checkpoint, then runs PROCESSES hosts on this machine."""
    import numpy as np

    import suture

    rng = np.random.default_rng(0)
    params = {f"layer{i}": rng.standard_normal((256, 256), np.float32) for i in range(4)}
    tree = {"params": params, "opt_state": {"mu": {k: np.zeros_like(v) for k, v in params.items()}}}
    suture.save(tree, workdir / "trained", overwrite=True, progress=False)

    with socket.socket() as probe:  # a free port for the coordinator
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    hosts = [
        subprocess.Popen(
            [sys.executable, __file__, "--host", str(i), str(port), str(workdir), destination]
        )
        for i in range(PROCESSES)
    ]
    codes = [process.wait(timeout=300) for process in hosts]
    if any(codes):
        raise SystemExit(f"a host failed: exit codes {codes}")
    stacked = suture.open(destination)["params/layers"]
    print(f"{destination}: params/layers {stacked.shape} {stacked.dtype}")


if __name__ == "__main__":
    if sys.argv[1] == "--host":
        host(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), sys.argv[5])
    else:
        folder = Path(sys.argv[1])
        main(folder, sys.argv[2] if len(sys.argv) > 2 else str(folder / "stacked"))
