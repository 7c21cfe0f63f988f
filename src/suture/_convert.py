"""`suture convert`: one checkpoint to another format, streamed, keeping what makes it whole.

Converting a Hugging Face safetensors folder to Orbax records its layout (shard map,
``__metadata__``, separator, the folder's other files such as ``config.json``) in Orbax's
custom metadata and keeps those files beside the checkpoint; converting back to safetensors
reuses them, so the round trip gives the same names, the same shards and the same index.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import rules
from ._errors import ArgumentError
from ._hf import (
    LAYOUT_KEY,
    keep_safetensors_layout,
    model_folder_side_files,
    reuse_safetensors_layout,
    with_config_edited,
)
from ._lazy.views import strict_casts as strict_casts_on
from ._location import location_of, names_one_safetensors_file
from ._paths import VALUE_KEYS, flatten, strip_variable_keys
from ._quant.tensors import dequantized_config, dequantized_files
from ._save.api import SaveResult, save
from ._surgery.build import transform
from ._surgery.recipes import forward_record, load_recipe
from .families._convert import DEFAULT_SHARD_SIZE, check_options, convert_with_recipe
from .families._file import is_family_recipe
from .families._names import unknown_name
from .sinks.orbax import DEFAULT_COMPRESSION
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
    like: str | os.PathLike | None = None,
    overwrite: bool = False,
    max_memory: int | str | None = None,
    max_shard_size: int | str | None = None,
    separator: str = ".",
    allow_pickle: bool = False,
    progress: bool | None = None,
    verify: bool = False,
    compression: str = DEFAULT_COMPRESSION,
    keep_value_keys: bool = False,
    strict_casts: bool = False,
    dequantize: bool = False,
    quantize: str | None = None,
    keep_unquantized: list[str] | tuple[str, ...] | None = None,
    group_size: int | None = None,
    lora_alpha: float | None = None,
    adapter_only: bool = False,
    merge_adapter: str | os.PathLike | None = None,
    target_sharding: Any = None,
) -> SaveResult:
    """Converts `source` to `destination` (Orbax or safetensors), optionally applying a recipe.

    Args:
        format: ``"orbax"`` or ``"safetensors"``; default from `destination`: a name ending in
            ``.safetensors`` means safetensors, anything else Orbax (safetensors with
            `quantize`: the FP8 layout serving stacks load is a Hugging Face folder's; and
            with `dequantize` of a Hugging Face folder, which gives a folder again).
        dtype: cast floating-point leaves to this dtype (``"bfloat16"``).
        recipe: a recipe file applied before writing: YAML or TOML rules, or a Python
            file (``RULES``, ``transform``, ``TARGET``, ``init``; see ``suture apply --help``),
            or the name of a built-in model-family recipe (``llama3.1:maxtext``;
            `suture.families`). A family recipe dequantizes a quantized source (FP8 block
            scales, MXFP4) itself, in the same pass.
        reverse: run a built-in family recipe backwards (MaxText or Tunix -> Hugging Face folder).
        config: the model's ``config.json`` (path or dict) for a family recipe; default: the
            one in the source folder, or the one the forward conversion recorded.
        verify: read the output back and check it before publishing it (`suture.save`).
        compression: Orbax output: ``"auto"`` (the default), ``"zstd"`` (Orbax's) or
            ``"none"`` (`suture.save`).
        keep_value_keys: safetensors output of a Flax NNX state (``nnx.state(model)``, whose
            arrays are ``.../value``) names tensors without that key (``linear.kernel``, not
            ``linear.kernel.value``) unless this is true.
        strict_casts: a cast that changes a value (an overflow, a float to an integer that
            loses its fraction) is an error naming the leaf and the element.
        dequantize: read a quantized Hugging Face folder (``quantization_config`` in its
            ``config.json``: FP8 with block scales, MXFP4) dequantized, in the same streamed
            pass, to `dtype` (default bfloat16); the output's ``config.json`` loses its
            ``quantization_config`` and its dtype fields say the new dtype.
        quantize: ``"fp8-block"``, or one of compressed-tensors' presets (``"W4A16"``,
            ``"W8A16"``, ``"NVFP4A16"``, ``"FP8_DYNAMIC"``): write a serving format (see
            `suture.save`); `keep_unquantized` and `group_size` as there.
        like: with `reverse`, the model's original Hugging Face folder: its ``config.json``
            (unless `config`), tokenizer and generation files go beside the weights; the
            output takes its expert layout (one tensor per expert, or transformers' fused
            experts; default: the source's, as the forward conversion recorded it), and gets
            back what MaxText's layout left out (vocabulary rows past MaxText's, a multimodal
            folder's vision tower); a Tunix checkpoint of LoRA adapters alone is merged into
            its base model.
        lora_alpha: with a ``FAMILY:tunix`` recipe backwards, the LoRA alpha of a checkpoint
            that holds LoRA factors, merged as ``w + (a @ b) * (alpha / rank)``; with
            `adapter_only`, the alpha of qwix factors exported.
        adapter_only: convert a LoRA adapter alone, through the family `recipe`: with
            `reverse`, the LoRA pairs of a JAX checkpoint (Flax NNX, qwix/Tunix) to the folder
            PEFT writes; without, a PEFT folder (`config`: the base's config.json) to qwix
            factors in the recipe's layout. See ``docs/guide/lora-adapters.md``.
        merge_adapter: a PEFT LoRA folder merged into the Hugging Face `source` as it
            streams, as peft's ``merge_and_unload`` computes it; written as an HF folder, or
            with a family `recipe` in its layout.
        target_sharding: Orbax output: chunks that tile each array's shards on the mesh
            that will restore it (``suture.TargetSharding``; see `suture.save`). With a
            built-in MaxText `recipe`, ``TargetSharding("fsdp=8,tensor=2")`` (the mesh
            alone) gives each leaf MaxText's own sharding.
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
        if adapter_only or merge_adapter is not None:
            from ._adapters import hooks

            hooks.check_adapter_arguments(adapter_only, merge_adapter, format, quantize)
            if adapter_only and compression != DEFAULT_COMPRESSION:
                raise ArgumentError(
                    "An adapter-only export is a PEFT folder of safetensors, which are not "
                    "compressed: drop compression=/--compression."
                )
            if adapter_only:
                return hooks.convert_adapter(
                    source, destination, recipe, reverse=reverse, config=config, like=like,
                    lora_alpha=lora_alpha, overwrite=overwrite, progress=progress,
                )  # fmt: skip
        edit = None if merge_adapter is None else hooks.adapter_merge(merge_adapter)
        if recipe is not None and is_family_recipe(str(recipe)):
            check_options(
                str(recipe), reverse, format, quantize, keep_unquantized, group_size, destination
            )
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
                verify=verify,
                compression=compression,
                like=like,
                lora_alpha=lora_alpha,
                edit_hf=edit,
                target_sharding=target_sharding,
            )
        if like is not None or lora_alpha is not None:
            raise ArgumentError(
                "like= and lora_alpha= go with a built-in family recipe run backwards "
                "(recipe='qwen3:tunix', reverse=True; `suture recipes` lists them)."
            )
        tree, options = converted(
            source,
            destination,
            format,
            dtype,
            recipe,
            reverse,
            config,
            separator,
            allow_pickle,
            max_shard_size,
            keep_value_keys,
            strict_casts=strict_casts,
            dequantize=dequantize,
            quantize=quantize,
            edit=edit,
        )
        return save(
            tree,
            destination,
            overwrite=overwrite,
            max_memory=max_memory,
            progress=progress,
            verify=verify,
            compression=compression,
            quantize=quantize,
            keep_unquantized=keep_unquantized,
            group_size=group_size,
            target_sharding=target_sharding,
            **{"max_shard_size": max_shard_size, **options},
        )


def converted(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    format: str | None = None,  # noqa: A002
    dtype: str | None = None,
    recipe: str | os.PathLike | None = None,
    reverse: bool = False,
    config: Any = None,
    separator: str = ".",
    allow_pickle: bool = False,
    max_shard_size: int | str | None = None,
    keep_value_keys: bool = False,
    *,
    strict_casts: bool = False,
    dequantize: bool = False,
    quantize: str | None = None,
    edit: Any = None,
) -> tuple[Any, dict[str, Any]]:
    """What `convert` writes, without writing it: the lazy tree, and the options of its save
    (format, separator, metadata, side files, shard size). Not for built-in family recipes."""
    if reverse or config is not None:
        raise ArgumentError(
            "reverse= and config= go with a built-in family recipe (recipe='llama3.1:maxtext'; "
            "`suture recipes` lists them), as do like= and lora_alpha=."
        )
    serving = quantize is not None or edit is not None  # a Hugging Face folder's layout
    target_format = format or (
        "safetensors" if serving or names_one_safetensors_file(destination) else "orbax"
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
    if format is None and dequantize and ckpt.format == "safetensors":
        # dequantized for another tool: a Hugging Face folder in the new dtype, as it came
        target_format = "safetensors"
    stored_quantized = "quantization_config" in ckpt.layout and not dequantize
    if stored_quantized and (dtype is not None or quantize is not None):
        raise ArgumentError(
            f"{str(source)!r} is quantized (its config.json has a quantization_config): "
            f"{'casting' if dtype is not None else 'quantizing'} its stored tensors would treat "
            f"FP8 or packed FP4 values without their scales as weights. Add --dequantize "
            f"(dequantize=True) to read the real values first."
        )
    tree: Any = ckpt.tree if edit is None else edit(ckpt.tree)
    if recipe is not None:
        _check_not_a_misspelt_name(str(recipe))
        loaded = load_recipe(recipe)
        tree = transform(loaded.transform, ckpt, target=loaded.target, init=loaded.init)
    if dtype is not None:
        tree = rules.apply_rules([rules.cast(".*", dtype, optional=True)], tree)
    if target_format == "safetensors" and not keep_value_keys and _is_variable_state(tree):
        tree = strip_variable_keys(tree)
    options: dict[str, Any] = {}
    renamed = recipe is not None
    reformatted = dequantize or quantize is not None  # other names, other sizes: new shards
    if ckpt.format == "safetensors" and target_format == "orbax" and not renamed:
        options = keep_safetensors_layout(ckpt, location_of(source), separator)
        if reformatted:
            options["metadata"][LAYOUT_KEY]["weight_map"] = None
    elif target_format == "safetensors" and max_shard_size is None and reformatted:
        options["max_shard_size"] = DEFAULT_SHARD_SIZE
    elif target_format == "safetensors" and max_shard_size is None and not renamed:
        one_file = names_one_safetensors_file(destination)
        options = reuse_safetensors_layout(ckpt, location_of(source), separator, one_file)
    if recipe is not None:  # what the recipe read, for `suture apply --reverse`
        record = forward_record(
            loaded.transform, [ckpt], dtype, strict_casts, loaded.target, loaded.init
        )
        if record is not None:
            options["metadata"] = record
    folder_output = target_format == "orbax" or not names_one_safetensors_file(destination)
    if folder_output and "extra_files" not in options:
        options["extra_files"] = model_folder_side_files(source)
    if dequantize and "extra_files" in options:
        options["extra_files"] = dequantized_files(
            with_config_edited(options["extra_files"], dequantized_config(dtype or "bfloat16"))
        )
    options["separator"] = options.get("separator", separator)
    options["format"] = target_format
    return tree, options


def _is_variable_state(tree: Any) -> bool:
    """Whether every array of `tree` is an NNX Variable's ``.../value`` (``nnx.state``)."""
    arrays = [path for path, leaf in flatten(tree).items() if hasattr(leaf, "shape")]
    return bool(arrays) and all(path.rsplit("/", 1)[-1] in VALUE_KEYS for path in arrays)


RECIPE_SUFFIXES = (".py", ".yaml", ".yml", ".toml")


def _check_not_a_misspelt_name(recipe: str) -> None:
    """A recipe that is no file and has no recipe suffix (``llama31:maxtext``, ``llama3.1``)
    is a built-in name misspelt: the error suggests the names, as for ``llama3.1:maxtex``."""
    if Path(recipe).suffix.lower() in RECIPE_SUFFIXES or Path(recipe).exists():
        return
    raise unknown_name(recipe, RECIPE_SUFFIXES)
