"""Saving under ``jax.distributed``: which process this is, agreement, barriers, shares of work.

When a program runs one JAX process per host (``jax.distributed.initialize``), `suture.save`
is a collective, as Orbax's saves are: every process calls it, in the same order, and each
writes only its share. The processes talk through the key-value store of JAX's coordination
service (no device collectives are needed, so this works on CPU hosts too):

- `Group.agree` has the primary (process 0) compute a value (the temporary name) and every
  process receive it;
- `Group.barrier` waits until every process has reached a step, and raises a `SurgeryError`
  naming the process and its error as soon as any process reports a failure (`Group.fail`);
- `share` deals out blocks of work so that each process gets about 1/N of the bytes.

A process that dies without reporting is noticed by JAX's own heartbeats, which stop the
other processes; a barrier also gives up after ``SUTURE_BARRIER_TIMEOUT`` seconds (default
1800). Either way the primary never commits, so nothing appears at the destination.

Every process announces that it entered the call (``entered``). A process still waiting
after ``SUTURE_COLLECTIVE_GRACE`` seconds (default 120) while some process has not entered
gets a `CollectiveError` naming them at once, rather than after the long timeout: the
usual cause is ``if jax.process_index() == 0: suture.save(...)``. Processes that entered
but are slow keep the long timeout.

In a single process `collective()` returns None and none of this runs.

Example:
    >>> collective() is None  # no jax.distributed here
    True
    >>> share(["a", "b", "c", "d"], [4, 1, 3, 2], count=2, index=0)
    ['a', 'b']
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .._errors import ArgumentError, CollectiveError
from .._jaxtypes import is_jax_array
from .._lazy.reads import bytes_read
from .._lazy.selection import full
from .blocks import leaf_blocks

T = TypeVar("T")
_PREFIX = "suture/collective"
_POLL_SECONDS = 0.02
_WAIT_SLICE_MS = 200
_DEFAULT_TIMEOUT = 1800.0
_DEFAULT_GRACE = 120.0
_sequence = itertools.count()


def _state() -> Any:
    """JAX's distributed state with its client, or None without jax.distributed (or with one process)."""
    if "jax" not in sys.modules:
        return None
    from jax._src import distributed  # heavy: loaded on first use, not at import

    state = distributed.global_state
    if state.client is None or (state.num_processes or 1) <= 1:
        return None
    return state


def barrier_timeout() -> float:
    """Seconds a barrier waits for the slowest process (``SUTURE_BARRIER_TIMEOUT``)."""
    return _seconds("SUTURE_BARRIER_TIMEOUT", _DEFAULT_TIMEOUT, "600")


def entry_grace() -> float:
    """Seconds every process has to enter a collective call (``SUTURE_COLLECTIVE_GRACE``)."""
    return _seconds("SUTURE_COLLECTIVE_GRACE", _DEFAULT_GRACE, "300")


def _seconds(variable: str, default: float, example: str) -> float:
    text = os.environ.get(variable)
    try:
        value = float(text) if text else default
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ArgumentError(
            f"{variable}={text!r} is not a number of seconds; set it to e.g. {example}."
        )
    return value


class Group:
    """One collective call (a save) across all processes; see the module docstring."""

    def __init__(self, client: Any, count: int, index: int, name: str) -> None:
        self._client, self.count, self.index = client, count, index
        self._key = f"{_PREFIX}/{next(_sequence)}/{name}"
        self.timeout = barrier_timeout()
        self.grace = min(entry_grace(), self.timeout)
        self._began = time.monotonic()
        self._everyone_entered = False

    @property
    def is_primary(self) -> bool:
        return self.index == 0

    def agree(self, step: str, compute: Callable[[], str]) -> str:
        """The primary's `compute()`, received by every process (a primary error is raised by all)."""
        key = f"{self._key}/agree/{step}"
        if self.is_primary:
            try:
                value = compute()
            except BaseException as error:
                self.fail(error)
                raise
            self._client.key_value_set(key, value)
            return value
        return self._wait_for(key, step)

    def barrier(self, step: str) -> None:
        """Returns once every process has reached `step`; raises if any process failed."""
        prefix = f"{self._key}/barrier/{step}/"
        self.arrive(step)
        deadline = time.monotonic() + self.timeout
        while True:
            self.raise_if_failed()
            if len(self._client.key_value_dir_get(prefix)) >= self.count:
                return
            self._raise_if_some_never_entered()
            if time.monotonic() > deadline:
                raise self._timeout_error(step)
            time.sleep(_POLL_SECONDS)

    def arrive(self, step: str) -> None:
        """Marks this process as having reached `step`, without waiting for the others."""
        self._client.key_value_set(f"{self._key}/barrier/{step}/{self.index}", "1")

    def gather(self, step: str, timeout: float) -> bool:
        """Waits up to `timeout` s for every process to `arrive` at `step`, failed or not."""
        prefix = f"{self._key}/barrier/{step}/"
        self.arrive(step)
        deadline = time.monotonic() + timeout
        while len(self._client.key_value_dir_get(prefix)) < self.count:
            if time.monotonic() > deadline:
                return False
            time.sleep(_POLL_SECONDS)
        return True

    def fail(self, error: BaseException) -> None:
        """Tells the other processes that this one failed (they raise at their next check).

        A process that stopped only because another failed reports nothing: the others
        hear of the first failure, not of its echoes.
        """
        if isinstance(error, CollectiveError):
            return
        text = f"process {self.index} failed: {type(error).__name__}: {error}"
        # If the coordination service is gone, JAX stops the other processes itself.
        with contextlib.suppress(Exception):
            self._client.key_value_set(f"{self._key}/failed/{self.index}", text)

    def raise_if_failed(self) -> None:
        """Raises a SurgeryError naming the first process that reported a failure."""
        failures = self._client.key_value_dir_get(f"{self._key}/failed/")
        others = sorted(value for key, value in failures if not key.endswith(f"/{self.index}"))
        if others:
            raise CollectiveError(
                f"The save was abandoned on every process because {others[0]}. Nothing was "
                f"written to the destination; fix that process's error and save again."
            )

    def _wait_for(self, key: str, step: str) -> str:
        deadline = time.monotonic() + self.timeout
        while True:
            self.raise_if_failed()
            try:
                return self._client.blocking_key_value_get(key, _WAIT_SLICE_MS)
            except Exception:  # not set yet (a deadline error); look for failures again
                self._raise_if_some_never_entered()
                if time.monotonic() > deadline:
                    raise self._timeout_error(step) from None

    def _raise_if_some_never_entered(self) -> None:
        """After the grace period, a process that never entered the call is an error now."""
        if self._everyone_entered or time.monotonic() - self._began < self.grace:
            return
        entered = self._client.key_value_dir_get(f"{self._key}/barrier/entered/")
        present = {int(key.rsplit("/", 1)[-1]) for key, _ in entered}
        absent = sorted(set(range(self.count)) - present)
        if not absent:
            self._everyone_entered = True
            return
        error = CollectiveError(
            f"Process {self.index} called suture.save under jax.distributed, but process"
            f"{'es' if len(absent) > 1 else ''} {', '.join(map(str, absent))} did not within "
            f"{self.grace:.0f} s. suture.save is a collective, like Orbax's: call it on every "
            f"process with the same tree and path, and each writes only its share (guarding it "
            f"with `if jax.process_index() == 0:` is what causes this). If some processes are "
            f"only slow to get there, raise SUTURE_COLLECTIVE_GRACE. Nothing was written to "
            f"the destination."
        )
        error.missing_process = True
        raise error

    def _timeout_error(self, step: str) -> CollectiveError:
        error = CollectiveError(
            f"Process {self.index} waited {self.timeout:.0f} s at step {step!r} of a collective "
            f"save for the other {self.count - 1} processes. Every process must call suture.save "
            f"with the same tree and path, in the same order; raise SUTURE_BARRIER_TIMEOUT if "
            f"some are just slow. Nothing was written to the destination."
        )
        error.missing_process = True
        return error


def collective(name: str = "save") -> Group | None:
    """A `Group` for one collective call when running under jax.distributed, else None."""
    state = _state()
    if state is None:
        return None
    return Group(state.client, int(state.num_processes), int(state.process_id), name)


def share(items: Sequence[T], costs: Sequence[int], count: int, index: int) -> list[T]:
    """Process `index`'s share of `items`: a contiguous run holding about 1/count of the cost.

    Runs keep neighbouring blocks (which often read the same stored chunks) on one process;
    an item belongs to the process whose run holds the middle of its cost, so every process
    computes the same split.
    """
    total = sum(costs) or 1
    share, before = [], 0
    for item, cost in zip(items, costs, strict=True):
        middle = before + cost / 2
        if min(count - 1, int(middle * count // total)) == index:
            share.append(item)
        before += cost
    return share


def global_array(leaf: Any) -> Any:
    """The jax.Array behind `leaf` when it spans processes (not fully addressable), else None.

    A LazyArray that merely wraps such an array counts too; a computed one does not.
    """
    node = getattr(leaf, "node", None)
    array = getattr(node, "array", leaf) if node is not None else leaf
    if is_jax_array(array) and not array.is_fully_addressable:
        return array
    return None


def share_blocks(
    arrays: Sequence[tuple[str, Any, Any]], block_budget: int, count: int, index: int
) -> list[Any]:
    """This process's share of the blocks of `arrays` (``(path, LazyArray, writer)`` each).

    The blocks are first cut small (a sixteenth of an even share, or `block_budget` if
    less) so that the shares come out even; then each process joins its neighbouring small
    blocks of one leaf back into blocks of up to `block_budget`, so that a stored chunk
    under several of them is read once. (Unlike a single process's, these blocks are never
    grown to avoid re-reads: shares would come out uneven.)
    """

    def plan(budget: int) -> list[Any]:
        return [
            block
            for leaf in arrays
            for block in leaf_blocks(*leaf, budget, 4 * block_budget, avoid_rereads=False)
        ]

    blocks = plan(block_budget)
    finer = max(1, sum(block.cost for block in blocks) // (16 * count))
    if finer < block_budget:
        blocks = plan(finer)
    weights = _weights(arrays, blocks)
    return _joined(share(blocks, weights, count, index), block_budget)


def _weights(arrays: Sequence[tuple[str, Any, Any]], blocks: list[Any]) -> list[int]:
    """Each block's bytes produced plus its rows' part of its leaf's reads.

    Not the blocks' own read estimates: a block smaller than a stored chunk counts the
    whole chunk, which the joined blocks of `_joined` read only once.
    """
    reads = {path: bytes_read(array.node, full(array.shape)) for path, array, _ in arrays}
    sizes = {path: array.nbytes for path, array, _ in arrays}
    weights = []
    for block in blocks:  # a block's part of its leaf (of a row of it, with `outer`)
        part = block.nbytes / sizes[block.path] if sizes[block.path] else 1.0
        weights.append(block.nbytes + int(reads[block.path] * part))
    return weights


def _joined(blocks: list[Any], block_budget: int) -> list[Any]:
    """Neighbouring blocks of one leaf joined while their summed cost fits `block_budget`."""
    joined: list[Any] = []
    for block in blocks:
        last = joined[-1] if joined else None
        if (
            last is not None
            and last.path == block.path
            and last.writer is block.writer
            and last.axis == block.axis
            and last.rows.stop is not None
            and last.rows.stop == block.rows.start
            and last.cost + block.cost <= block_budget
        ):
            rows = slice(last.rows.start, block.rows.stop)
            joined[-1] = dataclasses.replace(last, rows=rows, cost=last.cost + block.cost)
        else:
            joined.append(block)
    return joined
