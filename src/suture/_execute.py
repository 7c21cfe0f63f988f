"""Streaming execution: read, compute and write leaves block by block under a memory budget.

Each array leaf is cut into blocks along its first axis, each a whole number of the sink's
chunks (so no chunk is written twice). Blocks are read (only the source bytes they need),
computed and handed to the sink on a few threads. A block's cost is the bytes it reads
plus the bytes it produces; the blocks in flight never cost more than `max_memory`. A block
larger than the budget is not refused: it waits until nothing else is in flight and runs
alone (with the default block size this only happens for a single chunk larger than the
budget).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ._compute import ComputeNode
from ._lazy import LazyArray
from ._nodes import MapNode, Node
from ._reads import bytes_read
from ._selection import Selection

DEFAULT_MAX_MEMORY = 1 << 30
WRITE_THREADS = 4


class LeafWriter(Protocol):
    """What a sink offers the executor for one array leaf."""

    def block_rows(self) -> int:
        """The first-axis rows in one chunk: blocks are whole multiples of it."""

    def write(self, rows: slice, values: np.ndarray) -> None:
        """Writes `values` as rows `rows` (along the first axis) of the leaf."""


@dataclass(frozen=True)
class Block:
    path: str
    array: LazyArray
    writer: LeafWriter
    rows: slice
    cost: int  # bytes read + bytes produced

    @property
    def nbytes(self) -> int:
        return self.array[self.rows].nbytes if self.array.ndim else self.array.nbytes


def plan_blocks(
    path: str, array: LazyArray, writer: LeafWriter, block_budget: int
) -> Iterator[Block]:
    """The blocks of one leaf: whole numbers of the writer's chunks, as many rows as fit.

    A block's cost (what it decodes from its sources, what it produces, and the working
    memory of any function that computes it) stays within `block_budget` when a single
    chunk allows. A leaf computed by a function of whole arrays (a map that is not
    elementwise) is one block: splitting it would compute the function once per block.
    """
    if array.ndim == 0 or array.shape[0] == 0 or _computes_whole(array._node):
        yield Block(path, array, writer, slice(None), _cost(array, slice(None)))
        return
    unit = max(1, writer.block_rows())
    units = -(-array.shape[0] // unit)
    low, high = 1, units  # the most chunks per block whose cost fits, by bisection
    while low < high:
        middle = (low + high + 1) // 2
        if _cost(array, slice(0, middle * unit)) <= block_budget:
            low = middle
        else:
            high = middle - 1
    step = low * unit
    for start in range(0, array.shape[0], step):
        rows = slice(start, min(start + step, array.shape[0]))
        yield Block(path, array, writer, rows, _cost(array, rows))


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


def _cost(array: LazyArray, rows: slice) -> int:
    """Bytes a block holds at its peak: decoded source chunks, output, and map working memory."""
    view = array[rows] if array.ndim else array
    selection: Selection = tuple(range(length) for length in view.shape)
    working = sum(
        (len(n.inputs()) + 1) * view.nbytes for n in _walk(view._node) if isinstance(n, MapNode)
    ) + sum(n.working_bytes(view.nbytes) for n in _walk(view._node) if isinstance(n, ComputeNode))
    return bytes_read(view._node, selection) + view.nbytes + working


class _Budget:
    """Admits blocks while the bytes in flight stay under a limit (one oversized at a time)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.in_flight = limit, 0
        self._condition = threading.Condition()

    def acquire(self, cost: int) -> None:
        with self._condition:
            self._condition.wait_for(
                lambda: self.in_flight == 0 or self.in_flight + cost <= self.limit
            )
            self.in_flight += cost

    def release(self, cost: int) -> None:
        with self._condition:
            self.in_flight -= cost
            self._condition.notify_all()


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
) -> Progress:
    """Reads, computes and writes every block; returns the final counts.

    Raises whatever the first failing block raised, after the others have stopped. An
    interruption (KeyboardInterrupt, or SIGTERM turned into one by the CLI) drops every
    queued block, so the work stops as soon as the blocks running have finished.
    """
    budget = _Budget(max_memory)
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
        budget.acquire(block.cost)
        try:
            if failed.is_set():
                return
            view = block.array[block.rows] if block.array.ndim else block.array
            block.writer.write(block.rows, view.read())
        except BaseException:
            failed.set()
            raise
        finally:
            budget.release(block.cost)
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
    return progress


def _stop(pool: ThreadPoolExecutor, failed: threading.Event) -> None:
    """Drops the queued blocks and waits only for those running (each one block long)."""
    failed.set()
    pool.shutdown(wait=True, cancel_futures=True)


def block_budget(max_memory: int, threads: int = WRITE_THREADS) -> int:
    """The cost one block may have: an equal share of the budget for each thread."""
    return max(1, max_memory // threads)


def chunk_rows(shape: tuple[int, ...], itemsize: int, chunk_bytes: int) -> int:
    """Rows of the first axis per chunk so that a chunk holds at most `chunk_bytes`."""
    if not shape:
        return 1
    row_bytes = itemsize * math.prod(shape[1:])
    return int(max(1, min(shape[0], chunk_bytes // max(1, row_bytes)))) if shape[0] else 1
