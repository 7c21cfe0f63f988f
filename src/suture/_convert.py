"""`suture convert`: one checkpoint to another format, streamed, keeping what makes it whole.

Converting a Hugging Face safetensors folder to Orbax records its layout (shard map,
``__metadata__``, separator, the folder's other files such as ``config.json``) in Orbax's
custom metadata and keeps those files beside the checkpoint; converting back to safetensors
reuses them, so the round trip gives the same names, the same shards and the same index.
"""

from __future__ import annotations

import os
from typing import Any

from . import families, rules
from ._errors import ArgumentError
from ._hf import (
    LAYOUT_KEY,
    keep_safetensors_layout,
    model_folder_side_files,
    reuse_safetensors_layout,
    with_config_edited,
)
from ._lazy.views import strict_casts as strict_casts_on
from ._location import location_of
from ._quant.tensors import dequantized_config
from ._save.api import SaveResult, save
from ._surgery.build import transform
from ._surgery.recipes import forward_record, load_recipe
from .families._convert import DEFAULT_SHARD_SIZE, convert_with_recipe
from .sources.open import open as open_checkpoint


def convert(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    *,
    format: str | None = None,  # noqa: A002
    dtype: str | None = None,
    recipe: str | os.PathLike | None = None,
    reverse: bool = False,
    config: str | os.PathLike | dict[str, Any] | None = None,
    overwrite: bool = False,
    max_memory: int | str | None = None,
    max_shard_size: int | str | None = None,
    separator: str = ".",
    allow_pickle: bool = False,
    progress: bool | None = None,
    strict_casts: bool = False,
    dequantize: bool = False,
    quantize: str | None = None,
    keep_unquantized: list[str] | tuple[str, ...] | None = None,
    like: str | os.PathLike | None = None,
    lora_alpha: float | None = None,
) -> SaveResult:
    """Converts `source` to `destination` (Orbax or safetensors), optionally applying a recipe.

    Args:
        format: ``"orbax"`` or ``"safetensors"``; default from `destination`: a name ending in
            ``.safetensors`` means safetensors, anything else Orbax.
        dtype: cast floating-point leaves to this dtype (``"bfloat16"``).
        recipe: a recipe file applied before writing: YAML or TOML rules, or a Python
            file (``RULES``, ``transform``, ``TARGET``, ``init``; see ``suture apply --help``),
            or the name of a built-in model-family recipe (``llama3.1:maxtext``;
            `suture.families`). A family recipe dequantizes a quantized source (FP8 block
            scales, MXFP4) itself, in the same pass.
        reverse: run a built-in family recipe backwards (MaxText or Tunix -> Hugging Face folder).
        config: the model's ``config.json`` (path or dict) for a family recipe; default: the
            one in the source folder, or the one the forward conversion recorded.
        dequantize: read a quantized Hugging Face folder (``quantization_config`` in its
            ``config.json``: FP8 with block scales, MXFP4) dequantized, in the same streamed
            pass, to `dtype` (default bfloat16); the output's ``config.json`` loses its
            ``quantization_config`` and its dtype fields say the new dtype.
        quantize: ``"fp8-block"``: write FP8 for serving (see `suture.save`);
            `keep_unquantized` as there.
        like: with `reverse`, the model's original Hugging Face folder: its ``config.json``
            (unless `config`), tokenizer and generation files go beside the weights.
        lora_alpha: with a ``FAMILY:tunix`` recipe backwards, the LoRA alpha of a checkpoint
            that holds LoRA factors, merged as ``w + (a @ b) * (alpha / rank)``.
        Other arguments as in `suture.open` and `suture.save`.

    Example:
        >>> import numpy as np, suture, tempfile, os
        >>> folder = tempfile.mkdtemp()
        >>> _ = suture.save({"w": np.ones(3, np.float32)}, os.path.join(folder, "ckpt"), progress=False)
        >>> result = suture.convert(os.path.join(folder, "ckpt"), os.path.join(folder, "w.safetensors"), progress=False)
        >>> result.format
        'safetensors'
    """
    with strict_casts_on(strict_casts):  # casts built meanwhile check their values
        return _convert(
            source,
            destination,
            format,
            dtype,
            recipe,
            reverse,
            config,
            overwrite,
            max_memory,
            max_shard_size,
            separator,
            allow_pickle,
            progress,
            strict_casts,
            dequantize,
            quantize,
            keep_unquantized,
            like=like,
            lora_alpha=lora_alpha,
        )


def _convert(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    format: str | None,  # noqa: A002
    dtype: str | None,
    recipe: str | os.PathLike | None,
    reverse: bool,
    config: str | os.PathLike | dict[str, Any] | None,
    overwrite: bool,
    max_memory: int | str | None,
    max_shard_size: int | str | None,
    separator: str,
    allow_pickle: bool,
    progress: bool | None,
    strict_casts: bool,
    dequantize: bool,
    quantize: str | None,
    keep_unquantized: list[str] | tuple[str, ...] | None,
    like: str | os.PathLike | None = None,
    lora_alpha: float | None = None,
) -> SaveResult:
    if recipe is not None and families.is_recipe_name(str(recipe)):
        return convert_with_recipe(
            source,
            destination,
            str(recipe),
            reverse=reverse,
            config=config,
            dtype=dtype,
            overwrite=overwrite,
            max_memory=max_memory,
            max_shard_size=max_shard_size,
            progress=progress,
            dequantize=dequantize,
            like=like,
            lora_alpha=lora_alpha,
        )
    if reverse or config is not None or like is not None or lora_alpha is not None:
        raise ArgumentError(
            "reverse= and config= go with a built-in family recipe (recipe='llama3.1:maxtext'; "
            "`suture recipes` lists them), as do like= and lora_alpha=."
        )
    target_format = format or (
        "safetensors" if str(destination).endswith(".safetensors") else "orbax"
    )
    if dequantize and quantize is not None:
        raise ArgumentError("Pass dequantize= or quantize=, not both.")
    ckpt = open_checkpoint(
        source,
        separator=separator,
        allow_pickle=allow_pickle,
        dequantize=dequantize,
        dequantize_dtype=dtype or "bfloat16",
    )
    stored_quantized = "quantization_config" in ckpt.layout and not dequantize
    if stored_quantized and (dtype is not None or quantize is not None):
        raise ArgumentError(
            f"{str(source)!r} is quantized (its config.json has a quantization_config): "
            f"{'casting' if dtype is not None else 'quantizing'} its stored tensors would treat "
            f"FP8 or packed FP4 values without their scales as weights. Add --dequantize "
            f"(dequantize=True) to read the real values first."
        )
    tree: Any = ckpt.tree
    if recipe is not None:
        loaded = load_recipe(recipe)
        tree = transform(loaded.transform, ckpt, target=loaded.target, init=loaded.init)
    if dtype is not None:
        tree = rules.apply_rules([rules.cast(".*", dtype, optional=True)], tree)
    options: dict[str, Any] = {}
    renamed = recipe is not None
    reformatted = dequantize or quantize is not None  # other names, other sizes: new shards
    if ckpt.format == "safetensors" and target_format == "orbax" and not renamed:
        options = keep_safetensors_layout(ckpt, location_of(source), separator)
        if reformatted:
            options["metadata"][LAYOUT_KEY]["weight_map"] = None
    elif target_format == "safetensors" and max_shard_size is None and reformatted:
        max_shard_size = DEFAULT_SHARD_SIZE
    elif target_format == "safetensors" and max_shard_size is None and not renamed:
        one_file = str(destination).endswith(".safetensors")
        options = reuse_safetensors_layout(ckpt, location_of(source), separator, one_file)
    if recipe is not None:  # what the recipe read, for `suture apply --reverse`
        record = forward_record(
            loaded.transform, [ckpt], dtype, strict_casts, loaded.target, loaded.init
        )
        if record is not None:
            options["metadata"] = record
    folder_output = target_format == "orbax" or not str(destination).endswith(".safetensors")
    if folder_output and "extra_files" not in options:
        options["extra_files"] = model_folder_side_files(source)
    if dequantize and "extra_files" in options:
        options["extra_files"] = with_config_edited(
            options["extra_files"], dequantized_config(dtype or "bfloat16")
        )
    separator = options.pop("separator", separator)
    return save(
        tree,
        destination,
        format=target_format,
        overwrite=overwrite,
        max_memory=max_memory,
        max_shard_size=max_shard_size,
        separator=separator,
        progress=progress,
        quantize=quantize,
        keep_unquantized=keep_unquantized,
        **options,
    )
