"""Add LoRA to a pretrained NNX model: only the new LoRA arrays are initialized.

Run: python examples/add_lora.py [workdir]
"""

import gc
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

import suture


class Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.proj = nnx.Linear(16, 16, rngs=rngs)
        self.out = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x):
        return self.out(self.proj(x))


class ModelWithLoRA(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.proj = nnx.LoRALinear(16, 16, lora_rank=4, rngs=rngs)
        self.out = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x):
        return self.out(self.proj(x))


def main(workdir: Path) -> None:
    pretrained = Model(nnx.Rngs(0))
    ocp.PyTreeCheckpointer().save(workdir / "pretrained", nnx.state(pretrained))
    before = {id(array) for array in jax.live_arrays()}
    tuned = suture.nnx.load_into(lambda: ModelWithLoRA(nnx.Rngs(1)), workdir / "pretrained")
    gc.collect()
    created = sorted(tuple(a.shape) for a in jax.live_arrays() if id(a) not in before)
    print(f"Arrays allocated: {created} (the pretrained weights and the LoRA pair, once each)")
    np.testing.assert_array_equal(
        np.asarray(tuned.proj.kernel[...]), np.asarray(pretrained.proj.kernel[...])
    )
    print("Output with LoRA:", np.asarray(tuned(jnp.ones((1, 16))))[0])


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()))
