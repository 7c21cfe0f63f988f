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
from ._errors import CorruptCheckpointError, SurgeryError
from ._location import Location, location_of
from ._open import open as open_checkpoint
from ._recipes import load_recipe
from ._save import SaveResult, save
from ._sidefiles import model_folder_side_files, side_file, side_files
from ._surgery import transform

LAYOUT_KEY = "suture.safetensors_layout"


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
) -> SaveResult:
    """Converts `source` to `destination` (Orbax or safetensors), optionally applying a recipe.

    Args:
        format: ``"orbax"`` or ``"safetensors"``; default from `destination`: a name ending in
            ``.safetensors`` means safetensors, anything else Orbax.
        dtype: cast floating-point leaves to this dtype (``"bfloat16"``).
        recipe: a recipe file applied before writing: YAML or TOML rules, or a Python
            file (``RULES``, ``transform``, ``TARGET``, ``init``; see ``suture apply --help``),
            or the name of a built-in model-family recipe (``llama3.1:maxtext``;
            `suture.families`).
        reverse: run a built-in family recipe backwards (MaxText -> Hugging Face folder).
        config: the model's ``config.json`` (path or dict) for a family recipe; default: the
            one in the source folder, or the one the forward conversion recorded.
        Other arguments as in `suture.open` and `suture.save`.

    Example:
        >>> import numpy as np, suture, tempfile, os
        >>> folder = tempfile.mkdtemp()
        >>> _ = suture.save({"w": np.ones(3, np.float32)}, os.path.join(folder, "ckpt"), progress=False)
        >>> result = suture.convert(os.path.join(folder, "ckpt"), os.path.join(folder, "w.safetensors"), progress=False)
        >>> result.format
        'safetensors'
    """
    if recipe is not None and families.is_recipe_name(str(recipe)):
        from .families._convert import convert_with_recipe

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
        )
    if reverse or config is not None:
        raise SurgeryError(
            "reverse= and config= go with a built-in family recipe (recipe='llama3.1:maxtext'; "
            "`suture recipes` lists them)."
        )
    target_format = format or (
        "safetensors" if str(destination).endswith(".safetensors") else "orbax"
    )
    ckpt = open_checkpoint(source, separator=separator, allow_pickle=allow_pickle)
    tree: Any = ckpt.tree
    if recipe is not None:
        loaded = load_recipe(recipe)
        tree = transform(loaded.transform, ckpt, target=loaded.target, init=loaded.init)
    if dtype is not None:
        tree = rules.apply_rules([rules.cast(".*", dtype, optional=True)], tree)
    options: dict[str, Any] = {}
    renamed = recipe is not None
    if ckpt.format == "safetensors" and target_format == "orbax" and not renamed:
        options = _keep_safetensors_layout(ckpt, location_of(source), separator)
    elif target_format == "safetensors" and max_shard_size is None and not renamed:
        one_file = str(destination).endswith(".safetensors")
        options = _reuse_safetensors_layout(ckpt, location_of(source), separator, one_file)
    folder_output = target_format == "orbax" or not str(destination).endswith(".safetensors")
    if folder_output and "extra_files" not in options:
        options["extra_files"] = model_folder_side_files(source)
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
        **options,
    )


def _keep_safetensors_layout(ckpt: Any, source: Location, separator: str) -> dict[str, Any]:
    folder = (
        source.parent
        if source.name.endswith(".index.json")
        else None
        if source.name.endswith(".safetensors")
        else source
        if source.is_dir()
        else None
    )
    side = side_files(folder) if folder is not None else {}
    layout = {
        "metadata": ckpt.custom_metadata,
        "weight_map": ckpt.layout.get("weight_map"),
        "separator": separator,
        "side_files": sorted(side),
    }
    return {"metadata": {LAYOUT_KEY: layout}, "extra_files": side}


def _reuse_safetensors_layout(
    ckpt: Any, source: Location, separator: str, one_file: bool
) -> dict[str, Any]:
    """Options that write `ckpt` back as the safetensors it came from (shards, side files)."""
    if ckpt.format == "orbax":
        layout = ckpt.custom_metadata.get(LAYOUT_KEY)
        if not isinstance(layout, dict):
            return {}
        _check_layout(layout, source)
        options: dict[str, Any] = {
            "metadata": layout.get("metadata") or None,
            "separator": layout.get("separator", separator),
        }
        shard_map = layout.get("weight_map")
        names = layout.get("side_files", [])
        side = {name: side_file(source, name) for name in names if isinstance(name, str)}
        side_paths = {name: path for name, path in side.items() if path is not None}
    elif ckpt.format == "safetensors":
        options = {"metadata": ckpt.custom_metadata or None}
        shard_map = ckpt.layout.get("weight_map")
        side_paths = {}  # convert() takes them from the Hugging Face folder itself
    else:
        return {}
    if not one_file:
        if shard_map:
            options["shard_map"] = shard_map
        if side_paths:
            options["extra_files"] = side_paths
    return options


def _check_layout(layout: dict, source: Location) -> None:
    """The recorded layout comes from a checkpoint's metadata: its values are checked, not trusted."""
    expected = {
        "metadata": (dict, type(None)),
        "weight_map": (dict, type(None)),
        "separator": (str,),
        "side_files": (list,),
    }
    for key, types in expected.items():
        value = layout.get(key)
        strings = isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        )
        if (key in layout and not isinstance(value, types)) or (
            isinstance(value, dict) and not strings
        ):
            raise CorruptCheckpointError(
                f"The {LAYOUT_KEY!r} custom metadata of {str(source)!r} has {key} = "
                f"{value!r:.100}, which is not what suture records. Pass max_shard_size= "
                f"(--max-shard-size) to lay the output out afresh, or fix the metadata."
            )
    if not all(isinstance(name, str) for name in layout.get("side_files", [])):
        raise CorruptCheckpointError(
            f"The {LAYOUT_KEY!r} custom metadata of {str(source)!r} lists side files that are "
            f"not file names: {layout['side_files']!r:.100}."
        )
    if layout.get("separator") == "":
        raise CorruptCheckpointError(
            f"The {LAYOUT_KEY!r} custom metadata of {str(source)!r} records an empty separator."
        )
