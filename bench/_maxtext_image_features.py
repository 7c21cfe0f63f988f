"""Loads a MaxText multimodal checkpoint in MaxText's own model on the CPU and saves the image
features its vision encoder and projector give (run in MaxText's venv).

    python -P bench/_maxtext_image_features.py IMAGES.npy FEATURES.npy model_name=gemma3-4b use_multimodal=True ... load_parameters_path=CKPT

IMAGES.npy holds float32 images (batch, height, width, channels), as MaxText's encoder takes
them; FEATURES.npy receives the soft tokens (batch, images, tokens, emb) of
``Transformer.vision_encoder`` (tower, pooling, projector), in float32 with the highest matmul
precision, to set beside transformers' ``get_image_features``; a Qwen3-VL encoder's deepstack
features go beside it (FEATURES-deepstack.npy, one per merger).
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


def main(images_path: str, features_path: str, overrides: list[str]) -> None:
    images = np.load(images_path).astype(np.float32)
    config = pyconfig.initialize(
        [
            "maxtext_image_features",
            *overrides,
            "dtype=float32",
            "dtype_mm=float32",
            "weight_dtype=float32",
            "matmul_precision=highest",
            "attention=dot_product",
            "enable_dropout=False",
            "max_target_length=512",
            f"per_device_batch_size={images.shape[0]}",
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
    with mesh:
        features, deep = model.apply(
            params,
            images,
            nnx_method=lambda module, x, **_: module.vision_encoder(
                input_images=x, deterministic=True
            ),
        )
    np.save(features_path, np.asarray(features, dtype=np.float32))
    if deep:  # Qwen3-VL's deepstack features, one per merger, stacked beside
        stacked = np.stack([np.asarray(one, dtype=np.float32) for one in deep])
        np.save(features_path.removesuffix(".npy") + "-deepstack.npy", stacked)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
