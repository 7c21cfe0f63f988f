"""`suture convert --recipe FAMILY:maxtext [--reverse]`: a family recipe run on a checkpoint.

To MaxText, the source is a Hugging Face folder (or file) and its ``config.json``; the result
is an Orbax checkpoint of MaxText's tree, which also keeps the HF side files (config,
tokenizer) and the safetensors layout in its custom metadata. Back to HF, the config comes
from that metadata (or `config=`), and the output is an HF folder with the same shards,
index and side files as the source had. A mixture-of-experts model goes back in the expert
layout its source had (one tensor per expert, or transformers' fused 3-D tensors), which the
forward run records too, or in the one a `like` HF folder shows.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .. import rules
from .._errors import ConfigMismatchError, SurgeryError
from .._hf import LAYOUT_KEY, keep_safetensors_layout, reuse_safetensors_layout
from .._location import location_of
from .._paths import unflatten
from .._save.api import SaveResult, save
from ..sources.open import open as open_checkpoint
from ._recipe import get_recipe

FAMILY_KEY = "suture.family"
EXPERTS_KEY = "experts"  # in FAMILY_KEY's record: the source's expert layout
PREFIX_KEY = "hf_prefix"  # and where a multimodal source keeps its language model
DEFAULT_SHARD_SIZE = "5GB"  # save_pretrained's default


def convert_with_recipe(
    source: str | os.PathLike,
    destination: str | os.PathLike,
    name: str,
    *,
    reverse: bool = False,
    config: str | os.PathLike | dict[str, Any] | None = None,
    dtype: str | None = None,
    like: str | os.PathLike | None = None,
    overwrite: bool = False,
    max_memory: int | str | None = None,
    max_shard_size: int | str | None = None,
    progress: bool | None = None,
) -> SaveResult:
    """Converts `source` with the built-in recipe `name`; see `suture.convert`."""
    recipe = get_recipe(name)
    ckpt = open_checkpoint(source, separator=".")
    if not reverse:
        settings = read_config(config) if config is not None else _config_beside(source, name)
        tree = recipe.to_maxtext(ckpt.tree, settings)
        options = keep_safetensors_layout(ckpt, location_of(source), ".")
        record: dict[str, Any] = {"recipe": recipe.name, "config": settings}
        experts = recipe.expert_layout(ckpt.tree, settings)
        if experts is not None:
            record[EXPERTS_KEY] = experts
        prefix = recipe.hf_prefix(ckpt.tree)
        if prefix is not None:
            record[PREFIX_KEY] = prefix
        options["metadata"][FAMILY_KEY] = record
        return save(
            _cast(tree, dtype),
            destination,
            format="orbax",
            overwrite=overwrite,
            max_memory=max_memory,
            progress=progress,
            **options,
        )
    recorded = (
        ckpt.custom_metadata.get(FAMILY_KEY) if isinstance(ckpt.custom_metadata, dict) else None
    )
    if config is not None:
        settings = read_config(config)
    elif isinstance(recorded, dict) and isinstance(recorded.get("config"), dict):
        settings = recorded["config"]
    else:
        settings = _config_beside(source, name)
    record = recorded if isinstance(recorded, dict) else {}
    recorded_experts, prefix = record.get(EXPERTS_KEY), record.get(PREFIX_KEY)
    like_tree = open_checkpoint(like, separator=".").tree if like is not None else None
    experts = recorded_experts
    if like_tree is not None:
        experts = recipe.expert_layout(like_tree, settings)
        prefix = recipe.hf_prefix(like_tree)
    if prefix is not None and not isinstance(prefix, str):
        raise ConfigMismatchError(f"The recorded HF prefix {prefix!r} is not a string.")
    tensors = recipe.to_hf(ckpt.tree, settings, experts, prefix, like_tree)
    recorded_layout = LAYOUT_KEY in ckpt.custom_metadata
    options = (
        reuse_safetensors_layout(ckpt, location_of(source), ".", False) if recorded_layout else {}
    )
    options.pop("separator", None)
    if (experts, prefix) != (recorded_experts, record.get(PREFIX_KEY)):
        # the recorded shards name the tensors of another layout
        options.pop("shard_map", None)
    with tempfile.TemporaryDirectory() as scratch:
        extra = dict(options.pop("extra_files", {}))  # the HF side files the forward run kept
        if "config.json" not in extra:
            extra["config.json"] = Path(scratch) / "config.json"
            extra["config.json"].write_text(json.dumps(settings, indent=2) + "\n")
        if "shard_map" not in options:
            options["max_shard_size"] = max_shard_size or DEFAULT_SHARD_SIZE
        return save(
            _cast(unflatten(tensors, sep="."), dtype),
            destination,
            format="safetensors",
            overwrite=overwrite,
            max_memory=max_memory,
            progress=progress,
            separator=".",
            extra_files=extra,
            **options,
        )


def _cast(tree: Any, dtype: str | None) -> Any:
    if dtype is None:
        return tree
    return rules.apply_rules([rules.cast(".*", dtype, optional=True)], tree)


def read_config(config: Any) -> dict[str, Any]:
    """A model config: a dict, or a config.json path, URL or Location."""
    if isinstance(config, dict):
        return dict(config)
    try:
        loaded = json.loads(location_of(config).read_bytes())
    except (OSError, ValueError, SurgeryError) as error:
        raise ConfigMismatchError(
            f"Cannot read the model config {str(config)!r}: {error}."
        ) from None
    if not isinstance(loaded, dict):
        raise ConfigMismatchError(f"{str(config)!r} is not a config.json: it holds no JSON object.")
    return loaded


def _config_beside(source: str | os.PathLike, name: str) -> dict[str, Any]:
    place = location_of(source)
    folder = place if place.is_dir() else place.parent
    candidate = folder / "config.json"
    if not candidate.is_file():
        raise ConfigMismatchError(
            f"Recipe {name!r} needs the model's config.json (head counts, head_dim, layers), "
            f"and {str(folder)!r} has none. Pass it: --config path/to/config.json "
            f"(config= in Python)."
        )
    return read_config(candidate)
