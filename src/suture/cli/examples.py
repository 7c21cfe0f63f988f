"""`suture demo --examples DIR`: the small checkpoints the README's and the guide's examples name.

The examples open ``ckpt``, ``runs/my_model/checkpoints``, ``hf_model``, ``finetuned_a`` ...;
this writes them (a few MiB in all, with stock Orbax and the safetensors library), so every
example runs as pasted in that folder. The test suite runs the README and the guide in a
folder made by it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import DestinationError, DestinationExistsError

# The README's recipe and merge config, as files the shell examples use.
RECIPE = r"""rules:
  - drop: opt_state
  - rename: {pattern: 'params/linear(\d+)', to: 'params/layer\1'}
  - stack: {pattern: 'params/layer(?P<i>\d+)', into: params/layers}
"""
MERGE = """method: ties
models: [finetuned_a, finetuned_b]
base: ckpt
weights: [0.6, 0.4]
params: {density: 0.3}
per_leaf:
  'params/linear0': {take: 0}
"""
NAMES = (
    "ckpt",
    "runs",
    "finetuned_a",
    "finetuned_b",
    "image_ckpt",
    "text_ckpt",
    "hf_model",
    "base.safetensors",
    "lora.safetensors",
    "recipe.yaml",
    "merge.yaml",
)


def write_examples(folder: str | Path, echo: Callable[[str], None] | None = None) -> list[str]:
    """Writes the examples' checkpoints into `folder` (created if missing); returns their names.

    Raises:
        DestinationExistsError: when one of the names is already there (nothing is replaced).
    """
    import orbax.checkpoint as ocp  # heavy: loaded on first use, not at import
    from safetensors.numpy import save_file  # loaded on first use, as the writers do

    root = Path(folder).expanduser().absolute()  # Orbax takes absolute paths only
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DestinationError(
            f"Cannot write the examples into {str(folder)!r}: {error.strerror or error}. Pass "
            f"--examples a folder you can write to."
        ) from None
    taken = [name for name in NAMES if (root / name).exists()]
    if taken:
        raise DestinationExistsError(
            f"{str(root)!r} already holds {', '.join(taken)}: the examples' files would replace "
            f"them. Give --examples an empty or new folder."
        )
    rng = np.random.default_rng(0)

    def layers(prefix: str = "linear") -> dict[str, Any]:
        return {
            f"{prefix}{i}": {
                "kernel": rng.standard_normal((64, 64), dtype=np.float32),
                "bias": np.zeros(64, np.float32),
            }
            for i in range(4)
        }

    def save(path: Path, tree: dict[str, Any]) -> None:
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(path, tree)
        checkpointer.wait_until_finished()

    step = np.asarray(7, np.int32)
    save(
        root / "ckpt",
        {"params": layers(), "opt_state": {"mu": layers(), "nu": layers()}, "step": step},
    )
    with ocp.CheckpointManager(root / "runs" / "my_model" / "checkpoints") as manager:
        for number in (1000, 2000):
            manager.save(number, args=ocp.args.StandardSave({"params": layers()}))
        manager.wait_until_finished()
    for name in ("finetuned_a", "finetuned_b"):
        save(root / name, {"params": layers(), "step": step})
    save(root / "image_ckpt", {"params": {"dense": {"kernel": np.ones((32, 32), np.float32)}}})
    save(root / "text_ckpt", {"params": {"dense": {"kernel": np.ones((16, 16), np.float32)}}})
    hf = root / "hf_model"
    hf.mkdir()
    weight_map = {}
    for shard in (1, 2):
        filename = f"model-0000{shard}-of-00002.safetensors"
        tensors = {f"model.layers.{shard}.weight": rng.standard_normal((8, 8)).astype(np.float32)}
        save_file(tensors, hf / filename)
        weight_map.update(dict.fromkeys(tensors, filename))
    (hf / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 512}, "weight_map": weight_map})
    )
    (hf / "config.json").write_text("{}")
    save_file({"w": rng.standard_normal((2048, 1024), dtype=np.float32)}, root / "base.safetensors")
    save_file(
        {
            "a": rng.standard_normal((2048, 8), dtype=np.float32),
            "b": rng.standard_normal((8, 1024), dtype=np.float32),
        },
        root / "lora.safetensors",
    )
    (root / "recipe.yaml").write_text(RECIPE)
    (root / "merge.yaml").write_text(MERGE)
    if echo is not None:
        echo(f"Wrote the examples' checkpoints into {root}: {', '.join(NAMES)}.")
        echo("The README's and the guide's examples run there as they are.")
    return list(NAMES)
