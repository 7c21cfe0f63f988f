"""``suture reshard`` and ``convert --mesh/--sharding``: checkpoints laid out for a target mesh.

Example (the command line):
    suture reshard ckpt ckpt-fsdp8 --mesh fsdp=8,tensor=2 --sharding rules.yaml
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .._errors import ArgumentError
from .._save.api import save
from .._save.mesh import TargetSharding
from ..families._file import is_family_recipe
from ..sources.open import open as open_checkpoint

MESH_HELP = (
    "The mesh that will restore the output, e.g. fsdp=8,tensor=2 (no devices needed); "
    "with --sharding, each array's chunks tile its shards there."
)
SHARDING_HELP = (
    "A YAML or JSON file mapping leaf patterns (regexes of whole '/' paths) to partition "
    "specs, one mesh axis (or null) per array axis; with MaxText's logical_axis_rules in "
    "it, the specs name logical axes. See docs/guide/large-checkpoints.md."
)
Mesh = Annotated[str | None, typer.Option("--mesh", help=MESH_HELP)]
Sharding = Annotated[str | None, typer.Option("--sharding", help=SHARDING_HELP)]


def target_of(
    mesh: str | None,
    sharding: str | None,
    recipe: str | None = None,
    *,
    takes_recipe: bool = False,
) -> TargetSharding | None:
    """The `TargetSharding` of ``--mesh`` and ``--sharding`` (both, or neither; the mesh
    alone with a family `recipe`, whose table knows MaxText's logical axes). `takes_recipe`:
    the command has ``--recipe``, so its error may offer it."""
    if mesh is None and sharding is None:
        return None
    if sharding is None and recipe is not None and is_family_recipe(recipe):
        return TargetSharding(mesh)  # type: ignore[arg-type]
    if mesh is None or sharding is None:
        missing = "--mesh fsdp=8,tensor=2" if mesh is None else "--sharding rules.yaml"
        alone = (
            " A built-in MaxText recipe (--recipe FAMILY:maxtext) knows its leaves' specs: "
            "with it, --mesh alone will do."
            if takes_recipe and mesh is not None
            else ""
        )
        raise ArgumentError(
            f"--mesh and --sharding go together (the mesh, and each leaf's spec on it): add "
            f"{missing}.{alone}"
        )
    return TargetSharding(mesh, sharding)


def run_reshard(
    source: str,
    destination: str,
    mesh: str | None,
    sharding: str | None,
    **save_options: Any,
) -> Any:
    """Rewrites the Orbax checkpoint `source` with chunks for the target mesh, streamed
    under ``max_memory`` (read block by block, rechunked, written); its custom metadata,
    and its non-array leaves are kept."""
    target = target_of(mesh, sharding)
    if target is None:
        raise ArgumentError("reshard needs --mesh and --sharding: the mesh, and each leaf's spec.")
    ckpt = open_checkpoint(source)
    if ckpt.format != "orbax":
        raise ArgumentError(
            f"{source!r} is a {ckpt.format} checkpoint; reshard rewrites Orbax checkpoints. "
            f"Convert it with `suture convert {source} OUT --mesh ... --sharding ...`."
        )
    metadata = ckpt.custom_metadata if isinstance(ckpt.custom_metadata, dict) else None
    return save(ckpt, destination, target_sharding=target, metadata=metadata, **save_options)
