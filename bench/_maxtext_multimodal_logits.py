"""Loads a MaxText multimodal checkpoint in MaxText's own model on the CPU and saves the logits
of its whole forward pass over a prompt holding an image (run in MaxText's venv).

    python -P bench/_maxtext_multimodal_logits.py IMAGES.npy TOKENS.npy LOGITS.npy model_name=gemma3-4b use_multimodal=True ... load_parameters_path=CKPT

IMAGES.npy holds float32 images (batch, height, width, channels), as MaxText's encoder takes
them; TOKENS.npy int32 token ids (batch, length) with the model's image placeholder token where
the soft tokens go (Gemma 3's 262144, one per soft token); LOGITS.npy receives float32 logits
(batch, length, vocab) of ``Transformer.__call__`` with ``encoder_images``: the vision encoder
and projector, the soft tokens merged into the embedded prompt, the image tokens attending to
each other both ways, the decoder; in float32 with the highest matmul precision, to set beside
transformers' logits.
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


def main(images_path: str, tokens_path: str, logits_path: str, overrides: list[str]) -> None:
    images = np.load(images_path).astype(np.float32)
    tokens = np.load(tokens_path).astype(np.int32)
    batch, length = tokens.shape
    config = pyconfig.initialize(
        [
            "maxtext_multimodal_logits",
            *overrides,
            "dtype=float32",
            "dtype_mm=float32",
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
    abstract = max_utils.unbox_logicallypartioned(
        maxtext_utils.get_abstract_param(model, config)["params"]
    )
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), abstract
    )
    params = checkpointing.load_params_from_path(
        config.load_parameters_path,
        {"params": abstract},
        config.checkpoint_storage_concurrent_gb,
        use_ocdbt=config.checkpoint_storage_use_ocdbt,
        use_zarr3=config.checkpoint_storage_use_zarr3,
    )
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), tokens.shape)
    with mesh:
        logits = model.apply(
            params,
            tokens,
            positions,
            decoder_segment_ids=np.ones_like(tokens),
            encoder_images=images,
            enable_dropout=False,
            model_mode=MODEL_MODE_TRAIN,
            rngs={"aqt": jax.random.PRNGKey(0)},
        )
    np.save(logits_path, np.asarray(logits, dtype=np.float32))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
