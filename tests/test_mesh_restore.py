"""Each process of a 2-process `jax.distributed` restore (stock Orbax, 4 CPU devices each)
reads only the chunks of its own shards from a checkpoint saved for that mesh, counted by
TensorStore's own metrics; from the default layout (one chunk across several processes'
shards) it reads more, which shows the count can fail."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import suture

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "mesh_restore_worker.py"
OVERHEAD = 64 << 10  # manifests and metadata read besides the chunks


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def restore_in_two_processes(layout: dict) -> list[dict]:
    port, text = free_port(), json.dumps(layout)
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    processes = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(index), "2", str(port), text],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=environment,
            text=True,
        )
        for index in range(2)
    ]
    reports = []
    try:
        for process in processes:
            output, _ = process.communicate(timeout=240)
            assert process.returncode == 0, output
            reports.append(json.loads(output.strip().splitlines()[-1]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return reports


MESHES = {
    "1-D": ({"fsdp": 8}, {"w": ((512, 256), ["fsdp", None])}),
    "2-D and a replicated axis": (
        {"fsdp": 4, "tensor": 2},
        {
            "w": ((512, 256), ["fsdp", "tensor"]),
            "v": ((256, 512), ["fsdp", None]),  # replicated along tensor
            "r": ((64, 256), []),  # replicated
        },
    ),
}


@pytest.mark.parametrize("case", sorted(MESHES))
def test_each_process_reads_only_its_shards(tmp_path: Path, case: str):
    mesh, leaves = MESHES[case]
    rng = np.random.default_rng(0)
    values = {
        name: rng.standard_normal(shape, dtype=np.float32) for name, (shape, _) in leaves.items()
    }
    np.savez(tmp_path / "values.npz", **values)
    target = suture.TargetSharding(
        mesh, {"leaves": {name: spec for name, (_, spec) in leaves.items()}}
    )
    # the default layout under a 1 MiB chunk budget: one chunk per array, across both
    # processes' shards; for the mesh: chunks of one shard each
    for name, sharding in (("default", None), ("for_mesh", target)):
        suture.save(
            values, tmp_path / name, progress=False, chunk_bytes="1MiB", target_sharding=sharding
        )
    layout = {
        "checkpoints": [str(tmp_path / "for_mesh"), str(tmp_path / "default")],
        "mesh": mesh,
        "leaves": {name: [list(shape), spec] for name, (shape, spec) in leaves.items()},
    }
    for report in restore_in_two_processes(layout):
        for_mesh, default = report["checkpoints"]
        assert for_mesh["needed"] == default["needed"] > 0
        assert for_mesh["read"] <= for_mesh["needed"] + OVERHEAD, report
        assert default["read"] >= 1.5 * default["needed"], report
