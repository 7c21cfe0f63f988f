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

from .. import rules
from .._errors import DestinationError
from .._format import human_bytes
from .._iostats import count_bytes_read
from .._save.api import save
from .._surgery.build import transform
from .._surgery.plan import plan
from ..sources.open import open as open_checkpoint
from .diff import diff
from .inspect import describe, render_tree

LAYERS = 4
WIDTH = 512


def make_training_state(seed: int = 0) -> tuple[dict, Callable[[np.ndarray], np.ndarray], str]:
    """A 4-layer MLP trained a few steps with Adam: its state, its forward function, a label.

    With Flax and Optax installed (``suture[flax]``, which ``make demo`` installs) it is a
    Linen MLP and Optax's Adam state; without them, the same arrays built with numpy.
    """
    try:
        import flax.linen as nn  # heavy: loaded on first use, not at import
        import jax  # heavy: loaded on first use, not at import
        import jax.numpy as jnp  # heavy: loaded on first use, not at import
        import optax  # heavy: loaded on first use, not at import
    except ImportError:
        return _numpy_state(seed)

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):  # noqa: ANN001, ANN204
            for i in range(LAYERS):
                x = nn.relu(nn.Dense(WIDTH, name=f"layer{i}")(x))
            return x

    model = MLP()
    params = model.init(jax.random.key(seed), jnp.ones((1, WIDTH)))["params"]
    optimizer = optax.adam(1e-3)
    opt_state = optimizer.init(params)
    inputs = jax.random.normal(jax.random.key(seed + 1), (16, WIDTH))

    @jax.jit
    def train_step(params, opt_state):  # noqa: ANN001, ANN202
        loss = lambda p: jnp.mean(model.apply({"params": p}, inputs) ** 2)  # noqa: E731
        updates, opt_state = optimizer.update(jax.grad(loss)(params), opt_state)
        return optax.apply_updates(params, updates), opt_state

    for _ in range(3):
        params, opt_state = train_step(params, opt_state)
    state = {"params": params, "opt_state": opt_state, "step": np.int32(3)}
    state = jax.tree.map(np.asarray, state)

    def forward(batch: np.ndarray) -> np.ndarray:
        return np.asarray(model.apply({"params": state["params"]}, batch))

    return state, forward, "a Flax Linen MLP with Optax Adam state, after 3 training steps"


def _numpy_state(seed: int) -> tuple[dict, Callable[[np.ndarray], np.ndarray], str]:
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

    state = {
        "params": params,
        "opt_state": {"mu": like_params(1e-3), "nu": like_params(1e-6), "count": np.int32(3)},
        "step": np.int32(3),
    }
    label = "an MLP with Adam-like state built with numpy (install suture[flax] for Flax and Optax)"
    return state, lambda batch: _forward(batch, [params[f"layer{i}"] for i in range(LAYERS)]), label


def write_checkpoint(state: dict, path: Path) -> None:
    """Saves `state` with stock Orbax, one chunk per row of each kernel.

    ``shard_axes=(0,)`` alone splits the first axis down to single rows; a
    ``chunk_byte_size`` that small would make Orbax warn about small chunks.
    """
    import orbax.checkpoint as ocp  # heavy: loaded on first use, not at import

    def save_args(leaf: np.ndarray) -> ocp.SaveArgs:
        return ocp.SaveArgs(shard_axes=(0,) if leaf.ndim else ())

    import jax  # heavy: loaded on first use, not at import

    checkpointer = ocp.PyTreeCheckpointer()
    checkpointer.save(path, state, save_args=jax.tree.map(save_args, state))


def run_demo(workdir: Path | None, echo: Callable[[str], None] = print) -> None:
    """Runs the demo, printing each step; raises if any check fails."""
    own_tmp = workdir is None
    root = Path(tempfile.mkdtemp(prefix="suture-demo-")) if own_tmp else _workdir(workdir)
    try:
        _run(root, echo)
    finally:
        if own_tmp:
            shutil.rmtree(root, ignore_errors=True)


def _workdir(workdir: Path) -> Path:
    """`workdir` as an absolute folder (Orbax takes only absolute paths), created if absent."""
    root = Path(workdir).expanduser().absolute()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DestinationError(
            f"Cannot use {str(workdir)!r} as the demo's folder: {error.strerror or error}. "
            f"Pass --workdir a folder, or a path where one can be created."
        ) from None
    return root


def _run(root: Path, echo: Callable[[str], None]) -> None:
    path = root / "mlp_checkpoint"
    if path.exists():
        shutil.rmtree(path)
    state, forward, label = make_training_state()
    started = time.perf_counter()
    write_checkpoint(state, path)
    echo(f"1. Saved {label}, using stock Orbax -> {path} ({time.perf_counter() - started:.1f} s)\n")

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

    changes = diff(path, output)
    echo(
        f"\n6. suture diff of before and after: {len(changes.only_a)} leaves only before (the"
        f" optimizer state and the per-layer params), {len(changes.only_b)} only after (the"
        f" stacked layers); {len(changes.changed)} changed in place."
    )

    import orbax.checkpoint as ocp  # heavy: loaded on first use, not at import

    restored = ocp.StandardCheckpointer().restore(output)
    layers = restored["params"]["layers"]
    batch = np.random.default_rng(1).standard_normal((8, WIDTH)).astype(np.float32)
    before = forward(batch)
    after = _forward(batch, [{key: layers[key][i] for key in layers} for i in range(LAYERS)])
    error = float(np.max(np.abs(before - after)) / np.max(np.abs(before)))
    _check(error < 0.05, f"outputs differ by {error:.3f} (relative)")
    echo(
        f"\n7. Stock Orbax restores the new checkpoint, and the model gives the same outputs:"
        f" a scan-style loop over the stacked bfloat16 layers differs from the original float32"
        f" model by {error:.2%} of the output's scale (bfloat16 rounding)."
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
