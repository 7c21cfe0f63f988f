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
from ._hf import keep_safetensors_layout, model_folder_side_files, reuse_safetensors_layout
from ._location import location_of
from ._save.api import SaveResult, save
from ._surgery.build import transform
from ._surgery.recipes import load_recipe
from .families._convert import convert_with_recipe
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
        like: with `reverse`, a Hugging Face folder whose expert layout (one tensor per
            expert, or transformers' fused experts) the output takes; default: the source's,
            as the forward conversion recorded it.
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
        return convert_with_recipe(
            source,
            destination,
            str(recipe),
            reverse=reverse,
            config=config,
            dtype=dtype,
            like=like,
            overwrite=overwrite,
            max_memory=max_memory,
            max_shard_size=max_shard_size,
            progress=progress,
        )
    if reverse or config is not None or like is not None:
        raise ArgumentError(
            "reverse= and config= go with a built-in family recipe (recipe='llama3.1:maxtext'; "
            "`suture recipes` lists them), and so does like=."
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
        options = keep_safetensors_layout(ckpt, location_of(source), separator)
    elif target_format == "safetensors" and max_shard_size is None and not renamed:
        one_file = str(destination).endswith(".safetensors")
        options = reuse_safetensors_layout(ckpt, location_of(source), separator, one_file)
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
