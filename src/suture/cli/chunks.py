"""``suture inspect --chunks``: each array's chunk grid, and with ``--mesh``/``--sharding``
what a restore on that mesh reads against what it needs.

TensorStore reads whole chunks: a device whose shard cuts through chunks reads the parts of
them that other devices' shards hold too. The table says, per array, the most any one
device reads and needs; the last line sums them (a device reading the most of every array).

Example:
    >>> import numpy as np, suture
    >>> ckpt = suture.open({"w": np.zeros((8, 4), np.float32)})
    >>> print(render_chunks(ckpt))
    path  shape   chunk  grid  chunk bytes
    ----  ------  -----  ----  -----------
    w     (8, 4)  -      -     -
"""

from __future__ import annotations

import math

import numpy as np

from .._format import format_table, human_bytes
from .._lazy.array import LazyArray
from .._patterns import compile_pattern
from .._patterns import search as bounded_search
from .._save.mesh import TargetSharding, shards_of
from .._sharding import shard_reads
from ..sources.checkpoint import Checkpoint


def render_chunks(
    ckpt: Checkpoint, pattern: str | None = None, target: TargetSharding | None = None
) -> str:
    """The chunk table of `ckpt`'s arrays whose path matches `pattern` (``re.search``)."""
    matcher = compile_pattern(pattern, "--filter") if pattern is not None else None
    arrays = {
        path: leaf
        for path, leaf in ckpt.flat().items()
        if isinstance(leaf, LazyArray) and (matcher is None or bounded_search(matcher, path))
    }
    shards = shards_of(target, arrays) if target is not None else {}
    header = ["path", "shape", "chunk", "grid", "chunk bytes"]
    if target is not None:
        header += ["shard", "reads/device", "needs/device"]
    rows = [header]
    read_total = need_total = 0
    for path, leaf in arrays.items():
        chunk = _chunk_of(leaf)
        itemsize = np.dtype(leaf.dtype).itemsize
        row = [path, str(tuple(leaf.shape))]
        if chunk is None:
            row += ["-", "-", "-"]
        else:
            grid = tuple(-(-length // size) for length, size in zip(leaf.shape, chunk, strict=True))
            row += [str(chunk), str(grid), human_bytes(math.prod(chunk) * itemsize)]
        if target is not None:
            shard = shards.get(path, tuple(leaf.shape))
            reads = shard_reads(leaf.shape, itemsize, chunk or tuple(leaf.shape), shard)
            read_total += reads.most_read
            need_total += reads.most_needed
            row += [str(shard), human_bytes(reads.most_read), human_bytes(reads.most_needed)]
        rows.append(row)
    lines = format_table(rows, rule_under_header=True)
    if target is not None:
        mesh = ",".join(f"{axis}={size}" for axis, size in target.mesh.items())
        ratio = read_total / need_total if need_total else 1.0
        lines.append(
            f"On the mesh {mesh}, the device reading most reads {human_bytes(read_total)} for "
            f"the {human_bytes(need_total)} of its shards ({ratio:.2f}x)."
        )
    return "\n".join(lines)


def _chunk_of(leaf: LazyArray) -> tuple[int, ...] | None:
    """The stored chunk of an array read as it is stored (None: not chunked, or not known)."""
    chunk = getattr(leaf.node, "chunk_shape", None)
    if chunk is None or len(chunk) != leaf.ndim or not leaf.ndim:
        return None
    return tuple(int(length) for length in chunk)
