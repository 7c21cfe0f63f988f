"""`suture.open`: the one entry point to every source."""

from __future__ import annotations

from typing import Any

from .checkpoint import Checkpoint
from .detect import open_source


def open(  # noqa: A001
    source: Any,
    *,
    step: int | None = None,
    item: str | None = None,
    format: str | None = None,  # noqa: A002
    separator: str = ".",
    allow_pickle: bool = False,
    dequantize: bool = False,
    dequantize_dtype: Any = "bfloat16",
) -> Checkpoint:
    """Opens a checkpoint lazily: reads metadata only, never array data.

    Args:
        source: a path, an in-memory pytree, or an opened `Checkpoint`. Paths may be an
            Orbax checkpoint (v0 ``StandardCheckpointer`` or ``PyTreeCheckpointer``, v1
            ``ocp.save``, a CheckpointManager root or step), a ``.safetensors`` file, a
            Hugging Face folder or ``*.safetensors.index.json`` of shards, a Flax msgpack
            file, an ``.npz`` archive, or (with `allow_pickle`) a PyTorch file. The format
            is detected from the content. A path may be a ``gs://``, ``s3://`` or
            ``http(s)://`` URL, ``hf://ORG/NAME[@REVISION][/PATH]`` for a model on the
            Hugging Face Hub, or a bare ``ORG/NAME`` that is no local path, read offline
            from the local Hugging Face cache.
        step: for a CheckpointManager root, which step to open (default: the newest).
        item: one item of a CheckpointManager step (``"model"``), opened as the tree itself;
            default: every item, each a subtree under its name.
        format: force a format: ``"orbax"``, ``"safetensors"``, ``"msgpack"``, ``"npz"``,
            ``"torch"``.
        separator: safetensors and PyTorch: splits tensor names into tree paths.
        allow_pickle: open PyTorch files, which are pickles (unpickling can run code).
        dequantize: a Hugging Face folder whose ``config.json`` has a
            ``quantization_config`` (FP8 with block scales, MXFP4, DeepSeek-V4's FP4,
            compressed-tensors ``pack-quantized`` and ``nvfp4-pack-quantized``; ModelOpt's
            ``hf_quant_config.json``) is read dequantized: each quantized tensor under its
            plain name (``...weight``; an MXFP4 ``X_blocks`` as ``X``), lazily, a block at a
            time; the scale tensors are hidden; other tensors pass through. Without it the stored tensors show as they are.
        dequantize_dtype: the dequantized tensors' dtype (``"bfloat16"``, ``"float32"``).

    Returns:
        A `Checkpoint` whose ``.tree`` holds `LazyArray` leaves.

    Raises:
        SurgeryError: the path does not exist, is empty, is not a checkpoint, or is an
            unfinished save; the message names the path and what was found.

    Example:
        >>> import numpy as np, suture
        >>> ckpt = suture.open({"params": {"kernel": np.ones((2, 2), np.float32)}})
        >>> ckpt["params/kernel"].shape
        (2, 2)
    """
    return open_source(
        source,
        step=step,
        item=item,
        format=format,
        separator=separator,
        allow_pickle=allow_pickle,
        dequantize=dequantize,
        dequantize_dtype=dequantize_dtype,
    )
