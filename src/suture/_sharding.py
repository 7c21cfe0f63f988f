"""Target meshes and sharding rules: which shard of a mesh each array's element lands in.

A save for a mesh (``suture.save(..., target_sharding=...)``, ``suture convert --mesh
fsdp=8,tensor=2 --sharding rules.yaml``) writes each array in chunks that tile its shards on
that mesh, so that every host restoring it reads only chunks inside its own shards. This
module is the arithmetic, with no array in sight: a mesh (``{"fsdp": 8, "tensor": 2}``),
the rules naming each leaf's `PartitionSpec`, the length of a shard along each axis, and a
chunk that tiles it.

Rules are a small YAML or JSON table of leaf patterns (regular expressions matched against
the whole '/' path, first match wins) to partition specs, as MaxText writes them:

```yaml
leaves:
  ".*/embedding": [tensor, fsdp]
  ".*/mlp/wi_0/kernel": [fsdp, null, tensor]
  ".*/(query|key|value)/kernel": [fsdp, null, [tensor, expert]]
```

With ``logical_axis_rules`` (MaxText's, as in its ``base.yml``) the leaves name logical
axes, turned into mesh axes as Flax's ``logical_to_mesh_axes`` does (rules in order of
precedence; a mesh axis is used once per array); mesh axes the rules name that the mesh
lacks have size 1, as in a MaxText mesh where their parallelism is 1:

```yaml
logical_axis_rules: [[embed, [fsdp, sequence]], [mlp, tensor], [layers, stage]]
leaves:
  ".*/mlp/wi_0/kernel": [embed, layers, mlp]
```

A leaf no pattern matches is replicated (its chunks are the default ones).

Example:
    >>> parse_mesh("fsdp=8,tensor=2")
    {'fsdp': 8, 'tensor': 2}
    >>> rules = ShardingRules.from_data({"leaves": {"w": ["fsdp", None]}})
    >>> rules.spec_for("w", 2)
    ('fsdp', None)
    >>> shard_lengths((1024, 10), ("fsdp", None), {"fsdp": 8})
    (128, 10)
    >>> tiling_chunk((128, 10), 4, 1024)
    (16, 10)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._errors import ArgumentError
from ._json import loads as loads_json
from ._patterns import compile_pattern, fullmatch
from ._yaml import parse

# One axis of a partition spec: unsharded (None), one mesh axis, or several (major first).
Entry = str | tuple[str, ...] | None


def parse_mesh(text: str | Mapping[str, int]) -> dict[str, int]:
    """``"fsdp=8,tensor=2"`` (or a mapping) as ``{"fsdp": 8, "tensor": 2}``, checked."""
    if isinstance(text, Mapping):
        pairs = [(str(name), size) for name, size in text.items()]
    else:
        pairs = []
        for part in (piece.strip() for piece in str(text).split(",")):
            name, equals, size = part.partition("=")
            if not equals or not name.strip() or not size.strip().isdigit():
                raise ArgumentError(
                    f"Mesh {text!r}: {part!r} is not NAME=SIZE. Write the mesh as its axes "
                    f"and sizes, e.g. --mesh fsdp=8,tensor=2."
                )
            pairs.append((name.strip(), int(size)))
    mesh: dict[str, int] = {}
    for name, size in pairs:
        if name in mesh:
            raise ArgumentError(f"Mesh {text!r} names axis {name!r} twice; name each axis once.")
        if not isinstance(size, int) or size < 1:
            raise ArgumentError(
                f"Mesh {text!r}: axis {name!r} has size {size!r}; sizes are whole numbers >= 1."
            )
        mesh[name] = size
    if not mesh:
        raise ArgumentError("The mesh is empty; name its axes and sizes: fsdp=8,tensor=2.")
    return mesh


@dataclass(frozen=True)
class ShardingRules:
    """Leaf patterns -> partition specs (mesh axes, or logical axes with `logical_rules`)."""

    leaves: tuple[tuple[str, tuple[Any, ...]], ...]
    logical_rules: tuple[tuple[str, Entry], ...] | None = None
    label: str = "The sharding rules"

    @classmethod
    def load(cls, path: str | Path) -> ShardingRules:
        """The rules of a YAML or JSON file."""
        label = f"Sharding rules {str(path)!r}"
        try:
            text = Path(path).read_text()
        except OSError as error:
            raise ArgumentError(
                f"{label} cannot be read ({error.strerror or error}); give a YAML or JSON file."
            ) from None
        if str(path).endswith(".json"):
            try:
                data = loads_json(text)
            except ValueError as error:
                raise ArgumentError(f"{label} is not valid JSON: {error}.") from None
        else:
            data, _ = parse(text, label, "a sharding table", ArgumentError)
        return cls.from_data(data, label)

    @classmethod
    def from_data(cls, data: Any, label: str = "The sharding rules") -> ShardingRules:
        """Rules from parsed data: ``{"leaves": {pattern: spec}, "logical_axis_rules": ...}``,
        or a plain ``{pattern: spec}`` mapping (specs may be `PartitionSpec`s)."""
        if isinstance(data, Mapping) and "leaves" not in data and "logical_axis_rules" not in data:
            data = {"leaves": data}
        if not isinstance(data, Mapping) or not isinstance(data.get("leaves"), Mapping):
            raise ArgumentError(
                f"{label} has no 'leaves' table. Write 'leaves:' mapping leaf patterns to "
                f"partition specs ('.*/kernel': [fsdp, tensor]), and optionally "
                f"'logical_axis_rules:' as MaxText's config has them."
            )
        unknown = sorted(set(data) - {"leaves", "logical_axis_rules"})
        if unknown:
            raise ArgumentError(
                f"{label} has unknown keys {unknown}; it takes 'leaves' and 'logical_axis_rules'."
            )
        leaves = []
        for pattern, spec in data["leaves"].items():
            compile_pattern(str(pattern), f"{label}, pattern {pattern!r}")
            leaves.append((str(pattern), _spec_entries(spec, f"{label}, leaf {pattern!r}")))
        logical = None
        if data.get("logical_axis_rules") is not None:
            logical = _logical_rules(data["logical_axis_rules"], label)
        return cls(tuple(leaves), logical, label)

    def spec_for(self, path: str, ndim: int) -> tuple[Entry, ...] | None:
        """The mesh-axis spec of leaf `path` (`ndim` axes), or None if no pattern matches."""
        for pattern, spec in self.leaves:
            if fullmatch(compile_pattern(pattern, self.label), path):
                if len(spec) > ndim:
                    raise ArgumentError(
                        f"{self.label}: leaf {path!r} has {ndim} axes, but pattern {pattern!r} "
                        f"gives it the spec {list(spec)} of {len(spec)}. Give one entry per "
                        f"axis (null for an unsharded one), or a pattern that leaves it out."
                    )
                entries = spec + (None,) * (ndim - len(spec))
                if self.logical_rules is not None:
                    return logical_to_mesh_axes(entries, self.logical_rules, path, self.label)
                return tuple(_entry(value, path, self.label) for value in entries)
        return None


def logical_to_mesh_axes(
    names: Sequence[Any], rules: Sequence[tuple[str, Entry]], path: str = "", label: str = ""
) -> tuple[Entry, ...]:
    """Flax's ``logical_to_mesh_axes``: each rule (in order) gives its logical axis, if the
    array has it and it is still unassigned, its mesh axes, if none of them is used yet.

    Example:
        >>> logical_to_mesh_axes(("embed", "mlp"), [("mlp", "tensor"), ("embed", "tensor")])
        (None, 'tensor')
    """
    named = [name for name in names if isinstance(name, str)]
    if len(set(named)) != len(named):
        raise ArgumentError(
            f"{label}: leaf {path!r} names a logical axis twice ({list(names)}); each axis of an "
            f"array has its own logical name."
        )
    unassigned = object()
    result: list[Any] = [unassigned if isinstance(name, str) else None for name in names]
    for logical, mesh_axes in rules:
        if logical not in named:
            continue
        position = list(names).index(logical)
        wanted = set(_axes_of(mesh_axes))
        used = {axis for entry in result if entry is not unassigned for axis in _axes_of(entry)}
        if result[position] is unassigned and not wanted & used:
            result[position] = mesh_axes
    return tuple(None if entry is unassigned else entry for entry in result)


def shard_lengths(
    shape: Sequence[int], spec: Sequence[Entry], mesh: Mapping[str, int], path: str = ""
) -> tuple[int, ...]:
    """The length of a shard along each axis: ``ceil(length / ways)``, where ``ways`` is the
    product of the sizes of the mesh axes the axis is split over (jax's split; the last
    shard is short where the length does not divide)."""
    used: set[str] = set()
    lengths = []
    for length, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True):
        ways = 1
        for axis in _axes_of(entry):
            if axis in used:
                raise ArgumentError(
                    f"Leaf {path!r}: mesh axis {axis!r} shards two of its axes (spec "
                    f"{list(spec)}); a mesh axis splits one array axis at most."
                )
            used.add(axis)
            ways *= mesh.get(axis, 1)
        lengths.append(max(1, -(-length // ways)) if length else 1)
    return tuple(lengths)


def tiling_chunk(
    shard: Sequence[int],
    itemsize: int,
    chunk_bytes: int,
    ones: Sequence[int] = (),
    unsharded: Sequence[int] = (),
) -> tuple[int, ...]:
    """The largest chunk that tiles `shard` (each length a divisor of the shard's) within
    `chunk_bytes`: whole trailing axes while they fit, the largest divisor that fits along
    the next axis, 1 along the axes before it. Axes in `ones` (a stacking axis) get 1.
    Along an axis in `unsharded` (the shard is the whole axis) any length tiles it: a
    divisor if one is at least half what fits, else what fits (a short last chunk).

    Example:
        >>> tiling_chunk((6, 1000), 4, 8000), tiling_chunk((7, 1000), 4, 8000)
        ((2, 1000), (1, 1000))
        >>> tiling_chunk((1, 7001), 4, 8000, unsharded=(1,))
        (1, 2000)
    """
    shard = [max(1, length) for length in shard]
    for axis in ones:
        shard[axis] = 1
    chunk = [1] * len(shard)
    inner = itemsize
    for axis in reversed(range(len(shard))):
        if inner * shard[axis] > chunk_bytes:
            most = max(1, chunk_bytes // inner)
            divisor = largest_divisor(shard[axis], most)
            free = axis in unsharded and 2 * divisor < most
            chunk[axis] = most if free else divisor
            break
        chunk[axis] = shard[axis]
        inner *= shard[axis]
    return tuple(chunk)


def largest_divisor(length: int, most: int) -> int:
    """The largest divisor of `length` that is at most `most` (1 at least).

    Example:
        >>> largest_divisor(12, 5), largest_divisor(13, 5)
        (4, 1)
    """
    best = 1
    for small in range(1, math.isqrt(length) + 1):
        if length % small == 0:
            large = length // small
            if large <= most:
                return max(best, large)
            if small <= most:
                best = small
    return best


def _axes_of(entry: Any) -> tuple[str, ...]:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    return tuple(axis for axis in entry if axis is not None)


def _spec_entries(spec: Any, label: str) -> tuple[Any, ...]:
    """A spec as a tuple: a list (YAML, JSON) or a `PartitionSpec` (a tuple)."""
    if spec is None:
        return ()
    if isinstance(spec, str) or not isinstance(spec, Sequence):
        raise ArgumentError(
            f"{label}: the spec {spec!r} is not a list. Give one entry per axis: a mesh axis, "
            f"a list of them, or null (e.g. [fsdp, null]); [] replicates the leaf."
        )
    return tuple(spec)


def _entry(value: Any, path: str, label: str) -> Entry:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Sequence) and all(isinstance(axis, str) for axis in value):
        return tuple(value) if len(value) != 1 else value[0]
    raise ArgumentError(
        f"{label}: leaf {path!r} has the spec entry {value!r}; an entry is a mesh axis, a list "
        f"of mesh axes, or null."
    )


def _logical_rules(rules: Any, label: str) -> tuple[tuple[str, Entry], ...]:
    if isinstance(rules, Mapping):
        items: list[Any] = list(rules.items())
    elif isinstance(rules, Sequence) and not isinstance(rules, str):
        items = list(rules)
    else:
        items = [rules]
    pairs = []
    for item in items:
        if (
            isinstance(item, str)
            or not isinstance(item, Sequence)
            or len(item) != 2
            or not isinstance(item[0], str)
        ):
            raise ArgumentError(
                f"{label}: logical_axis_rules has {item!r}; each rule is [logical axis, mesh "
                f"axes], as MaxText writes them: [embed, [fsdp, sequence]]."
            )
        pairs.append((item[0], _entry(item[1], item[0], label)))
    return tuple(pairs)


@dataclass(frozen=True)
class ShardReads:
    """What the devices restoring one array on a mesh read (whole chunks, as TensorStore
    reads them) against what they need (their shards), in bytes: the most any one device
    reads and needs, and the sums over the array's distinct shards."""

    most_read: int
    most_needed: int
    total_read: int
    total_needed: int


def shard_reads(
    shape: Sequence[int], itemsize: int, chunk: Sequence[int], shard: Sequence[int]
) -> ShardReads:
    """The bytes of chunks each shard of `shape` (shards of `shard`, the last one short where
    the length does not divide) touches, against the shard's own bytes.

    Example:
        >>> shard_reads((8, 4), 1, (3, 4), (2, 4))  # 2-row shards over 3-row chunks
        ShardReads(most_read=24, most_needed=8, total_read=56, total_needed=32)
    """
    most_read = most_needed = total_read = total_needed = itemsize
    for length, chunk_length, shard_length in zip(shape, chunk, shard, strict=True):
        reads, needs = [], []
        for start in range(0, max(length, 1), max(shard_length, 1)):
            end = min(start + shard_length, length)
            first = start // chunk_length * chunk_length
            last = min(-(-end // chunk_length) * chunk_length, length)
            reads.append(last - first)
            needs.append(end - start)
        most_read *= max(reads)
        most_needed *= max(needs)
        total_read *= sum(reads)
        total_needed *= sum(needs)
    return ShardReads(most_read, most_needed, total_read, total_needed)
