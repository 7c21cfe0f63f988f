"""How many bytes a read of a node takes from each source, computed without reading.

The walk follows each node's `Node.input_selections`, the same parts of its inputs that its
`read` reads, down to the sources, and each source says what its read costs
(`SourceNode.read_cost`): the bytes it takes from storage (whole row spans of a safetensors
tensor, whole chunks of an Orbax array, a whole compressed npz member) and the bytes it holds
while reading. Plans report the first; the writer keeps what nodes hold while reading
(`Node.held_while_reading`), plus what each block produces, under its memory budget.

Example:
    >>> import numpy as np
    >>> from suture._lazy.joins import ConcatNode
    >>> from suture._lazy.graph import MemorySource
    >>> a, b = MemorySource(np.ones((4, 2), np.float32)), MemorySource(np.ones((4, 2), np.float32))
    >>> bytes_read(ConcatNode([a, b], 0, a.dtype), (range(3), range(2)))  # 3 rows of `a`
    24
"""

from __future__ import annotations

from .graph import Node, SourceNode
from .selection import Selection


def estimate_reads(node: Node, selection: Selection) -> dict[int, tuple[SourceNode, int]]:
    """``{id(source): (source, bytes from storage)}`` that reading `selection` of `node` takes."""
    reads: dict[int, tuple[SourceNode, int]] = {}
    _estimate(node, selection, reads)
    return reads


def bytes_read(node: Node, selection: Selection) -> int:
    """Total bytes that reading `selection` of `node` takes from storage."""
    return sum(disk for _, disk in estimate_reads(node, selection).values())


def _estimate(node: Node, selection: Selection, reads: dict[int, tuple[SourceNode, int]]) -> None:
    """Adds to `reads` the bytes each source's reads take when `node` reads `selection`.

    Every read of a source counts, as the read reads it: different parts of one source
    (each expert of a fused tensor, stacked on its own; parts that share an Orbax chunk
    each read it) add up, and so does the same part read twice (one source in two places
    of a leaf: ``concatenate([a, a])`` reads `a` twice).
    """
    if isinstance(node, SourceNode):
        # as the streamed reads read (into their block): a run of each row, not the row
        disk = node.read_cost(selection, into=True).disk
        reads[id(node)] = (node, reads.get(id(node), (node, 0))[1] + disk)
        return
    for member, part in node.input_selections(selection):
        _estimate(member, part, reads)
