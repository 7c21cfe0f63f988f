"""How many bytes a read of a node takes from each source, computed without reading.

Mirrors each node's `read`: a selection is pushed down the graph the same way, and each
source says what its read costs (`SourceNode.read_cost`): the bytes it takes from storage
(whole row spans of a safetensors tensor, whole chunks of an Orbax array, a whole
compressed npz member) and the bytes it holds while reading. Plans report the first; the
writer keeps the second, plus what each block produces, under its memory budget.
"""

from __future__ import annotations

import math

from ._compute import BroadcastNode, ComputeNode
from ._nodes import (
    CastNode,
    IndexNode,
    MapNode,
    Node,
    ReadCost,
    SourceNode,
    StackNode,
    TransposeNode,
)
from ._selection import Selection, compose, full, positions, selection_shape


def estimate_reads(node: Node, selection: Selection) -> dict[int, tuple[SourceNode, int]]:
    """``{id(source): (source, bytes from storage)}`` that reading `selection` of `node` takes."""
    return {key: (source, cost.disk) for key, (source, cost) in _costs(node, selection).items()}


def bytes_read(node: Node, selection: Selection) -> int:
    """Total bytes that reading `selection` of `node` takes from storage."""
    return sum(cost.disk for _, cost in _costs(node, selection).values())


def read_memory(node: Node, selection: Selection, into: bool = False) -> int:
    """Bytes held at most while `selection` of `node` is read, besides the result itself.

    With `into`, the result goes into the caller's array (`Node.read_into`): nodes that fill
    it in place (casts, transposes, stacks, sources) hold only a tile; the others build a
    temporary result, counted here. Without it, the array `read` returns is counted too.
    """
    selected = math.prod(selection_shape(selection)) * node.dtype.itemsize
    if isinstance(node, SourceNode):
        return node.read_cost(selection, into=into).memory
    if isinstance(node, IndexNode):
        base = list(node.selection)
        for position, base_axis in enumerate(node._origin_axes):
            if base_axis is not None:
                base[base_axis] = compose(node.selection[base_axis], selection[position])
        extra = selected if node.new_axes else 0  # np.take may copy
        return read_memory(node.base, tuple(base)) + extra
    if isinstance(node, CastNode):
        return read_memory(node.base, selection, into=True) + (0 if into else selected)
    if isinstance(node, TransposeNode):
        return read_memory(node.base, _transposed(node, selection), into=into)
    if isinstance(node, StackNode):
        member_selection = selection[: node.axis] + selection[node.axis + 1 :]
        members = {id(node.members[m]): node.members[m] for m in positions(selection[node.axis])}
        held = max(
            (read_memory(member, member_selection, into=True) for member in members.values()),
            default=0,
        )  # members are read one after another
        return held + (0 if into else selected)
    if isinstance(node, (ComputeNode, BroadcastNode)):  # its inputs, and a result of its own
        chosen = node.input_selections(selection)
        held = sum(read_memory(m, c) for m, c in zip(node.inputs(), chosen, strict=True))
        return held + selected
    if isinstance(node, MapNode) and node.elementwise:
        # the inputs, the function's result and a cast of it; working memory is the caller's
        return sum(read_memory(member, selection) for member in node.members) + 2 * selected
    # concat, reshape, pad, general maps: their inputs whole, and a result of their own
    return sum(read_memory(member, full(member.shape)) for member in node.inputs()) + selected


def _transposed(node: TransposeNode, selection: Selection) -> Selection:
    base: list = [None] * len(node.axes)
    for position, base_axis in enumerate(node.axes):
        base[base_axis] = selection[position]
    return tuple(base)


def _costs(node: Node, selection: Selection) -> dict[int, tuple[SourceNode, ReadCost]]:
    costs: dict[int, tuple[SourceNode, ReadCost]] = {}
    _estimate(node, selection, costs)
    return costs


def _estimate(
    node: Node, selection: Selection, costs: dict[int, tuple[SourceNode, ReadCost]]
) -> None:
    """Adds to `costs` what each source takes when `node` reads `selection`.

    A source read twice (the same leaf in two places) counts its larger read once.
    """
    if isinstance(node, SourceNode):
        cost = node.read_cost(selection)
        previous = costs.get(id(node), (node, ReadCost(0, 0)))[1]
        costs[id(node)] = (
            node,
            ReadCost(max(previous.disk, cost.disk), max(previous.memory, cost.memory)),
        )
        return
    if isinstance(node, IndexNode):
        base = list(node.selection)
        for position, base_axis in enumerate(node._origin_axes):
            if base_axis is not None:
                base[base_axis] = compose(node.selection[base_axis], selection[position])
        _estimate(node.base, tuple(base), costs)
    elif isinstance(node, CastNode):
        _estimate(node.base, selection, costs)
    elif isinstance(node, TransposeNode):
        _estimate(node.base, _transposed(node, selection), costs)
    elif isinstance(node, StackNode):
        member_selection = selection[: node.axis] + selection[node.axis + 1 :]
        for member in sorted(set(positions(selection[node.axis]))):
            _estimate(node.members[member], member_selection, costs)
    elif isinstance(node, (ComputeNode, BroadcastNode)):
        for member, chosen in zip(node.inputs(), node.input_selections(selection), strict=True):
            _estimate(member, chosen, costs)
    elif isinstance(node, MapNode) and node.elementwise:
        for member in node.members:
            _estimate(member, selection, costs)
    else:  # concat, reshape, pad and general maps: count their inputs whole (an upper bound)
        for member in node.inputs():
            _estimate(member, full(member.shape), costs)
