"""`suture demo`: the main job, end to end, on a checkpoint the demo writes itself.

It saves a small MLP with Adam state using stock orbax-checkpoint, then shows what suture
does with it: open without reading arrays, inspect, read one row of one layer (and only
its chunk), plan a surgery (drop the optimizer state, stack the layers for ``scan``, cast to
bfloat16), stream it to a new checkpoint, and check that stock Orbax restores it and that the
model computes the same outputs.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from . import rules
from ._format import human_bytes
from ._inspect import describe, render_tree
from ._iostats import count_bytes_read
from ._open import open as open_checkpoint
from ._plan import plan
from ._save import save
from ._surgery import transform

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
        f" {human_bytes(row_read.bytes)} from disk, that row's chunk, not the whole"
        f" {human_bytes(kernel.nbytes)} kernel.\n"
    )

    surgery = [
        rules.drop("opt_state"),
        rules.stack(r"params/layer(?P<i>\d+)", into="params/layers"),
        rules.cast("params", "bfloat16"),
    ]
    echo("4. The surgery: drop the optimizer state, stack the layers for scan, cast to bfloat16.")
    echo("   Its plan, computed without reading any array:\n")
    echo(str(plan(surgery, ckpt)))

    output = root / "mlp_for_scan"
    if output.exists():
        shutil.rmtree(output)
    with count_bytes_read() as streaming:
        result = save(transform(surgery, ckpt), output, progress=False)
    echo(
        f"\n5. Streamed it to {output}: read {human_bytes(streaming.bytes)}, wrote"
        f" {human_bytes(result.bytes_written)} in {result.seconds:.1f} s, atomically:\n"
    )
    echo(render_tree(describe(open_checkpoint(output))))

    import orbax.checkpoint as ocp

    restored = ocp.StandardCheckpointer().restore(output)
    layers = restored["params"]["layers"]
    batch = np.random.default_rng(1).standard_normal((8, WIDTH)).astype(np.float32)
    before = _forward(batch, [state["params"][f"layer{i}"] for i in range(LAYERS)])
    after = _forward(batch, [{key: layers[key][i] for key in layers} for i in range(LAYERS)])
    error = float(np.max(np.abs(before - after)) / np.max(np.abs(before)))
    _check(error < 0.05, f"outputs differ by {error:.3f} (relative)")
    echo(
        f"\n6. Stock Orbax restores the new checkpoint, and the MLP gives the same outputs:"
        f" scanning the stacked bfloat16 layers differs from the original float32 model by"
        f" {error:.2%} of the output's scale (bfloat16 rounding)."
    )
    echo(
        "\nDone: the optimizer state was never read. Try `suture inspect PATH` on a checkpoint"
        " of your own."
    )


def _forward(batch: np.ndarray, layers: list[dict]) -> np.ndarray:
    """The MLP: relu(x @ kernel + bias) per layer, computed in float32."""
    hidden = batch
    for layer in layers:
        kernel = np.asarray(layer["kernel"], np.float32)
        bias = np.asarray(layer["bias"], np.float32)
        hidden = np.maximum(hidden @ kernel + bias, 0)
    return hidden


def _check(passed: bool, what: str) -> None:
    if not passed:
        raise RuntimeError(f"demo check failed: {what} differs from what numpy gives")
