"""Blocks: how each leaf is cut for streaming, and what each block costs.

Each array leaf is cut into blocks along its first axis, each a whole number of the sink's
chunks (so no chunk is written twice). Blocks are read (only the source bytes they need),
computed and handed to the sink on a few threads. A block's cost is the bytes it produces
plus the larger of what reading it and writing it hold (one after the other); the blocks in
flight never cost more than `max_memory`. A row (a layer of a stacked array) that would cost
more than the whole budget is written in parts, a block of its own rows at a time
(`leaf_blocks`); a block that still costs more than the budget is refused before anything is
written (`check_blocks_fit`).

Running the blocks under the budget is `runner.py`; what the allocator keeps is `memory.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from .._errors import ArgumentError
from .._format import human_bytes
from .._lazy.array import LazyArray
from .._lazy.graph import Node
from .._lazy.reads import bytes_read
from .._lazy.selection import full

DEFAULT_MAX_MEMORY = 1 << 30
# A block reads its sources (large local reads bypass the page cache: no read-ahead), then
# computes and compresses: with 8 blocks running, some read while others compute. The full
# Qwen3.5 benchmark (14.4 GiB, 2 cores) took 31.5 to 33.5 s with 8 against 38.0 to 38.5 s
# with 4, 36.7 to 37.7 s with 6 and 36.4 to 39.9 s with 12, in less CPU.
WRITE_THREADS = 8
# On an object store a block's reads and writes wait on round trips more than on the CPU:
# more blocks in flight hide them, and writes arriving together share one OCDBT commit
# (the memory budget still bounds the bytes in flight).
REMOTE_WRITE_THREADS = 16
# Each of them may take a quarter of the budget (the Budget admits what fits): an eighth made
# bench/remote.py's gs -> gs conversion slower (6 runs each: median 3.40 s against 3.15 s).
REMOTE_BLOCK_SHARE = 4


class LeafWriter(Protocol):
    """What a sink offers the executor for one array leaf."""

    def block_rows(self) -> int:
        """The first-axis rows in one chunk: blocks are whole multiples of it."""

    def write(self, rows: slice, values: np.ndarray) -> None:
        """Writes `values` as rows `rows` (along the first axis) of the leaf."""

    # Optional, for writers that also take blocks along another axis (a stacking axis):
    # ``unit_along(axis) -> int | None``, the chunk length along `axis` (None: not along
    # it), and ``write_along(axis, rows, values)``, which writes `values` as the positions
    # `rows` of `axis` (every position of the other axes).

    def held_while_writing(self, nbytes: int) -> int:
        """Bytes the writer holds besides `values` while writing a block of `nbytes`."""

    # Optional: `row(index) -> LeafWriter`, the writer of one row (index along the first
    # axis) alone, whose rows are along the leaf's second axis; writers that have it let a
    # row too large for one block be written in parts (`leaf_blocks`).


@dataclass(frozen=True)
class Block:
    """Positions `rows` of axis `axis` of `array` (every position of its other axes);
    `array` is the leaf, or its row `outer` when a row is written in parts."""

    path: str
    array: LazyArray
    writer: LeafWriter
    rows: slice
    cost: int  # bytes held at the peak: reading, the block itself, writing it
    axis: int = 0
    outer: tuple[int, ...] = ()  # leading indices of the row of the leaf `rows` are within

    @property
    def index(self) -> tuple[slice, ...]:
        return (slice(None),) * self.axis + (self.rows,)

    @property
    def view(self) -> LazyArray:
        return self.array[self.index] if self.array.ndim else self.array

    @property
    def nbytes(self) -> int:
        return self.view.nbytes

    def write(self, values: np.ndarray) -> None:
        if self.axis:
            self.writer.write_along(self.axis, self.rows, values)  # type: ignore[attr-defined]
        else:
            self.writer.write(self.rows, values)


def plan_blocks(
    path: str,
    array: LazyArray,
    writer: LeafWriter,
    block_budget: int,
    max_memory: int | None = None,
) -> Iterator[Block]:
    """The blocks of one leaf: whole numbers of the writer's chunks, as many rows as fit.

    A block's cost (what it decodes from its sources, what it produces, and the working
    memory of any function that computes it) stays within `block_budget` when a single
    chunk allows. A leaf computed by a function of whole arrays (a map that is not
    elementwise) is one block: splitting it would compute the function once per block.

    Where blocks of that size would read the same source bytes more than once (a transposed
    safetensors tensor: each block of output rows is a column strip of the source, whose
    rows are read whole; an Orbax array stored as one large chunk) and `max_memory` is
    given, a stack along another axis is cut along that axis instead (a few whole members
    per block), or else the blocks grow up to `max_memory`: such a block waits until it can
    run alone, which costs less than reading the source several times over.
    """
    if array.ndim == 0 or array.shape[0] == 0 or _computes_whole(array.node):
        yield Block(path, array, writer, slice(None), _cost(array, slice(None), writer))
        return
    axis, step = 0, _rows_per_block(array, writer, 0, block_budget)
    if _one_block_over(array, writer, step, block_budget):
        # its chunks span the first axis (chunks of whole columns, as a mesh's may be)
        axis, step = _along_another_axis(array, writer, block_budget) or (axis, step)
    elif max_memory is not None and rereads(array, 0, step):
        axis, step = _without_rereads(array, writer, step, block_budget, max_memory)
    for start in range(0, array.shape[axis], step):
        rows = slice(start, min(start + step, array.shape[axis]))
        yield Block(path, array, writer, rows, _cost(array, rows, writer, axis), axis)


def _without_rereads(
    array: LazyArray, writer: LeafWriter, step: int, block_budget: int, max_memory: int
) -> tuple[int, int]:
    """``(axis, positions per block)`` for a leaf whose row blocks would re-read its sources.

    A stack along another axis (MaxText's layers on axis 1) is cut along its stacking axis,
    a few whole members per block, when the writer takes such blocks; otherwise the row
    blocks grow up to `max_memory`.
    """
    return _along_another_axis(array, writer, block_budget) or (
        0,
        max(step, _rows_per_block(array, writer, 0, max_memory)),
    )


def _along_another_axis(
    array: LazyArray, writer: LeafWriter, block_budget: int
) -> tuple[int, int] | None:
    """``(axis, positions per block)`` along the first of `_other_axes` whose blocks read
    their sources once; None if there is none."""
    for axis in _other_axes(array, writer):
        along = _rows_per_block(array, writer, axis, block_budget)
        if not rereads(array, axis, along):
            return axis, along
    return None


def _other_axes(array: LazyArray, writer: LeafWriter) -> list[int]:
    """Axes besides the first that blocks may be cut along: the stacking axis, then the
    last axis where the writer's chunks cut it (chunks of a transposed matrix's columns)."""
    unit_along = getattr(writer, "unit_along", None)
    if unit_along is None:
        return []
    axes = []
    stacked = stack_axis(array.node)
    if stacked and unit_along(stacked):
        axes.append(stacked)
    last, unit = array.ndim - 1, unit_along(array.ndim - 1)
    if last > 0 and last != stacked and unit is not None and unit < array.shape[last]:
        axes.append(last)  # (None: the writer takes no blocks along it)
    return axes


def _one_block_over(array: LazyArray, writer: LeafWriter, step: int, block_budget: int) -> bool:
    """Whether the leaf is one block along its first axis (its chunks span that axis) and
    costs more than a block may: cut along another axis, it runs beside other blocks (and
    the shares of several processes come out even)."""
    return step >= array.shape[0] and _cost(array, slice(None), writer) > block_budget


def _rows_per_block(array: LazyArray, writer: LeafWriter, axis: int, budget: int) -> int:
    """The most positions of `axis`, whole chunks of the writer, whose block costs <= `budget`."""
    unit = max(1, writer.unit_along(axis) if axis else writer.block_rows())  # type: ignore[attr-defined]
    units = -(-array.shape[axis] // unit)
    low, high = 1, units  # by bisection
    while low < high:
        middle = (low + high + 1) // 2
        if _cost(array, slice(0, middle * unit), writer, axis) <= budget:
            low = middle
        else:
            high = middle - 1
    return low * unit


def rereads(array: LazyArray, axis: int, step: int) -> bool:
    """Whether blocks of `step` positions of `axis` read more than the whole leaf at once
    (the chunk choice of `sinks.orbax` asks it too)."""
    if step >= array.shape[axis]:
        return False
    parts = (
        array[(slice(None),) * axis + (slice(start, start + step),)]
        for start in range(0, array.shape[axis], step)
    )
    # a little overlap (a shared chunk at each edge) is fine
    return _read_more_than(parts, _bytes_read(array) * 9 // 8)


def _read_more_than(parts: Iterable[LazyArray], limit: int) -> bool:
    """Whether reading `parts` one after another takes more than `limit` bytes from storage
    (stops counting as soon as it does)."""
    total = 0
    for part in parts:
        total += _bytes_read(part)
        if total > limit:
            return True
    return False


def _bytes_read(array: LazyArray) -> int:
    return bytes_read(array.node, full(array.shape))


def stack_axis(node: Node) -> int | None:
    """The stacking axis of a stacked array (seen through casts and one-input elementwise maps)."""
    return node.stack_axis


def leaf_blocks(
    path: str,
    array: LazyArray,
    writer: LeafWriter,
    block_budget: int,
    max_memory: int,
    avoid_rereads: bool = True,
) -> Iterator[Block]:
    """The blocks of one leaf (`plan_blocks`); a row too costly for the budget is cut further.

    When one row (a layer of a stacked array, a row longer than a chunk) costs more than
    `max_memory` and the writer can write a row alone (`row`), each row is planned as a
    leaf of its own, cut along its own first axis: its blocks carry the row's index in
    `Block.outer`. Rows that fit are not cut (they run with fewer blocks beside them), nor
    rows whose parts would read the source again and again (part of a transposed row
    reads whole source rows): their blocks are refused by `check_blocks_fit`.
    `avoid_rereads` lets `plan_blocks` cut along a stacking axis or grow blocks where row
    blocks would re-read the sources (not for shares of several processes: uneven).
    """
    row_writer = getattr(writer, "row", None)
    if (
        row_writer is None
        or array.ndim < 2
        or array.shape[0] == 0
        or writer.block_rows() != 1
        or _computes_whole(array.node)
        or _cost(array, slice(0, 1), writer) <= max_memory
        or not _reads_once_in_parts(array[0], row_writer(0), block_budget)
    ):
        yield from plan_blocks(
            path, array, writer, block_budget, max_memory if avoid_rereads else None
        )
        return
    for index in range(array.shape[0]):
        rows = leaf_blocks(
            path, array[index], row_writer(index), block_budget, max_memory, avoid_rereads
        )
        for block in rows:
            yield replace(block, outer=(index, *block.outer))


def _reads_once_in_parts(row: LazyArray, writer: LeafWriter, block_budget: int) -> bool:
    """Whether the blocks of `row` read at most twice what reading it whole reads."""
    parts = (block.view for block in plan_blocks("", row, writer, block_budget))
    return not _read_more_than(parts, 2 * _bytes_read(row))


def check_blocks_fit(
    blocks: list[Block], max_memory: int, cost_at: Callable[[int, set[str]], int] | None = None
) -> None:
    """Refuses, before anything is written, a block that alone costs more than `max_memory`.

    The budget the error suggests is one that fits: a larger budget also gets larger chunks
    (and so larger blocks), so with `cost_at` (``cost_at(budget, paths)``: the costliest
    block of the leaves `paths` planned under `budget`) it is raised until the blocks fit.
    """
    over = [block for block in blocks if block.cost > max_memory]
    if not over:
        return
    worst = max(over, key=lambda block: block.cost)
    needed = _whole_mib(worst.cost)
    if cost_at is not None:
        paths = {block.path for block in over}
        for _ in range(8):  # chunks stop growing at 16 MiB: a few rounds at most
            cost = cost_at(needed, paths)
            if cost <= needed:
                break
            needed = _whole_mib(cost)
    whole_map = any(getattr(n, "elementwise", True) is False for n in _walk(worst.array.node))
    python_only = "a smaller chunk_bytes= (Orbax)" + (
        "; suture.map(..., elementwise=True) if each element of the map's result depends "
        "only on the same elements of its inputs"
        if whole_map
        else ""
    )
    raise ArgumentError(
        f"Leaf {worst.path!r} cannot be written within max_memory={human_bytes(max_memory)}: "
        f"its smallest block holds {human_bytes(worst.cost)} at once (reading, computing and "
        f"writing it). Pass max_memory='{needed // (1 << 20)}MiB' or more: the smallest "
        f"budget it fits, counting the larger chunks a larger budget writes. (In Python, "
        f"also: {python_only}.)"
    )


def _whole_mib(nbytes: int) -> int:
    return -(-nbytes // (1 << 20)) << 20


def _computes_whole(node: Node) -> bool:
    return any(n.computes_whole for n in _walk(node))


def _walk(node: Node) -> Iterator[Node]:
    pending = [node]
    while pending:
        current = pending.pop()
        yield current
        pending.extend(current.inputs())


def _cost(array: LazyArray, rows: slice, writer: LeafWriter, axis: int = 0) -> int:
    """Bytes a block holds at its peak: the block itself, and the larger of what reading it
    holds (decoded chunks, strips, temporaries, map working memory) and what the writer holds.

    A block is read whole before it is written (`runner.run_blocks`), and what reading held
    is freed by then: the two never overlap. Counting both made a stack of float32 layers
    cast to bfloat16 cost 208 MiB a layer instead of 160, so that a fifth layer waited for
    the first four to be written (bench/remote.py).
    """
    view = array[(slice(None),) * axis + (rows,)] if array.ndim else array
    # maps count their working memory in `held_while_reading`, at the selection each computes
    working = sum(n.working_bytes(view.nbytes) for n in _walk(view.node))
    reading = view.node.held_while_reading(full(view.shape), into=True)
    return view.nbytes + max(reading + working, writer.held_while_writing(view.nbytes))


def write_threads(destination: Any) -> int:
    """Blocks run at once when writing to `destination` (a `Location`)."""
    return REMOTE_WRITE_THREADS if destination.is_remote else WRITE_THREADS


def block_budget(max_memory: int, threads: int = WRITE_THREADS) -> int:
    """The cost one block may have: an equal share of the budget for each thread."""
    return max(1, max_memory // threads)


def block_budget_for(destination: Any, max_memory: int) -> int:
    """`block_budget` for writing to `destination` (a `Location`)."""
    return block_budget(max_memory, REMOTE_BLOCK_SHARE if destination.is_remote else WRITE_THREADS)


def chunk_rows(shape: tuple[int, ...], itemsize: int, chunk_bytes: int) -> int:
    """Rows of the first axis per chunk so that a chunk holds at most `chunk_bytes`."""
    if not shape:
        return 1
    row_bytes = itemsize * math.prod(shape[1:])
    return int(max(1, min(shape[0], chunk_bytes // max(1, row_bytes)))) if shape[0] else 1
