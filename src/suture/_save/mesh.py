"""Saves for a target mesh: each array's chunks tile its shards on the mesh that restores it.

`TargetSharding` names the mesh and each leaf's partition spec (`suture._sharding`);
`target_sharding=` of `suture.save` also takes jax shardings (a tree, or ``{path:
sharding}``, of the `NamedSharding`s a restore passes Orbax). `shards_of` works out every
leaf's shard before anything is written (bad rules fail first), and `chunking` is the
`OrbaxSink`'s hook that gives each array the chunk tiling its shard.

Example:
    >>> import numpy as np
    >>> target = TargetSharding("fsdp=4", {"w": ["fsdp", None]})
    >>> shards = shards_of(target, {"w": np.zeros((64, 8), np.float32), "b": np.zeros(8)})
    >>> shards
    {'w': (16, 8)}
    >>> chunking(shards, 256)("w", LazyArray.from_array(np.zeros((64, 8), np.float32)))
    (8, 8)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import ArgumentError
from .._exec.blocks import stack_axis
from .._lazy.array import LazyArray
from .._paths import flatten
from .._sharding import ShardingRules, parse_mesh, shard_lengths, tiling_chunk


@dataclass(frozen=True, init=False)
class TargetSharding:
    """The mesh a checkpoint is written for, and each leaf's partition spec on it.

    Args:
        mesh: the mesh's axes and sizes, ``"fsdp=8,tensor=2"`` or ``{"fsdp": 8, "tensor": 2}``
            (no devices needed: the mesh of the job that will restore it).
        rules: a YAML or JSON file, or its data: ``{"leaves": {pattern: spec}}`` (regular
            expressions matched against whole '/' paths, first match wins; specs as lists
            or `PartitionSpec`s), with ``"logical_axis_rules"`` (MaxText's) when the specs
            name logical axes. A leaf no pattern matches is replicated. None: the logical
            axes of the built-in MaxText recipe the conversion runs (``suture.convert(...,
            recipe="llama3.1:maxtext")``).

    Example:
        >>> TargetSharding("fsdp=8,tensor=2", {".*kernel": ["fsdp", "tensor"]}).mesh
        {'fsdp': 8, 'tensor': 2}
    """

    mesh: dict[str, int]
    rules: ShardingRules | None

    def __init__(self, mesh: str | Mapping[str, int], rules: Any = None) -> None:
        if rules is None or isinstance(rules, ShardingRules):
            pass
        elif isinstance(rules, (str, os.PathLike)):
            rules = ShardingRules.load(rules)
        else:
            rules = ShardingRules.from_data(rules)
        object.__setattr__(self, "mesh", parse_mesh(mesh))
        object.__setattr__(self, "rules", rules)


def shards_of(target_sharding: Any, tree: Any) -> dict[str, tuple[int, ...]]:
    """``{leaf path: shard shape}`` of every array leaf that `target_sharding` shards."""
    arrays = {
        path: leaf
        for path, leaf in flatten(tree).items()
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype") and len(leaf.shape)
    }
    if isinstance(target_sharding, TargetSharding):
        return _shards_by_rules(target_sharding, arrays)
    return _shards_by_jax(target_sharding, arrays)


def _shards_by_rules(target: TargetSharding, arrays: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    rules, mesh = target.rules, target.mesh
    if rules is None:
        raise ArgumentError(
            f"The mesh {_mesh_text(mesh)} comes without sharding rules: only a built-in "
            f"MaxText recipe knows its leaves' logical axes (convert --recipe FAMILY:maxtext). "
            f"Give each leaf's spec with --sharding rules.yaml (TargetSharding(mesh, rules))."
        )
    shards, matched = {}, 0
    for path, leaf in arrays.items():
        spec = rules.spec_for(path, len(leaf.shape))
        if spec is None:
            continue
        matched += 1
        if rules.logical_rules is None:  # a typo in a mesh axis is refused, not replicated
            for entry in spec:
                for axis in (entry,) if isinstance(entry, str) else entry or ():
                    if axis not in mesh:
                        raise ArgumentError(
                            f"{rules.label}: leaf {path!r} is sharded over mesh axis {axis!r}, "
                            f"which the mesh {_mesh_text(mesh)} does not have. Add it to "
                            f"the mesh (--mesh {_mesh_text(mesh)},{axis}=N) or fix the spec."
                        )
        shards[path] = shard_lengths(leaf.shape, spec, mesh, path)
    if arrays and not matched:
        some = ", ".join(repr(path) for path in list(arrays)[:3])
        raise ArgumentError(
            f"{rules.label} match none of the checkpoint's {len(arrays)} arrays (such as "
            f"{some}); patterns match whole '/' paths: start them with '.*/' to match the end."
        )
    return shards


def _shards_by_jax(shardings: Any, arrays: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    flat = shardings if _is_flat(shardings) else flatten(shardings)
    unknown = sorted(
        path for path, sharding in flat.items() if sharding is not None and path not in arrays
    )
    if unknown:
        raise ArgumentError(
            f"target_sharding names {unknown[:3]}, which are not array leaves of the tree "
            f"saved. Name leaves by their '/' paths, or pass a tree of the tree's structure."
        )
    shards = {}
    for path, sharding in flat.items():
        if sharding is None:
            continue
        if not hasattr(sharding, "shard_shape"):
            raise ArgumentError(
                f"target_sharding for leaf {path!r} is a {type(sharding).__name__}; give a "
                f"jax.sharding.Sharding (NamedSharding), or suture.TargetSharding(mesh, rules)."
            )
        shape = tuple(arrays[path].shape)
        try:
            shards[path] = tuple(sharding.shard_shape(shape))
        except ValueError as error:  # jax's IndivisibleError
            raise ArgumentError(
                f"target_sharding cannot shard leaf {path!r} of shape {shape}: {error}"
            ) from None
    return shards


def _is_flat(shardings: Any) -> bool:
    return isinstance(shardings, Mapping) and any("/" in str(key) for key in shardings)


def chunking(
    shards: Mapping[str, tuple[int, ...]], chunk_bytes: int
) -> Callable[[str, LazyArray], tuple[int, ...] | None]:
    """The `OrbaxSink` hook: the chunk of leaf `path` tiling its shard (None: the default).

    A stacked array keeps one member per chunk (its stacking axis is never sharded across
    a member, so this still tiles its shards)."""

    def chunk_of(path: str, array: LazyArray) -> tuple[int, ...] | None:
        shard = shards.get(path)
        if shard is None or len(shard) != array.ndim:
            return None
        stacked = stack_axis(array.node)
        ones = () if stacked is None else (stacked,)
        whole = [axis for axis, length in enumerate(shard) if length >= array.shape[axis]]
        return tiling_chunk(shard, np.dtype(array.dtype).itemsize, chunk_bytes, ones, whole)

    return chunk_of


def _mesh_text(mesh: Mapping[str, int]) -> str:
    return ",".join(f"{axis}={size}" for axis, size in mesh.items())
