"""How many bytes a read of a node takes from each source, computed without reading.

Mirrors each node's `read`: a selection is pushed down the graph the same way, and each
source says what its read costs (`SourceNode.read_cost`): the bytes it takes from storage
(whole row spans of a safetensors tensor, whole chunks of an Orbax array, a whole
compressed npz member) and the bytes it holds while reading. Plans report the first; the
writer keeps the second, plus what each block produces, under its memory budget.
"""

from __future__ import annotations

import math

from .compute import BroadcastNode, ComputeNode
from .graph import (
    CastNode,
    IndexNode,
    MapNode,
    Node,
    ReadCost,
    ReshapeNode,
    SourceNode,
    StackNode,
    TransposeNode,
)
from .selection import Selection, full, positions, selection_shape


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
        if node.new_axes:  # built as a temporary (np.take may copy it again)
            return read_memory(node.base, node.base_selection(selection)) + selected
        return read_memory(node.base, node.base_selection(selection), into=into)
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
        # its inputs, then the function's temporaries (one per input and one more: see
        # `map_working_bytes`), its result and a cast of it, all the size of the selection;
        # counted here, at the selection the map sees: a stack of maps computes one at a time
        inputs = sum(read_memory(member, selection) for member in node.members)
        return inputs + map_working_bytes(node, selected) + 2 * selected
    if isinstance(node, ReshapeNode) and node.kept_leading_axes:
        # the kept leading axes are read selectively; the rest whole, then selected (a copy)
        return read_memory(node.base, _reshaped(node, selection)) + selected
    # concat, reshape, pad, general maps: their inputs whole, and a result of their own
    held = sum(read_memory(member, full(member.shape)) for member in node.inputs()) + selected
    if isinstance(node, MapNode):  # computed whole, whatever is selected
        held += map_working_bytes(node, math.prod(node.shape) * node.dtype.itemsize)
    return held


def map_working_bytes(node: MapNode, output_bytes: int) -> int:
    """Working memory of a map producing `output_bytes`: a temporary per input, and one more."""
    return (len(node.members) + 1) * output_bytes


def _reshaped(node: ReshapeNode, selection: Selection) -> Selection:
    """What a reshape reads of its base for `selection` (as `ReshapeNode.read` does)."""
    kept = node.kept_leading_axes
    return tuple(selection[:kept]) + full(node.base.shape[kept:])


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
        _estimate(node.base, node.base_selection(selection), costs)
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
    elif isinstance(node, ReshapeNode) and node.kept_leading_axes:
        _estimate(node.base, _reshaped(node, selection), costs)
    else:  # concat, reshape, pad and general maps: count their inputs whole (an upper bound)
        for member in node.inputs():
            _estimate(member, full(member.shape), costs)
