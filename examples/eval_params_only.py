"""Evaluate with the params only: the optimizer state is never read.

Run: python examples/eval_params_only.py [workdir]
"""

import sys
import tempfile
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from flax.training import train_state

import suture


class Classifier(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Dense(256)(x)))


def main(workdir: Path) -> None:
    model = Classifier()
    state = train_state.TrainState.create(
        apply_fn=model.apply,
        params=model.init(jax.random.key(0), jnp.ones((1, 256)))["params"],
        tx=optax.adam(1e-3),
    )
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(workdir / "train_state", state)
    checkpointer.wait_until_finished()

    ckpt = suture.open(workdir / "train_state")
    with suture.count_bytes_read() as reading:
        params = suture.load(ckpt, suture.placeholders(ckpt, skip="opt_state"))["params"]
    total = ckpt.nbytes
    print(
        f"Read {reading.bytes} bytes for evaluation; the checkpoint holds {total} bytes of arrays."
    )
    logits = model.apply({"params": params}, jnp.ones((4, 256)))
    print("Logits:", logits.shape)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()))
