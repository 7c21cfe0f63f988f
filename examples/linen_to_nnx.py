"""Migrate a Linen checkpoint to an NNX model whose layers have new names.

Run: python examples/linen_to_nnx.py [workdir]
"""

import sys
import tempfile
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

import suture
from suture import rules


class LinenMLP(nn.Module):  # the old model code: Dense_0, Dense_1
    @nn.compact
    def __call__(self, x):
        hidden = nn.relu(nn.Dense(8)(x))  # created first: Dense_0
        return nn.Dense(4)(hidden)  # Dense_1


class NNXMLP(nnx.Module):  # the new model code: encoder, head
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.encoder = nnx.Linear(3, 8, rngs=rngs)
        self.head = nnx.Linear(8, 4, rngs=rngs)

    def __call__(self, x):
        return self.head(nnx.relu(self.encoder(x)))


def main(workdir: Path) -> None:
    x = jnp.ones((2, 3))
    linen_params = LinenMLP().init(jax.random.key(0), x)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(workdir / "linen_ckpt", linen_params)
    checkpointer.wait_until_finished()

    surgery = [rules.rename("params/Dense_0", "encoder"), rules.rename("params/Dense_1", "head")]
    print(suture.plan(surgery, workdir / "linen_ckpt"))
    model = suture.nnx.load_into(lambda: NNXMLP(nnx.Rngs(1)), workdir / "linen_ckpt", surgery)
    np.testing.assert_allclose(model(x), LinenMLP().apply(linen_params, x), rtol=1e-6)
    print("The NNX model computes what the Linen model computed.")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()))
