"""`suture merge CONFIG -o OUT`: a merge config (suture's or mergekit's) to a written model."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from .._location import names_one_safetensors_file
from .._merge.api import merge
from .._merge.config import read_config, suture_arguments
from .._merge.hf_output import hf_side_files, is_hf_folder
from .._merge.mergekit_config import load_mergekit
from .._save.api import save
from .._surgery.plan import plan as make_plan
from ..sinks.orbax import DEFAULT_COMPRESSION

MERGEKIT_SHARD_SIZE = "5GB"
MERGEKIT_CONFIG = "mergekit_config.yml"  # the name mergekit gives the config in its output


def run_merge(
    config_path: str,
    output: str,
    *,
    format: str | None = None,  # noqa: A002 (the CLI's word)
    max_memory: str | None = None,
    overwrite: bool = False,
    dry_run: bool = False,
    verify: bool = False,
    progress: bool | None = None,
    compression: str = DEFAULT_COMPRESSION,
) -> Any:
    """Merges as `config_path` says and writes `output`; returns the `SaveResult` (or, for a
    dry run, the plan as text).

    With safetensors output and Hugging Face folders as inputs, `output` becomes a Hugging
    Face folder (see `suture._merge.hf_output`).
    """
    config = read_config(config_path)
    if "merge_method" in config.data:
        loaded = load_mergekit(config)
        tree, models, base, donor = loaded.tree, loaded.models, loaded.base, loaded.donor
        method, layers, out_dtype = (
            loaded.method,
            loaded.layers if loaded.sliced else None,
            loaded.out_dtype,
        )
        chosen_format = format or "safetensors"
    else:
        settings = suture_arguments(config)
        models, method = settings.pop("models"), settings.pop("method")
        tree = merge(models, method, **settings)
        base, layers, out_dtype = settings.get("base"), None, settings.get("dtype")
        donor = base or models[0]
        chosen_format = format or "orbax"
    if dry_run:
        return str(make_plan(None, tree))
    options: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="suture-merge-") as staging:
        folder_output = chosen_format == "orbax" or not names_one_safetensors_file(output)
        if chosen_format == "safetensors" and is_hf_folder(donor):
            options["max_shard_size"] = MERGEKIT_SHARD_SIZE
            options["extra_files"] = hf_side_files(
                donor,
                Path(staging),
                method=method,
                models=models,
                base=base,
                config_text=config.text,
                layers=layers,
                out_dtype=out_dtype,
            )
        if "merge_method" in config.data and folder_output:
            # as mergekit does: the Hub's model pages and users' scripts read it
            written = Path(staging) / MERGEKIT_CONFIG
            written.write_text(config.text, encoding="utf-8")
            options["extra_files"] = {**options.get("extra_files", {}), MERGEKIT_CONFIG: written}
        return save(
            tree,
            output,
            format=chosen_format,
            overwrite=overwrite,
            max_memory=max_memory,
            progress=progress,
            verify=verify,
            compression=compression,
            **options,
        )
