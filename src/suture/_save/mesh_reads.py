"""What each process of a load onto a mesh reads from storage, against what its shards hold.

TensorStore reads whole chunks: a process whose shards cut through a checkpoint's chunks
reads the parts of them that other processes' shards hold too. `mesh_reads` works that out
for a lazy tree (a checkpoint, or a recipe's result) on a `TargetSharding`, reading nothing:
each device's shard of each array (jax's split: ``ceil(length / ways)``, the device's place
in the mesh's row-major order along the axes that split it), the distinct shards of each
process (a shard two of its devices hold is read once), and for each shard the bytes its
read takes from every source (`suture._lazy.reads`: whole chunks of an Orbax array, whole
row spans of a safetensors tensor, through whatever the recipe does to them).

Processes hold contiguous blocks of the mesh's devices in its row-major order (process ``p``
of ``n`` the ``p``-th ``1/n``), as ``jax.make_mesh`` lays out the devices of CPU hosts. Where a
process's shards make one box, its reads are the chunks that box touches, each once: the
least any restore reads (TensorStore may fetch a chunk that several of its shards share
more than once when their reads run at once); else the sum of its shards' reads.

Example:
    >>> import numpy as np, suture
    >>> tree = suture.open({"w": np.zeros((8, 4), np.float32)}).tree
    >>> reads = mesh_reads(tree, TargetSharding("fsdp=4", {"w": ["fsdp"]}), processes=2)
    >>> [(p.devices, p.needed, p.read) for p in reads]
    [((0, 1), 64, 64), ((2, 3), 64, 64)]
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._errors import ArgumentError
from .._lazy.array import LazyArray
from .._lazy.reads import estimate_reads
from .._paths import flatten
from .._sharding import Entry, shard_lengths
from .mesh import TargetSharding, shards_of


@dataclass
class ProcessReads:
    """One process's load: its devices, the bytes of its distinct shards (`needed`), the
    bytes its reads take from storage (`read`), and both per array."""

    process: int
    devices: tuple[int, ...]
    needed: int = 0
    read: int = 0
    arrays: dict[str, tuple[int, int]] = field(default_factory=dict)  # path: (needed, read)

    @property
    def ratio(self) -> float:
        return self.read / self.needed if self.needed else 1.0


def device_shard(
    shape: Sequence[int], spec: Sequence[Entry], mesh: Mapping[str, int], device: int
) -> tuple[range, ...]:
    """The shard (a range per axis) of device number `device` (row-major over the mesh).

    Example:
        >>> device_shard((10, 4), ("fsdp", None), {"fsdp": 4}, 3)
        (range(9, 10), range(0, 4))
    """
    place = dict(zip(mesh, np.unravel_index(device, tuple(mesh.values())), strict=True))
    lengths = shard_lengths(shape, spec, mesh)
    shard = []
    entries = tuple(spec) + (None,) * (len(shape) - len(spec))
    for length, entry, step in zip(shape, entries, lengths, strict=True):
        axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        index = 0
        for axis in axes:  # major first, as jax splits an axis over several mesh axes
            index = index * mesh.get(axis, 1) + int(place.get(axis, 0))
        shard.append(range(min(index * step, length), min((index + 1) * step, length)))
    return tuple(shard)


def mesh_reads(tree: Any, target: TargetSharding, processes: int = 1) -> list[ProcessReads]:
    """Each process's reads of `tree`'s arrays loaded onto `target` (see the module)."""
    devices = math.prod(target.mesh.values())
    if processes < 1 or devices % processes:
        raise ArgumentError(
            f"{processes} processes cannot share the {devices} devices of the mesh "
            f"{_mesh_text(target.mesh)} evenly; give a divisor of {devices} (--processes)."
        )
    arrays = {
        path: leaf
        for path, leaf in flatten(tree).items()
        if isinstance(leaf, LazyArray) and leaf.ndim
    }
    shards_of(target, arrays)  # the rules checked as a save for the mesh checks them
    per = devices // processes
    found = [ProcessReads(p, tuple(range(p * per, (p + 1) * per))) for p in range(processes)]
    for path, array in arrays.items():
        spec = target.rules.spec_for(path, array.ndim) if target.rules else None
        spec = spec or (None,) * array.ndim
        _refuse_uneven(path, array.shape, spec, target.mesh)
        itemsize = np.dtype(array.dtype).itemsize
        for process in found:
            shards = {device_shard(array.shape, spec, target.mesh, d) for d in process.devices}
            needed = sum(math.prod(len(r) for r in shard) for shard in shards) * itemsize
            box = tuple(
                range(min(s[axis].start for s in shards), max(s[axis].stop for s in shards))
                for axis in range(array.ndim)
            )
            if math.prod(len(r) for r in box) * itemsize == needed:  # the shards tile a box
                shards = {box}  # read at once: a chunk two shards share is read once
            read = sum(
                disk for shard in shards for _, disk in estimate_reads(array.node, shard).values()
            )
            process.arrays[path] = (needed, read)
            process.needed += needed
            process.read += read
    return found


def _refuse_uneven(
    path: str, shape: Sequence[int], spec: Sequence[Entry], mesh: Mapping[str, int]
) -> None:
    """Refuses a split that does not divide its axis: jax loads no array sharded so."""
    for axis, (length, entry) in enumerate(zip(shape, spec, strict=False)):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        ways = math.prod(mesh.get(name, 1) for name in names)
        if length % ways:
            raise ArgumentError(
                f"Leaf {path!r}: axis {axis} has length {length}, split {ways} ways by "
                f"{'x'.join(names)} of the mesh {_mesh_text(mesh)}; jax loads an array only "
                f"where each split divides its axis. Give that axis another spec in the "
                f"sharding rules (or null), or a mesh whose sizes divide {length}."
            )


def render_mesh_reads(reads: list[ProcessReads], target: TargetSharding, worst: int = 5) -> str:
    """The per-process table, and the arrays read with the most bytes to spare."""
    from .._format import format_table, human_bytes

    rows = [["process", "devices", "needs", "reads", "reads/needs"]]
    for process in reads:
        first, last = process.devices[0], process.devices[-1]
        rows.append(
            [
                str(process.process),
                f"{first}-{last}" if last != first else str(first),
                human_bytes(process.needed),
                human_bytes(process.read),
                f"{process.ratio:.2f}x",
            ]
        )
    lines = [
        f"Loading onto the mesh {_mesh_text(target.mesh)} in {len(reads)} process(es), "
        f"each reads whole chunks of the stored arrays:",
        *format_table(rows, rule_under_header=True),
    ]
    spare: dict[str, tuple[int, int]] = {}
    for process in reads:
        for path, (needed, read) in process.arrays.items():
            total = spare.get(path, (0, 0))
            spare[path] = (total[0] + needed, total[1] + read)
    worse = sorted(
        ((read - needed, path, needed, read) for path, (needed, read) in spare.items()),
        reverse=True,
    )
    worse = [row for row in worse if row[0] > 0][:worst]
    if worse:
        lines.append("Arrays read beyond their shards (chunks crossing shard edges):")
        lines += [
            f"  {path}: reads {human_bytes(read)} for {human_bytes(needed)} ({read / needed:.2f}x)"
            for _, path, needed, read in worse
        ]
        lines.append(
            "  `suture reshard SRC OUT --mesh ... --sharding ...` rewrites the checkpoint "
            "with chunks that tile these shards."
        )
    else:
        lines.append("Every chunk read lies inside a shard of the process reading it.")
    return "\n".join(lines)


def with_mesh_reads(plan_json: str, reads: list[ProcessReads] | None) -> str:
    """A plan's JSON with ``"mesh_reads"``: per process, its devices and bytes needed and read,
    in all and per array."""
    if reads is None:
        return plan_json
    data = json.loads(plan_json)
    data["mesh_reads"] = [
        {
            "process": p.process,
            "devices": list(p.devices),
            "needed_bytes": p.needed,
            "read_bytes": p.read,
            "arrays": {
                path: {"needed_bytes": needed, "read_bytes": read}
                for path, (needed, read) in p.arrays.items()
            },
        }
        for p in reads
    ]
    return json.dumps(data, indent=2)


def _mesh_text(mesh: Mapping[str, int]) -> str:
    return ",".join(f"{axis}={size}" for axis, size in mesh.items())
