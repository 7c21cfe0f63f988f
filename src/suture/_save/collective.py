"""`suture.save` as a collective under ``jax.distributed``: every process writes its share.

The steps, each ended by a barrier of all processes (`suture._exec.distributed.Group`):

1. The primary takes the destination's lock and creates the temporary folder; every
   process receives its name.
2. Each process writes its share: its shards of globally sharded jax.Arrays, and a
   disjoint share of the blocks of every other leaf, into its own OCDBT database.
3. The primary writes the tree's metadata and merges the databases (as Orbax does).
4. With ``verify=True`` each process reads its own blocks back from the merged result.
5. The primary moves the result into place and releases the lock.

A failure anywhere is reported to every process, which stops at its next block or barrier;
the primary then removes the temporary folder once the others have stopped, so the
destination never holds a partial result.

Safetensors output is written by the primary alone (one file cannot be merged from
per-process parts), so it takes in-memory arrays that each process can read whole.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import DestinationError, UnsupportedError
from .._exec.blocks import Block
from .._exec.distributed import Group, global_array
from .._exec.progress import progress_bar
from .._exec.runner import run_blocks
from .._location import LocalLocation, location_of
from .._location.publish import TMP_MARKER, exclusive, rename_into_place
from .._paths import flatten
from ..sources.filesource import reading_directly
from .options import SaveOptions
from .verify import check, with_digests, written_leaves
from .writer import (
    SaveResult,
    as_surgery_error,
    call_collecting_error,
    copy_extra_files,
    is_io_failure,
    orbax_blocks,
    safetensors_blocks,
)

_STOP_WAIT_SECONDS = 60.0


def write_collective(
    group: Group, tree: Any, destination: Path, options: SaveOptions
) -> SaveResult:
    """Writes this process's share of `tree`; see the module docstring for the steps."""
    started = time.perf_counter()
    format, overwrite = options.format, options.overwrite  # noqa: A001
    max_memory, verify = options.max_memory, options.verify
    with contextlib.ExitStack() as held:

        def prepare() -> str:
            held.enter_context(exclusive(location_of(destination)))
            name = destination.with_name(f"{destination.name}{TMP_MARKER}{uuid.uuid4().hex[:12]}")
            if format == "orbax":
                name.mkdir()
            return name.name  # each host may mount the storage elsewhere: send the name only

        temporary = destination.with_name(group.agree("temporary", prepare))
        try:
            if format == "orbax":
                blocks, finish, sync = orbax_blocks(tree, temporary, options, group)
            else:
                sync = None
                one_file = destination.name.endswith(".safetensors")  # else a folder
                blocks, finish = _primary_safetensors(group, tree, temporary, one_file, options)
            if verify:
                _check_verifiable(blocks)
                blocks, digests = with_digests(blocks)
            blocks = [_stopping_on_failure(block, group) for block in blocks]
            total = sum(block.nbytes for block in blocks)
            with progress_bar(
                f"Writing {destination.name}", total, options.show_progress
            ) as on_progress:
                try:
                    with reading_directly(block.array for block in blocks):
                        progress = run_blocks(blocks, max_memory, on_progress)
                finally:  # safetensors: each process closes what it opened
                    closing_error = call_collecting_error(finish) if format != "orbax" else None
            if closing_error is not None:
                raise closing_error
            if sync is not None:  # this process's Orbax database, durable before "written"
                sync()
            group.barrier("written")
            if group.is_primary:
                if format == "orbax":
                    finish()
                copy_extra_files(options.extra_files, temporary)
            group.barrier("finished")
            if verify and blocks:
                check(blocks, digests, written_leaves(temporary, format))
            group.barrier("verified")
            if group.is_primary:
                rename_into_place(temporary, destination, overwrite)
            group.barrier("committed")
        except BaseException as error:
            group.fail(error)
            if group.is_primary:
                _wait_for_others_to_stop(group)
                LocalLocation(temporary).remove()
            else:
                with contextlib.suppress(Exception):
                    group.arrive("stopped")
            # A DestinationError (the destination appeared meanwhile) is an OSError but
            # already says what went wrong: raised as it is, not wrapped as a failed write.
            if (
                isinstance(error, (OSError, ValueError))
                and not isinstance(error, DestinationError)
                and (isinstance(error, OSError) or is_io_failure(error))
            ):
                raise as_surgery_error(error, destination) from error
            raise
    seconds = time.perf_counter() - started
    return SaveResult(destination, format, progress.written_bytes, progress.total_leaves, seconds)


def _primary_safetensors(group: Group, tree: Any, *arguments: Any) -> tuple[list[Block], Any]:
    """The primary's blocks for `safetensors_blocks(tree, *arguments)`; none for the others."""
    spanning = [path for path, leaf in flatten(tree).items() if global_array(leaf) is not None]
    if spanning:
        raise UnsupportedError(
            f"Leaf {spanning[0]!r} is a jax.Array sharded across processes, which a safetensors "
            f"file cannot be assembled from under jax.distributed. Save as Orbax (each process "
            f"writes its shards), or gather it first (jax.experimental.multihost_utils."
            f"process_allgather)."
        )
    if not group.is_primary:
        return [], lambda: None
    return safetensors_blocks(tree, *arguments)


def _check_verifiable(blocks: list[Block]) -> None:
    shards = [block.path for block in blocks if hasattr(block.writer, "index")]
    if shards:
        raise UnsupportedError(
            f"verify=True reads blocks back by rows, but {shards[0]!r} is a jax.Array sharded "
            f"across processes, written shard by shard. Save without verify, then check the "
            f"result with suture.load onto the same sharding."
        )


class _StoppingWriter:
    """Hands blocks on to `inner` until some process reports a failure."""

    def __init__(self, inner: Any, group: Group) -> None:
        self._inner, self._group = inner, group

    def block_rows(self) -> int:
        return self._inner.block_rows()

    def write(self, rows: slice, values: np.ndarray) -> None:
        self._group.raise_if_failed()
        self._inner.write(rows, values)

    def write_along(self, axis: int, rows: slice, values: np.ndarray) -> None:
        self._group.raise_if_failed()
        self._inner.write_along(axis, rows, values)


def _stopping_on_failure(block: Block, group: Group) -> Block:
    return replace(block, writer=_StoppingWriter(block.writer, group))


def _wait_for_others_to_stop(group: Group) -> None:
    """Gives the other processes a while to stop writing before their folder is removed."""
    with contextlib.suppress(Exception):
        group.gather("stopped", min(_STOP_WAIT_SECONDS, group.timeout))
