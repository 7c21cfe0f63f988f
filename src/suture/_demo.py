"""`suture demo`: the main job, end to end, on a checkpoint the demo writes itself.

It saves a small MLP with Adam state using stock orbax-checkpoint, then shows what suture
does with it: open without reading arrays, inspect, read one row of one layer (and only
its chunk), and stack the layers for ``scan`` with a cast to bfloat16, lazily, checking
every result against numpy.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ._combine import stack
from ._format import human_bytes
from ._inspect import describe, render_tree
from ._iostats import count_bytes_read
from ._open import open as open_checkpoint

LAYERS = 4
WIDTH = 512


def make_training_state(seed: int = 0) -> dict:
    """A 4-layer MLP's params with Adam's mu and nu, as a training loop would save them."""
    rng = np.random.default_rng(seed)
    params = {
        f"layer{i}": {
            "kernel": rng.standard_normal((WIDTH, WIDTH), dtype=np.float32)
            * np.float32(WIDTH**-0.5),
            "bias": np.zeros(WIDTH, np.float32),
        }
        for i in range(LAYERS)
    }

    def like_params(scale: float) -> dict:
        return {
            name: {
                key: (rng.standard_normal(value.shape) * scale).astype(np.float32)
                for key, value in layer.items()
            }
            for name, layer in params.items()
        }

    return {
        "params": params,
        "opt_state": {"mu": like_params(1e-3), "nu": like_params(1e-6), "count": np.int32(100)},
        "step": np.int32(100),
    }


def write_checkpoint(state: dict, path: Path) -> None:
    """Saves `state` with stock Orbax, one chunk per row of each kernel."""
    import orbax.checkpoint as ocp

    def save_args(leaf: np.ndarray) -> ocp.SaveArgs:
        return ocp.SaveArgs(
            chunk_byte_size=max(leaf.nbytes // max(leaf.shape[:1] or (1,)), 1),
            shard_axes=(0,) if leaf.ndim else (),
        )

    import jax

    checkpointer = ocp.PyTreeCheckpointer()
    checkpointer.save(path, state, save_args=jax.tree.map(save_args, state))


def run_demo(workdir: Path | None, echo: Callable[[str], None] = print) -> None:
    """Runs the demo, printing each step; raises if any check fails."""
    own_tmp = workdir is None
    root = Path(tempfile.mkdtemp(prefix="suture-demo-")) if own_tmp else workdir
    try:
        _run(Path(root), echo)
    finally:
        if own_tmp:
            shutil.rmtree(root, ignore_errors=True)


def _run(root: Path, echo: Callable[[str], None]) -> None:
    path = root / "mlp_checkpoint"
    if path.exists():
        shutil.rmtree(path)
    state = make_training_state()
    started = time.perf_counter()
    write_checkpoint(state, path)
    echo(
        f"1. Saved a {LAYERS}-layer MLP with Adam state using stock Orbax -> {path}"
        f" ({time.perf_counter() - started:.1f} s)\n"
    )

    with count_bytes_read() as opening:
        ckpt = open_checkpoint(path)
    echo(
        f"2. suture.open read {human_bytes(opening.bytes)} of metadata and no array data;"
        f" the checkpoint holds {human_bytes(ckpt.nbytes)} of arrays:\n"
    )
    echo(render_tree(describe(ckpt), depth=3))

    kernel = ckpt["params/layer2/kernel"]
    with count_bytes_read() as row_read:
        row = kernel[5].read()
    _check(np.array_equal(row, state["params"]["layer2"]["kernel"][5]), "row 5 of layer2")
    echo(
        f"\n3. Read row 5 of params/layer2/kernel ({human_bytes(row.nbytes)}): read"
        f" {human_bytes(row_read.bytes)} from disk (that row's chunk),"
        f" read once), not the whole {human_bytes(kernel.nbytes)} kernel.\n"
    )

    kernels = [ckpt[f"params/layer{i}/kernel"] for i in range(LAYERS)]
    stacked = stack(kernels).astype("bfloat16")
    echo(f"4. Stacked the {LAYERS} kernels for scan and cast to bfloat16, lazily: {stacked!r}")
    with count_bytes_read() as stacked_read:
        third = stacked[3].read()
    expected = state["params"]["layer3"]["kernel"].astype(third.dtype)
    _check(np.array_equal(third, expected), "stacked[3]")
    echo(
        f"   stacked[3] equals layer3's kernel in bfloat16 and read"
        f" {human_bytes(stacked_read.bytes)} (layer 3 only)."
    )
    everything = stacked.read()
    numpy_route = np.stack([state["params"][f"layer{i}"]["kernel"] for i in range(LAYERS)])
    _check(np.array_equal(everything, numpy_route.astype(everything.dtype)), "stacked")
    echo(
        f"   The whole stack equals numpy's np.stack(...).astype(bfloat16):"
        f" {everything.shape}, {everything.dtype}.\n"
    )
    echo(
        "Done: the optimizer state was never read. Try `suture inspect PATH --flat` on a"
        " checkpoint of your own."
    )


def _check(passed: bool, what: str) -> None:
    if not passed:
        raise RuntimeError(f"demo check failed: {what} differs from what numpy gives")
