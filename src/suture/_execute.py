"""Streaming execution: read, compute and write leaves block by block under a memory budget.

Each array leaf is cut into blocks along its first axis, each a whole number of the sink's
chunks (so no chunk is written twice). Blocks are read (only the source bytes they need),
computed and handed to the sink on a few threads. A block's cost is the bytes it reads
plus the bytes it produces; the blocks in flight never cost more than `max_memory`. A row
(a layer of a stacked array) that would cost more than the whole budget is written in
parts, a block of its own rows at a time (`leaf_blocks`); a block that still costs more
than the budget is refused before anything is written (`check_blocks_fit`).

The process's growth is the blocks in flight plus what the allocator keeps after `free`:
glibc is limited to one malloc arena (`limit_malloc_arenas`), so memory freed by one thread
is re-used by the next, and trimmed when the process nears its budget.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from ._compute import ComputeNode
from ._errors import SurgeryError
from ._format import human_bytes
from ._lazy import LazyArray
from ._nodes import CastNode, MapNode, Node, StackNode, aligned_empty
from ._reads import bytes_read, read_memory
from ._selection import full

DEFAULT_MAX_MEMORY = 1 << 30
WRITE_THREADS = 4


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
    if array.ndim == 0 or array.shape[0] == 0 or _computes_whole(array._node):
        yield Block(path, array, writer, slice(None), _cost(array, slice(None), writer))
        return
    axis, step = 0, _rows_per_block(array, writer, 0, block_budget)
    if max_memory is not None and _rereads(array, 0, step):
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
    axis = stack_axis(array._node)
    unit_along = getattr(writer, "unit_along", None)
    if axis and unit_along is not None and unit_along(axis):
        along = _rows_per_block(array, writer, axis, block_budget)
        if not _rereads(array, axis, along):
            return axis, along
    return 0, max(step, _rows_per_block(array, writer, 0, max_memory))


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


def _rereads(array: LazyArray, axis: int, step: int) -> bool:
    """Whether blocks of `step` positions of `axis` read more than the whole leaf at once."""
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
    return bytes_read(array._node, full(array.shape))


def stack_axis(node: Node) -> int | None:
    """The stacking axis of a stacked array (seen through casts and one-input elementwise maps)."""
    while isinstance(node, (CastNode, MapNode)):
        if isinstance(node, MapNode) and (not node.elementwise or len(node.members) != 1):
            return None
        node = node.inputs()[0]
    return node.axis if isinstance(node, StackNode) else None


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
        or _computes_whole(array._node)
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


def check_blocks_fit(blocks: list[Block], max_memory: int) -> None:
    """Refuses, before anything is written, a block that alone costs more than `max_memory`."""
    over = [block for block in blocks if block.cost > max_memory]
    if not over:
        return
    worst = max(over, key=lambda block: block.cost)
    needed = -(-worst.cost // (1 << 20))
    raise SurgeryError(
        f"Leaf {worst.path!r} cannot be written within max_memory={human_bytes(max_memory)}: "
        f"its smallest block holds {human_bytes(worst.cost)} at once (reading, computing and "
        f"writing it). Pass max_memory='{needed}MiB' or more, or make the leaf's blocks "
        f"smaller: a smaller chunk_bytes, or an elementwise map (suture.map(..., "
        f"elementwise=True)) instead of one of the whole array."
    )


def _computes_whole(node: Node) -> bool:
    return any(
        (isinstance(n, MapNode) and not n.elementwise)
        or (isinstance(n, ComputeNode) and not n.splits_rows)
        for n in _walk(node)
    )


def _walk(node: Node) -> Iterator[Node]:
    pending = [node]
    while pending:
        current = pending.pop()
        yield current
        pending.extend(current.inputs())


def _cost(array: LazyArray, rows: slice, writer: LeafWriter, axis: int = 0) -> int:
    """Bytes a block holds at its peak: what reading it holds (decoded chunks, strips,
    temporaries, map working memory), the block itself, and what the writer holds."""
    view = array[(slice(None),) * axis + (rows,)] if array.ndim else array
    # maps count their working memory in `read_memory`, at the selection each one computes
    working = sum(
        n.working_bytes(view.nbytes) for n in _walk(view._node) if isinstance(n, ComputeNode)
    )
    reading = read_memory(view._node, full(view.shape), into=True)
    return reading + view.nbytes + working + writer.held_while_writing(view.nbytes)


class Budget:
    """Admits blocks while the bytes in flight stay under a limit (one oversized at a time).

    It also keeps the output arrays of finished blocks for the next blocks to reuse (fresh
    arrays cost a page fault per 4 KiB). A kept array stays counted in `in_flight`; a block
    that must wait first frees the kept arrays, so they never hold a block back. `peak` is
    the most bytes ever in flight at once (the tests hold it to the limit).
    """

    def __init__(self, limit: int, keep: int = WRITE_THREADS) -> None:
        self.limit, self.in_flight, self.peak = limit, 0, 0
        self._keep = keep
        self._kept: list[np.ndarray] = []
        self._condition = threading.Condition()

    def acquire(self, cost: int, output_bytes: int = 0) -> tuple[int, np.ndarray | None]:
        """Waits until `cost` fits; returns the cost taken and a kept array to reuse, if any.

        A reused array of ``n >= output_bytes`` bytes is charged as ``n`` instead.
        """
        with self._condition:
            reused = self._take_kept(output_bytes) if output_bytes else None
            if reused is not None:
                self.in_flight -= reused.nbytes
                cost += reused.nbytes - output_bytes
            while not (self.in_flight == 0 or self.in_flight + cost <= self.limit):
                if self._kept:
                    self.in_flight -= self._kept.pop().nbytes
                else:
                    self._condition.wait()
            self.in_flight += cost
            self.peak = max(self.peak, self.in_flight)
            return cost, reused

    def release(self, cost: int, output: np.ndarray | None = None) -> None:
        """Returns `cost`, keeping `output` (still counted) for another block to reuse."""
        with self._condition:
            self.in_flight -= cost
            if output is not None and 0 < output.nbytes <= cost and len(self._kept) < self._keep:
                self._kept.append(output)
                self.in_flight += output.nbytes
            self._condition.notify_all()

    def _take_kept(self, nbytes: int) -> np.ndarray | None:
        fitting = [i for i, kept in enumerate(self._kept) if nbytes <= kept.nbytes <= 2 * nbytes]
        if not fitting:
            return None
        return self._kept.pop(min(fitting, key=lambda i: self._kept[i].nbytes))


@dataclass
class Progress:
    """Counts for a progress display: bytes and leaves written so far."""

    total_bytes: int
    total_leaves: int
    written_bytes: int = 0
    written_leaves: int = 0
    started: float = 0.0

    @property
    def throughput(self) -> float:
        elapsed = time.perf_counter() - self.started
        return self.written_bytes / elapsed if elapsed > 0 else 0.0


def run_blocks(
    blocks: list[Block],
    max_memory: int,
    on_progress: Callable[[Progress], None] | None = None,
    threads: int = WRITE_THREADS,
    on_budget: Callable[[Budget], None] | None = None,
) -> Progress:
    """Reads, computes and writes every block; returns the final counts.

    Raises whatever the first failing block raised, after the others have stopped. An
    interruption (KeyboardInterrupt, or SIGTERM turned into one by the CLI) drops every
    queued block, so the work stops as soon as the blocks running have finished.
    """
    budget = Budget(max_memory, keep=threads)
    baseline = resident_bytes()
    blocks_left: dict[str, int] = {}
    for block in blocks:
        blocks_left[block.path] = blocks_left.get(block.path, 0) + 1
    progress = Progress(
        total_bytes=sum(block.nbytes for block in blocks),
        total_leaves=len(blocks_left),
        started=time.perf_counter(),
    )
    lock = threading.Lock()
    failed = threading.Event()

    def run(block: Block) -> None:
        view = block.view
        cost, buffer = budget.acquire(block.cost, view.nbytes)
        try:
            if failed.is_set():
                return
            if buffer is None:
                buffer = aligned_empty((view.nbytes,), np.dtype(np.uint8), alignment=4096)
            values = buffer[: view.nbytes].view(view.dtype).reshape(view.shape)
            view._node.read_into(full(view.shape), values)
            block.write(values)
        except BaseException:
            failed.set()
            raise
        finally:
            budget.release(cost, buffer)
            trim_freed_memory(baseline, max_memory)
        with lock:
            progress.written_bytes += block.nbytes
            blocks_left[block.path] -= 1
            if blocks_left[block.path] == 0:
                progress.written_leaves += 1
            if on_progress is not None:
                on_progress(progress)

    pool = ThreadPoolExecutor(max_workers=threads)
    try:
        futures = [pool.submit(run, block) for block in blocks]
        for future in futures:
            future.result()
    except BaseException:  # a failed block, or Ctrl-C / SIGTERM raised in this thread
        _stop(pool, failed)
        raise
    pool.shutdown(wait=True)
    if on_budget is not None:
        on_budget(budget)
    return progress


def _stop(pool: ThreadPoolExecutor, failed: threading.Event) -> None:
    """Drops the queued blocks and waits only for those running (each one block long)."""
    failed.set()
    pool.shutdown(wait=True, cancel_futures=True)


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 (both exist: glibc)
    except (OSError, AttributeError):  # not glibc
        return None
    return libc


_LIBC = _glibc()
_TRIM = _LIBC.malloc_trim if _LIBC is not None else None
_M_ARENA_MAX = -8


def limit_malloc_arenas() -> None:
    """Limits glibc to one malloc arena for threads started from now on (unless the
    environment sets ``MALLOC_ARENA_MAX``).

    glibc gives threads arenas of their own (up to 8 per core), and memory freed in one
    arena is re-used only by the threads of that arena. TensorStore's threads encode and
    write chunks in buffers they allocate and free, so each of its arenas kept a few chunks'
    worth after `free`: the process grew by 0.1 to 0.4 GiB beyond the blocks in flight
    (bench/larger_than_memory.py). With one arena the next chunk re-uses those pages, which
    also spares their page faults; the save's threads spend their time in numpy and
    TensorStore's codecs, not in `malloc`. Threads that already have an arena keep it, so
    this runs when suture is imported.
    """
    if _LIBC is not None and "MALLOC_ARENA_MAX" not in os.environ:
        _LIBC.mallopt(_M_ARENA_MAX, 1)


limit_malloc_arenas()


def trim_freed_memory(baseline: int | None, max_memory: int) -> None:
    """Hands memory that glibc keeps after `free` back to the system, once the process has
    grown by more than `max_memory` since `baseline` (its size when writing began).

    TensorStore's threads encode chunks in buffers of their own; glibc keeps what it frees
    (below the top of its heap, or in holes between live blocks) for re-use. Trimming only
    when the process nears its budget spares the page faults of re-using trimmed memory
    otherwise: with one malloc arena the next chunk re-uses what the last one freed, and
    trimming at three quarters of the budget tripled the page faults of a 256 MiB budget.
    """
    if _TRIM is None:
        return
    resident = resident_bytes()
    if resident is None or baseline is None or resident - baseline > max_memory:
        _TRIM(0)


def resident_bytes() -> int | None:
    """This process's resident memory (None where /proc is not available)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def block_budget(max_memory: int, threads: int = WRITE_THREADS) -> int:
    """The cost one block may have: an equal share of the budget for each thread."""
    return max(1, max_memory // threads)


def chunk_rows(shape: tuple[int, ...], itemsize: int, chunk_bytes: int) -> int:
    """Rows of the first axis per chunk so that a chunk holds at most `chunk_bytes`."""
    if not shape:
        return 1
    row_bytes = itemsize * math.prod(shape[1:])
    return int(max(1, min(shape[0], chunk_bytes // max(1, row_bytes)))) if shape[0] else 1
