"""Running blocks on a few threads while the bytes in flight stay under the budget.

`run_blocks` reads, computes and writes every block; a `Budget` admits a block once its
cost fits, and keeps finished output arrays for the next blocks to reuse.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .._buffers import aligned_empty
from .._lazy.selection import full
from .blocks import WRITE_THREADS, Block
from .memory import resident_bytes, trim_freed_memory


class Budget:
    """Admits blocks while the bytes in flight stay under a limit (one oversized at a time).

    It also keeps the output arrays of finished blocks for the next blocks to reuse (fresh
    arrays cost a page fault per 4 KiB, and zeroing each page): the `keep` largest, since a
    small block's array cannot serve a large one. A kept array stays counted in `in_flight`;
    a block that would fit without the kept arrays frees them, so they never hold a block
    back; one that must wait for running blocks anyway leaves them for others to reuse.
    `peak` is the most bytes ever in flight at once (the tests hold it to the limit).
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
            while True:
                reused, extra = None, cost
                if output_bytes:  # again after each wait: one may be kept now
                    reused = self._take_kept(output_bytes)  # still counted in in_flight
                    if reused is not None:
                        extra = cost - output_bytes
                held = reused.nbytes if reused is not None else 0
                if self.in_flight == held or self.in_flight + extra <= self.limit:
                    break
                # dropping kept arrays helps only when it lets this block in now; otherwise
                # they stay for others to reuse
                dropping = bool(self._kept) and self._fits_without_kept(extra, held)
                if dropping:
                    self.in_flight -= self._kept.pop().nbytes
                if reused is not None:  # given back before waiting: waiters each holding an
                    self._kept.append(reused)  # array the others count would wait forever
                if not dropping:
                    self._condition.wait()
            self.in_flight += extra
            self.peak = max(self.peak, self.in_flight)
            return extra + held, reused

    def release(self, cost: int, output: np.ndarray | None = None) -> None:
        """Returns `cost`, keeping `output` (still counted) for another block to reuse."""
        with self._condition:
            self.in_flight -= cost
            if output is not None and 0 < output.nbytes <= cost:
                self._kept.append(output)
                self.in_flight += output.nbytes
                if len(self._kept) > self._keep:  # the largest serve most blocks: drop the smallest
                    smallest = min(range(len(self._kept)), key=lambda i: self._kept[i].nbytes)
                    self.in_flight -= self._kept.pop(smallest).nbytes
            self._condition.notify_all()

    def _fits_without_kept(self, extra: int, held: int) -> bool:
        rest = self.in_flight - sum(kept.nbytes for kept in self._kept)
        return rest == held or rest + extra <= self.limit

    def _take_kept(self, nbytes: int) -> np.ndarray | None:
        fitting = [i for i, kept in enumerate(self._kept) if nbytes <= kept.nbytes <= 2 * nbytes]
        if not fitting:
            return None
        return self._kept.pop(min(fitting, key=lambda i: self._kept[i].nbytes))


def buffer_size(nbytes: int, room: int) -> int:
    """`nbytes` rounded up to a size class (the next quarter of its power of two), when
    `room` allows: blocks of nearly the same size (208 and 210 MiB) then reuse each other's
    arrays instead of each faulting in (and the kernel zeroing) fresh pages.

    Example:
        >>> [buffer_size(n << 20, room=1 << 30) >> 20 for n in (208, 210, 177, 64)]
        [224, 224, 192, 64]
    """
    if nbytes <= 1 << 20:
        return nbytes
    step = 1 << (nbytes.bit_length() - 3)  # a quarter of the power of two below nbytes
    rounded = -(-nbytes // step) * step
    return rounded if rounded - nbytes <= room else nbytes


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
        size = buffer_size(view.nbytes, room=max_memory - block.cost)
        cost, buffer = budget.acquire(block.cost + size - view.nbytes, size)
        try:
            if failed.is_set():
                return
            if buffer is None:
                buffer = aligned_empty((size,), np.dtype(np.uint8), alignment=4096)
            values = buffer[: view.nbytes].view(view.dtype).reshape(view.shape)
            view.node.read_into(full(view.shape), values)
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
