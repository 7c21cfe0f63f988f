"""How many bytes a read of a node takes from each source, computed without reading.

Mirrors each node's `read`: a selection is pushed down the graph the same way, and sources
count the elements they would return. Plans report these figures; the writer uses them to
keep the bytes in flight under its memory budget.
"""

from __future__ import annotations

import math

from ._compute import BroadcastNode, ComputeNode
from ._nodes import (
    CastNode,
    IndexNode,
    MapNode,
    Node,
    SourceNode,
    StackNode,
    TransposeNode,
)
from ._selection import Selection, compose, full, positions, selection_shape


def estimate_reads(node: Node, selection: Selection) -> dict[int, tuple[SourceNode, int]]:
    """``{id(source): (source, bytes)}`` that reading `selection` of `node` takes."""
    reads: dict[int, tuple[SourceNode, int]] = {}
    _estimate(node, selection, reads)
    return reads


def bytes_read(node: Node, selection: Selection) -> int:
    """Total bytes that reading `selection` of `node` takes from its sources."""
    return sum(count for _, count in estimate_reads(node, selection).values())


def _estimate(node: Node, selection: Selection, reads: dict[int, tuple[SourceNode, int]]) -> None:
    """Adds to `reads` the bytes each source gives when `node` reads `selection`.

    Mirrors each node's `read`, counting selected elements instead of reading them.
    """
    if isinstance(node, SourceNode):
        count = _decoded_elements(node, selection) * node.dtype.itemsize
        previous = reads.get(id(node), (node, 0))[1]
        reads[id(node)] = (node, max(previous, count) if previous else count)
        return
    if isinstance(node, IndexNode):
        base = list(node.selection)
        for position, base_axis in enumerate(node._origin_axes):
            if base_axis is not None:
                base[base_axis] = compose(node.selection[base_axis], selection[position])
        _estimate(node.base, tuple(base), reads)
    elif isinstance(node, CastNode):
        _estimate(node.base, selection, reads)
    elif isinstance(node, TransposeNode):
        base = [None] * len(node.axes)
        for position, base_axis in enumerate(node.axes):
            base[base_axis] = selection[position]
        _estimate(node.base, tuple(base), reads)
    elif isinstance(node, StackNode):
        member_selection = selection[: node.axis] + selection[node.axis + 1 :]
        for member in sorted(set(positions(selection[node.axis]))):
            _estimate(node.members[member], member_selection, reads)
    elif isinstance(node, (ComputeNode, BroadcastNode)):
        for member, chosen in zip(node.inputs(), node.input_selections(selection), strict=True):
            _estimate(member, chosen, reads)
    elif isinstance(node, MapNode) and node.elementwise:
        for member in node.members:
            _estimate(member, selection, reads)
    else:  # concat, reshape, pad and general maps: count their inputs whole (an upper bound)
        for member in node.inputs():
            _estimate(member, full(member.shape), reads)


def _decoded_elements(source: SourceNode, selection: Selection) -> int:
    """Elements a source decodes for `selection`: whole chunks when its chunking is known."""
    chunks = getattr(source, "chunk_shape", None)
    if chunks is None:
        return math.prod(selection_shape(selection))
    total = 1
    for axis, length, chunk in zip(selection, source.shape, chunks, strict=True):
        if len(axis) == 0:
            return 0
        picked = positions(axis)
        low, high = min(picked), max(picked)
        chunk = max(1, chunk)
        span = (high // chunk + 1) * chunk - (low // chunk) * chunk
        total *= min(span, length)
    return total
