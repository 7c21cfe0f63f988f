"""The computation graph behind LazyArray: the node interface, sources, and the walk.

Every node knows its shape and dtype without reading, and answers
``read(selection) -> np.ndarray`` (see `selection`) with an array of exactly the selected
elements. Operations push the selection down to their inputs, so a view reads only the
elements it shows: ``stack(xs)[3]`` reads ``xs[3]``; ``x.T[0]`` reads one column of ``x``;
a TensorStore source reads only the chunks that the selection touches.

Each node type says, in one place, what a read of a selection needs: `input_selections`
(which parts of which inputs; `read` and the estimates in `reads` both follow it),
`held_while_reading` (its memory) and `describe` (its line in a plan). The node types:
views of one input (`views.py`), joins of several (`joins.py`), computed nodes
(`compute.py`), and the sources of each format (`suture.sources`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, NamedTuple

import numpy as np

from .._buffers import assign
from .selection import (
    Selection,
    full,
    outer_index,
    selection_shape,
)


class Node(ABC):
    """One array in the graph: a source, or an operation on other nodes."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @abstractmethod
    def read(self, selection: Selection) -> np.ndarray:
        """The selected elements, as an array of shape ``selection_shape(selection)``."""

    @abstractmethod
    def inputs(self) -> tuple[Node, ...]:
        """The nodes this node reads from (empty for sources)."""

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        """``(input, selection of it)`` for each part of an input that reading `selection`
        needs; inputs the selection does not touch are left out.

        By default every input whole (sources: nothing).

        Example:
            >>> from suture._lazy.joins import ConcatNode
            >>> a, b = MemorySource(np.zeros((4, 2))), MemorySource(np.ones((4, 2)))
            >>> joined = ConcatNode([a, b], 0, a.dtype)  # shape (8, 2)
            >>> [(m is b, part) for m, part in joined.input_selections((range(5, 7), range(2)))]
            [(True, (range(1, 3), range(0, 2)))]
        """
        return [(member, full(member.shape)) for member in self.inputs()]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        """Bytes held at most while `selection` is read, besides the result itself.

        With `into`, the result goes into the caller's array (`read_into`): nodes that fill
        it in place hold only a tile; the others build a temporary result, counted here.
        Without it, the array `read` returns is counted too. By default: the inputs as
        `input_selections` reads them, and a result of its own.

        Example:
            >>> from suture._lazy.views import CastNode
            >>> x = MemorySource(np.zeros((4, 2), np.float32))
            >>> CastNode(x, np.dtype("float64")).held_while_reading((range(1), range(2)))
            24
        """
        held = sum(
            member.held_while_reading(part) for member, part in self.input_selections(selection)
        )
        return held + selected_bytes(self, selection)

    def describe(self) -> str:
        """How the node appears among a plan's operations (``"cast bfloat16"``)."""
        return type(self).__name__

    @property
    def computes_whole(self) -> bool:
        """Whether any read computes the node's whole result (so blocks of it would
        compute it once per block)."""
        return False

    @property
    def stack_axis(self) -> int | None:
        """The axis along which this array is a stack of members read one at a time (seen
        through casts and one-input elementwise maps), or None."""
        return None

    def working_bytes(self, output_bytes: int) -> int:
        """Working memory of a block of `output_bytes` of the result that
        `held_while_reading` does not count (a function's temporaries)."""
        return 0

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        """Writes the selected elements into `out` (their shape; cast to ``out.dtype``).

        `out` may be a strided view (a transposed or stacked part of a larger result).
        Nodes that can fill it without a full-size temporary override this.
        """
        assign(out, self.read(selection))


def selected_bytes(node: Node, selection: Selection) -> int:
    return math.prod(selection_shape(selection)) * node.dtype.itemsize


class ReadCost(NamedTuple):
    """What one source read takes: bytes from storage, and bytes held at its peak."""

    disk: int
    memory: int


class SourceNode(Node):
    """A stored array; `path` names it in its checkpoint and `origin` names the checkpoint.

    `folder`: the checkpoint folder it was opened from (a Hugging Face folder, an Orbax
    checkpoint), if any; a save into that folder would join the source.
    """

    path: str | None
    origin: str | None
    folder: str | None = None
    # Whether a read waits on round trips to a remote store (a bucket, an HTTP server): such
    # reads are worth overlapping (`joins.StackNode` reads its members at once).
    remote: bool = False

    def start_opening(self) -> None:
        """Starts opening the stored array without waiting (`open_all`); most sources have
        nothing to open."""

    def finish_opening(self) -> None:
        """Waits for what `start_opening` began."""

    def read_cost(self, selection: Selection, into: bool = False) -> ReadCost:
        """Bytes a read of `selection` takes from storage, and holds (see `Node.held_while_reading`).

        By default: the selected elements, read into a temporary result.
        """
        selected = selected_bytes(self, selection)
        return ReadCost(selected, selected)

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        return self.read_cost(selection, into=into).memory


def open_all(sources: list[SourceNode]) -> None:
    """Opens every source at once before any data is read.

    Opening reads metadata (small, scattered reads); doing it all up front, concurrently,
    keeps those reads from interleaving with large data reads on a cold disk.
    """
    for source in sources:
        source.start_opening()
    for source in sources:
        source.finish_opening()


class MemorySource(SourceNode):
    """An array already in memory (numpy, jax, or anything ``np.asarray`` accepts)."""

    def __init__(self, array: Any, path: str | None = None, origin: str | None = None) -> None:
        self.array = array
        self.shape = tuple(int(length) for length in array.shape)
        self.dtype = np.dtype(array.dtype)
        self.path, self.origin = path, origin

    def read(self, selection: Selection) -> np.ndarray:
        return np.array(outer_index(np.asarray(self.array), selection), copy=True)

    def inputs(self) -> tuple[Node, ...]:
        return ()


def source_nodes(node: Node) -> list[SourceNode]:
    """The distinct source nodes that `node` reads from, in first-use order."""
    found: dict[int, SourceNode] = {}
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, SourceNode):
            found.setdefault(id(current), current)
        pending.extend(reversed(current.inputs()))
    return list(found.values())
