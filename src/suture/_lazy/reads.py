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

from .graph import Node, ReadCost, SourceNode
from .selection import Selection


def estimate_reads(node: Node, selection: Selection) -> dict[int, tuple[SourceNode, int]]:
    """``{id(source): (source, bytes from storage)}`` that reading `selection` of `node` takes."""
    return {key: (source, cost.disk) for key, (source, cost) in _costs(node, selection).items()}


def bytes_read(node: Node, selection: Selection) -> int:
    """Total bytes that reading `selection` of `node` takes from storage."""
    return sum(cost.disk for _, cost in _costs(node, selection).values())


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
    for member, part in node.input_selections(selection):
        _estimate(member, part, costs)
