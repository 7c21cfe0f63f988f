"""Writers of real Orbax checkpoints, one per layout suture reads (all stock orbax-checkpoint)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import v1 as ocp_v1


def sample_arrays(seed: int = 0) -> dict[str, Any]:
    """Arrays of every dtype the foundation promises, including 0-d ones."""
    rng = np.random.default_rng(seed)
    return {
        "params": {
            "dense": {
                "kernel": rng.standard_normal((4, 6), dtype=np.float32),
                "bias": rng.standard_normal(6).astype(ml_dtypes.bfloat16),
            },
            "embed": rng.integers(-128, 127, size=(5, 3), dtype=np.int8),
            "mask": rng.random(7) > 0.5,
            "scale": np.full((), 1.5, np.float32),
        },
        "layers": [rng.standard_normal(3, dtype=np.float32) for _ in range(2)],
        "step": np.asarray(42, np.int32),
    }


def sample_values() -> dict[str, Any]:
    """Non-array leaves that PyTreeCheckpointer keeps."""
    return {"name": "my-model", "nothing": None, "count": 7, "rate": 0.25}


def save_standard(path: Path, tree: dict) -> None:
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, tree)
    checkpointer.wait_until_finished()


def pytree_writer(use_ocdbt: bool, use_zarr3: bool) -> Callable[[Path, dict], None]:
    def save(path: Path, tree: dict) -> None:
        ocp.PyTreeCheckpointer(use_ocdbt=use_ocdbt, use_zarr3=use_zarr3).save(path, tree)

    save.__name__ = f"pytree_ocdbt{int(use_ocdbt)}_zarr3{int(use_zarr3)}"
    return save


def save_v1(path: Path, tree: dict) -> None:
    ocp_v1.save(path, tree)


def save_manager(path: Path, tree: dict, steps: tuple[int, ...] = (1, 5)) -> None:
    """A CheckpointManager root; step s holds `tree` with 'step' set to s."""
    with ocp.CheckpointManager(path) as manager:
        for step in steps:
            state = dict(tree, step=np.asarray(step, np.int32))
            manager.save(step, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()


def as_sharded_jax(tree: dict) -> dict:
    """The same tree as jax.Arrays, replicated over all devices."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.tree.map(lambda leaf: jax.device_put(leaf, replicated), tree)
