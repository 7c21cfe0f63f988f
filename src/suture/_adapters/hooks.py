"""What `suture.convert` asks of the adapter package: its arguments checked, and its two jobs."""

from __future__ import annotations

import os
from typing import Any

from .._errors import ArgumentError
from .._save.api import SaveResult
from ..families._file import is_family_recipe
from .api import export_adapter, import_adapter, merged_with_adapter
from .peft_folder import read as read_adapter


def check_adapter_arguments(
    adapter_only: bool,
    merge_adapter: Any,
    format: Any,
    quantize: Any,  # noqa: A002
) -> None:
    if adapter_only and merge_adapter is not None:
        raise ArgumentError(
            "Pass adapter_only= (--adapter-only: convert the adapter alone) or merge_adapter= "
            "(--merge-adapter: merge it into the base), not both."
        )
    if adapter_only and (format is not None or quantize is not None):
        raise ArgumentError(
            "adapter_only= (--adapter-only) writes a PEFT folder (with reverse) or an Orbax "
            "tree of LoRA factors; format= and quantize= do not apply to it."
        )
    if merge_adapter is not None and format == "orbax":
        raise ArgumentError(
            "merge_adapter= (--merge-adapter) writes a Hugging Face folder (safetensors), or "
            "with a family recipe its layout; leave out format='orbax'."
        )


def convert_adapter(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    recipe: Any,
    *,
    reverse: bool,
    config: Any,
    like: Any,
    lora_alpha: float | None,
    overwrite: bool,
    progress: bool | None,
) -> SaveResult:
    """`suture.convert(..., adapter_only=True)`: with `reverse`, JAX -> PEFT; else PEFT -> JAX."""
    if recipe is None or not is_family_recipe(str(recipe)):
        raise ArgumentError(
            "adapter_only= (--adapter-only) maps LoRA factors through a built-in family "
            "recipe: pass one (recipe='llama3:tunix'; `suture recipes` lists them)."
        )
    if reverse:
        return export_adapter(
            source,
            destination,
            str(recipe),
            config=config,
            like=like,
            lora_alpha=lora_alpha,
            overwrite=overwrite,
        )
    if like is not None or lora_alpha is not None:
        raise ArgumentError(
            "like= and lora_alpha= go with an adapter export (reverse=True, --reverse); a "
            "PEFT folder records its own lora_alpha."
        )
    return import_adapter(
        source, destination, str(recipe), config=config, overwrite=overwrite, progress=progress
    )


def adapter_merge(adapter_folder: str | os.PathLike | None) -> Any:
    """The edit `convert(merge_adapter=...)` applies to the HF tree it reads, or None."""
    if adapter_folder is None:
        return None
    read_adapter(adapter_folder)  # a bad folder is refused before anything is opened
    return lambda tree: merged_with_adapter(tree, adapter_folder)
