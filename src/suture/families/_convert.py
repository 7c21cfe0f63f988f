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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import rules
from .._errors import ArgumentError, ConfigMismatchError, SurgeryError
from .._hf import (
    GONE,
    LAYOUT_KEY,
    NOT_REGULAR,
    keep_safetensors_layout,
    local_side_file,
    model_folder_side_files,
    reuse_safetensors_layout,
    with_config_edited,
    with_config_fetched,
)
from .._location import (
    LocalLocation,
    location_of,
    metadata_read_once,
    names_one_safetensors_file,
)
from .._paths import unflatten
from .._quant.tensors import dequantized_config, dequantized_files
from .._save.api import SaveResult, save
from .._save.mesh import TargetSharding
from .._surgery.recipes import read_limited
from ..sinks.orbax import DEFAULT_COMPRESSION
from ..sources.open import open as open_checkpoint
from . import _tunix as tunix
from ._file import family_recipe
from ._logical_axes import recipe_rules

FAMILY_KEY = "suture.family"
MAX_CONFIG_BYTES = 1 << 20  # as a recipe: a config.json is a few KB; more is a mistake or hostile
EXPERTS_KEY = "experts"  # in FAMILY_KEY's record: the source's expert layout
PREFIX_KEY = "hf_prefix"  # and where a multimodal source keeps its language model
DEFAULT_SHARD_SIZE = "5GB"  # save_pretrained's default


def check_options(
    name: str,
    reverse: bool,
    format: str | None = None,  # noqa: A002
    quantize: str | None = None,
    keep_unquantized: Any = None,
    group_size: int | None = None,
    destination: str | os.PathLike | None = None,
) -> None:
    """Refuses options a family recipe's run would leave unused: it writes Orbax forward and
    a safetensors folder back, unquantized (an output quantized as asked, or not at all);
    and a `destination` named as one safetensors file, which `convert` otherwise writes.

    Example:
        >>> check_options("qwen3:maxtext", False, quantize="W8A16")
        Traceback (most recent call last):
        ...
        suture._errors.ArgumentError: quantize='W8A16' (--quantize) does not go with the family recipe 'qwen3:maxtext', which writes its layout unquantized. Convert first, then quantize its Hugging Face folder: suture convert FOLDER OUT --quantize W8A16.
    """
    written = "safetensors" if reverse else "orbax"
    if format is None and destination is not None and names_one_safetensors_file(destination):
        writes = "a Hugging Face folder (shards and config.json)" if reverse else "an Orbax folder"
        raise ArgumentError(
            f"{str(destination)!r} names one safetensors file, but the family recipe {name!r}"
            f"{' run backwards' if reverse else ''} writes {writes}: give the output a name "
            f"without .safetensors"
            f"{'' if reverse else ', or run the recipe backwards (--reverse) for an HF folder'}."
        )
    if format is not None and format != written:
        raise ArgumentError(
            f"format={format!r} (--format) does not go with the family recipe {name!r}"
            f"{' run backwards' if reverse else ''}, which writes {written}: leave --format "
            f"out{'' if reverse else ', or run the recipe backwards (--reverse) for an HF folder'}."
        )
    given = {
        "quantize": quantize,
        "keep_unquantized": keep_unquantized or None,
        "group_size": group_size,
    }
    for option, value in given.items():
        if value is not None:
            flag = "--" + option.replace("_", "-")
            raise ArgumentError(
                f"{option}={value!r} ({flag}) does not go with the family recipe {name!r}, "
                f"which writes its layout unquantized. Convert first, then quantize its Hugging "
                f"Face folder: suture convert FOLDER OUT --quantize {quantize or 'SCHEME'}."
            )


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
    dequantize: bool = False,
    verify: bool = False,
    compression: str = DEFAULT_COMPRESSION,
    lora_alpha: float | None = None,
    edit_hf: Callable[[Any], Any] | None = None,
    target_sharding: Any = None,
    save_with: Callable[..., Any] = save,
) -> SaveResult:
    """Converts `source` with the built-in recipe `name`; see `suture.convert`.

    `edit_hf`: applied to the Hugging Face tree read, before the recipe (an adapter merged).
    `save_with`: what is done with the lazy result and the options of its save (default
    `save`; `suture convert --dry-run` prints its plan instead, and returns that).

    A quantized Hugging Face source (FP8 block scales, MXFP4) is dequantized as it is read,
    in the same pass (to `dtype`, default bfloat16): recipes see real values, never
    packed bytes and scales. Back to HF, `like` is the model's original HF folder: its
    config.json (unless `config`), tokenizer and generation files go beside the weights.
    A Tunix source may be what Tunix's CheckpointManager wrote: its root (the latest step),
    a step, or the step's ``model_params``; LoRA factors in it are merged (`tunix`).
    """
    recipe = family_recipe(name)  # a built-in name, or a family table file of the user's
    if like is not None and not reverse:
        raise ArgumentError(
            "like= (--like) is the original Hugging Face folder of a conversion back to HF; "
            "it goes with reverse=True (--reverse)."
        )
    if lora_alpha is not None and not (reverse and recipe.target == "tunix"):
        raise ArgumentError(
            f"lora_alpha= (--lora-alpha) merges the LoRA adapters of a Tunix checkpoint; it "
            f"goes with a FAMILY:tunix recipe and reverse=True, not {name!r}"
            f"{'' if reverse else ' forward'}."
        )
    if reverse and edit_hf is not None:
        raise ArgumentError(
            "merge_adapter= (--merge-adapter) merges a PEFT adapter into a Hugging Face base "
            "as it is converted forward; run it without reverse (--reverse), or merge into "
            "the HF folder the reverse conversion writes."
        )
    if reverse and recipe.target == "tunix":
        source = tunix.model_params(source)
    # opening, the config and the side files ask a bucket the same questions: once each
    with metadata_read_once():
        ckpt = open_checkpoint(
            source,
            separator=".",
            dequantize=True if dequantize else "auto",
            dequantize_dtype=dtype or "bfloat16",
        )
        if not reverse:
            settings = read_config(config) if config is not None else _config_beside(source, name)
            options = keep_safetensors_layout(ckpt, location_of(source), ".")
            # read above: held, so that the save copies it without asking the bucket again
            options["extra_files"] = with_config_fetched(options["extra_files"])
    if not reverse:
        if ckpt.layout.get("dequantized"):
            settings = dequantized_config(dtype or "bfloat16")(settings)
        tree = recipe.to_maxtext(edit_hf(ckpt.tree) if edit_hf else ckpt.tree, settings)
        if ckpt.layout.get("dequantized"):  # the stored names and shards are not the tree's
            options["metadata"][LAYOUT_KEY]["weight_map"] = None
            options["extra_files"] = dequantized_files(
                with_config_edited(options["extra_files"], dequantized_config(dtype or "bfloat16"))
            )
        record: dict[str, Any] = {"recipe": recipe.name, "config": settings}
        experts = recipe.expert_layout(ckpt.tree, settings)
        if experts is not None:
            record[EXPERTS_KEY] = experts
        prefix = recipe.hf_prefix(ckpt.tree)
        if prefix is not None:
            record[PREFIX_KEY] = prefix
        options["metadata"][FAMILY_KEY] = record
        if isinstance(target_sharding, TargetSharding) and target_sharding.rules is None:
            target_sharding = TargetSharding(
                target_sharding.mesh, recipe_rules(recipe, settings, tree)
            )
        return save_with(
            _cast(tree, dtype),
            destination,
            format="orbax",
            overwrite=overwrite,
            max_memory=max_memory,
            progress=progress,
            verify=verify,
            compression=compression,
            target_sharding=target_sharding,
            **options,
        )
    recorded = (
        ckpt.custom_metadata.get(FAMILY_KEY) if isinstance(ckpt.custom_metadata, dict) else None
    )
    like_files = model_folder_side_files(like) if like is not None else {}
    record = recorded if isinstance(recorded, dict) else {}
    forward = record.get("recipe")
    if isinstance(forward, str) and forward != recipe.name:
        raise ConfigMismatchError(
            f"{str(source)!r} was converted with recipe {forward!r}; reversing it with "
            f"{recipe.name!r} would undo other operations. Reverse with --recipe {forward}."
        )
    if config is not None:
        settings = read_config(config)
    elif like is not None:
        settings = _config_beside(like, name)
    elif isinstance(record.get("config"), dict):
        settings = record["config"]
    else:
        settings = _config_beside(source, name)
    recorded_experts, prefix = record.get(EXPERTS_KEY), record.get(PREFIX_KEY)
    # a quantized original (Kimi K2.5's INT4 experts) is read as the forward run read it
    like_ckpt = open_checkpoint(like, separator=".", dequantize="auto") if like else None
    like_tree = like_ckpt.tree if like_ckpt is not None else None
    if like_ckpt is not None and like_ckpt.layout.get("dequantized"):
        edit = dequantized_config(dtype or "bfloat16")  # the output is not quantized
        like_files = dequantized_files(with_config_edited(like_files, edit))
    experts = recorded_experts
    if like_tree is not None:
        experts = recipe.expert_layout(like_tree, settings)
        prefix = recipe.hf_prefix(like_tree)
    if prefix is not None and not isinstance(prefix, str):
        raise ConfigMismatchError(f"The recorded HF prefix {prefix!r} is not a string.")
    tree = ckpt.tree
    if recipe.target == "tunix":

        def base() -> Any:  # the base model, for a checkpoint of adapters alone
            return recipe.to_target(like_tree, settings)

        tree = tunix.merged_lora(tree, lora_alpha, base if like is not None else None)
    tensors = recipe.to_hf(tree, settings, experts, prefix, like_tree)
    if isinstance(record.get("config"), dict) and settings is not record["config"]:
        # after the shapes are checked (which name what does not fit): what else the table reads
        given = f"--config {str(config)!r}" if config is not None else f"--like {str(like)!r}"
        _check_recorded_config(recipe, record["config"], settings, given)
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
        extra.update(like_files)
        if "config.json" not in extra:
            extra["config.json"] = Path(scratch) / "config.json"
            extra["config.json"].write_text(json.dumps(settings, indent=2) + "\n")
        if "shard_map" not in options:
            options["max_shard_size"] = max_shard_size or DEFAULT_SHARD_SIZE
        return save_with(
            _cast(unflatten(tensors, sep="."), dtype),
            destination,
            format="safetensors",
            overwrite=overwrite,
            max_memory=max_memory,
            progress=progress,
            verify=verify,
            compression=compression,
            separator=".",
            extra_files=extra,
            target_sharding=target_sharding,
            **options,
        )


def _check_recorded_config(recipe: Any, recorded: dict, settings: dict, given: str) -> None:
    """Refuses a reverse whose config (`given`) differs from the forward run's in a field the
    table reads: the shapes may fit, the values would not (a query scaled by another
    head_dim, an output layer left out as tied)."""
    before, now = recipe.config_names(recorded), recipe.config_names(settings)
    read = set(recipe.fields) | {field for field, _ in recipe.layer_patterns}
    read |= {field for field, _ in recipe.layer_sets}
    read |= {field for field, _ in recipe.layer_rules}
    for field in sorted(read):
        if before.get(field) != now.get(field):
            raise ConfigMismatchError(
                f"The config of {given} has {field!r} = {now.get(field)!r:.60}, and the "
                f"config this checkpoint was converted with has {before.get(field)!r:.60}; "
                f"recipe {recipe.name!r} reads {field!r}, so the values would come back wrong. "
                f"Reverse with the config it was converted from: leave --config out (the "
                f"recorded one is used), or --like the original Hugging Face folder."
            )


def _cast(tree: Any, dtype: str | None) -> Any:
    if dtype is None:
        return tree
    return rules.apply_rules([rules.cast(".*", dtype, optional=True)], tree)


def read_config(config: Any) -> dict[str, Any]:
    """A model config: a dict, or a config.json path, URL or Location, read like a recipe:
    a regular file (a FIFO or device is refused unopened) of at most `MAX_CONFIG_BYTES`.

    Its values are checked by the recipe that reads them (`FamilyRecipe.config_names`).
    """
    if isinstance(config, dict):
        return dict(config)
    label = f"Model config {str(config)!r}"
    try:
        place = location_of(config)
        if isinstance(place, LocalLocation):
            raw = read_limited(
                place.path, label, "a config.json", MAX_CONFIG_BYTES, ConfigMismatchError
            )
        else:
            raw = place.read_head(MAX_CONFIG_BYTES + 1)
            if len(raw) > MAX_CONFIG_BYTES:
                raise ConfigMismatchError(
                    f"{label} is over {MAX_CONFIG_BYTES // 1024} KiB; a config.json is small. "
                    f"Check the path."
                )
        loaded = json.loads(raw)
    except ConfigMismatchError:
        raise
    except RecursionError:
        raise ConfigMismatchError(f"{label} nests too deeply to be a config.json.") from None
    except (OSError, ValueError, SurgeryError) as error:
        said = str(error).rstrip()
        raise ConfigMismatchError(
            f"Cannot read the model config {str(config)!r}: {said}{'' if said.endswith('.') else '.'}"
        ) from None
    if not isinstance(loaded, dict):
        raise ConfigMismatchError(f"{str(config)!r} is not a config.json: it holds no JSON object.")
    return loaded


def _config_beside(source: str | os.PathLike, name: str) -> dict[str, Any]:
    """The config.json beside `source`'s weights, taken under the side-file rules: a link out
    of the folder is refused (its content would land in the output), unlike --config."""
    place = location_of(source)
    folder = place if place.is_dir() else place.parent
    candidate: Any = folder / "config.json"
    if isinstance(folder, LocalLocation):
        found = local_side_file(folder.path, "config.json")
        if found == GONE:
            candidate = None
        elif isinstance(found, str) and found != NOT_REGULAR:
            raise ConfigMismatchError(
                f"Not reading {str(candidate)!r}: {found}. suture reads a config.json found "
                f"beside the weights only when it is a regular file in the model folder, as "
                f"it copies side files. Pass it as --config PATH (config= in Python) if you "
                f"trust it."
            )
        elif isinstance(found, Path):
            candidate = found  # a cache snapshot's link reads its blob
        # else a FIFO, device or folder named config.json: read_config refuses it by name
    elif not candidate.is_file():
        candidate = None
    if candidate is None:
        raise ConfigMismatchError(
            f"Recipe {name!r} needs the model's config.json (head counts, head_dim, layers), "
            f"and {str(folder)!r} has none. Pass it: --config path/to/config.json "
            f"(config= in Python)."
        )
    return read_config(candidate)
