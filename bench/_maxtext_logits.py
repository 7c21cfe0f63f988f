"""Loads a MaxText-layout checkpoint in MaxText's own model on the CPU and saves its logits (run in MaxText's venv).

    python -P bench/_maxtext_logits.py TOKENS.npy LOGITS.npy model_name=llama3.1-8b ... load_parameters_path=CKPT

TOKENS.npy holds int32 token ids of shape (batch, length); LOGITS.npy receives float32 logits of
shape (batch, length, vocab). The model runs in float32 with the highest matmul precision, so
the logits can be set beside a float32 transformers model's.
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from maxtext.common import checkpointing  # noqa: E402
from maxtext.common.common_types import MODEL_MODE_TRAIN  # noqa: E402
from maxtext.configs import pyconfig  # noqa: E402
from maxtext.layers import quantizations  # noqa: E402
from maxtext.models import models  # noqa: E402
from maxtext.utils import max_utils, maxtext_utils  # noqa: E402

# the variable collections restored: the parameters, and DeepSeek-V4's hash-routing tables and
# router biases, which MaxText keeps in collections of their own
COLLECTIONS = ("params", "Tid2EidVar", "MoEBiasVar")


def main(tokens_path: str, logits_path: str, overrides: list[str]) -> None:
    tokens = np.load(tokens_path).astype(np.int32)
    batch, length = tokens.shape
    config = pyconfig.initialize(
        [
            "maxtext_logits",
            *overrides,
            "dtype=float32",
            "weight_dtype=float32",
            "matmul_precision=highest",
            "attention=dot_product",
            "enable_dropout=False",
            f"max_target_length={length}",
            f"per_device_batch_size={batch}",
            "hardware=cpu",
            "skip_jax_distributed_system=True",
            "checkpoint_storage_concurrent_gb=4",
        ]
    )
    mesh = jax.sharding.Mesh(maxtext_utils.create_device_mesh(config), config.mesh_axes)
    model = models.transformer_as_linen(
        config,
        mesh,
        quant=quantizations.configure_quantization(config),
        model_mode=MODEL_MODE_TRAIN,
    )
    variables = maxtext_utils.get_abstract_param(model, config)
    abstract = max_utils.unbox_logicallypartioned(
        {name: tree for name, tree in variables.items() if name in COLLECTIONS}
    )
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), abstract
    )
    params = checkpointing.load_params_from_path(
        config.load_parameters_path,
        abstract,
        config.checkpoint_storage_concurrent_gb,
        use_ocdbt=config.checkpoint_storage_use_ocdbt,
        use_zarr3=config.checkpoint_storage_use_zarr3,
    )
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), tokens.shape)
    segments = np.ones_like(tokens)
    with mesh:
        logits = model.apply(
            params,
            tokens,
            positions,
            decoder_segment_ids=segments,
            enable_dropout=False,
            model_mode=MODEL_MODE_TRAIN,
            rngs={"aqt": jax.random.PRNGKey(0)},
        )
    np.save(logits_path, np.asarray(logits, dtype=np.float32))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
