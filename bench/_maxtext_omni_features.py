"""Loads a MaxText Qwen3-Omni checkpoint in MaxText's own model on the CPU and saves what its
vision and audio encoders give (run in MaxText's venv).

    python -P bench/_maxtext_omni_features.py IMAGES.npy AUDIO.npy OUT_DIR model_name=qwen3-omni-30b-a3b ... load_parameters_path=CKPT

IMAGES.npy holds float32 images as MaxText's Qwen3 vision encoder takes them, AUDIO.npy float32
mel features (batch, mel bins, frames); OUT_DIR receives ``image.npy`` (the projector's merged
features), ``deepstack.npy`` (the deepstack mergers' features) and ``audio.npy`` (the audio
encoder and projector's), in float32 with the highest matmul precision, to set beside
transformers' ``get_image_features`` and ``get_audio_features``.
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from maxtext.common import checkpointing  # noqa: E402
from maxtext.common.common_types import MODEL_MODE_TRAIN  # noqa: E402
from maxtext.configs import pyconfig  # noqa: E402
from maxtext.layers import quantizations  # noqa: E402
from maxtext.models import models  # noqa: E402
from maxtext.utils import max_utils, maxtext_utils  # noqa: E402


def main(images_path: str, audio_path: str, out: str, overrides: list[str]) -> None:
    images = np.load(images_path).astype(np.float32)
    audio = np.load(audio_path).astype(np.float32)
    config = pyconfig.initialize(
        [
            "maxtext_omni_features",
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
        merged, deepstack = model.apply(
            params,
            images,
            nnx_method=lambda module, x, **_: module.vision_encoder(
                input_images=x, deterministic=True
            ),
        )
        sound = model.apply(
            params,
            audio,
            nnx_method=lambda module, x, **_: module.audio_encoder(
                input_audio=x, deterministic=True
            ),
        )
    folder = Path(out)
    np.save(folder / "image.npy", np.asarray(merged, dtype=np.float32))
    np.save(folder / "deepstack.npy", np.stack([np.asarray(d, np.float32) for d in deepstack]))
    np.save(folder / "audio.npy", np.asarray(sound, dtype=np.float32))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
