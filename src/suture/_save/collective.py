"""`suture.save` as a collective under ``jax.distributed``: every process writes its share.

The steps, each ended by a barrier of all processes (`suture._exec.distributed.Group`):

1. Every process announces that it entered the save. The primary takes the destination's
   lock and prepares where the result is written (`suture._location.publish.begin`):
   locally a temporary sibling folder, whose name every process receives; on ``gs://``
   and ``s3://`` the destination prefix itself, begun with a ``_CHECKPOINT_METADATA`` that
   records no commit (as Orbax writes on GCS).
2. Each process writes its share: its shards of globally sharded jax.Arrays, and a
   disjoint share of the blocks of every other leaf, into its own OCDBT database.
3. The primary writes the tree's metadata and merges the databases (as Orbax does).
4. With ``verify=True`` each process reads its own blocks back from the merged result.
5. The primary publishes the result (a rename locally, ``commit_success.txt`` written last
   on an object store) and releases the lock.

A failure anywhere is reported to every process, which stops at its next block or barrier;
the primary then removes what was written once the others have stopped (or, when a
process is missing, at once), so the destination never holds anything suture or Orbax
takes for a finished checkpoint.

Safetensors output: each process writes whole shard files of a folder (its share of the
bytes; on an object store it uploads them too) and the primary writes the index, last; a
single file is the primary's. A shard cannot be merged from per-process parts, so every
leaf must be readable whole by the process writing it: arrays sharded across processes are
refused.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any

import numpy as np

from .._errors import CollectiveError, DestinationError, UnsupportedError
from .._exec.blocks import Block, write_threads
from .._exec.distributed import Group, global_array
from .._exec.progress import progress_bar
from .._exec.runner import run_blocks
from .._location import LocalLocation, Location, names_one_safetensors_file
from .._location.publish import Publication, begin, exclusive, remove_staged, staging
from .._paths import flatten
from ..sinks.orbax import OrbaxSink
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
_MISSING_STOP_WAIT_SECONDS = 5.0  # when a process is missing, it will not report stopping


def write_collective(
    group: Group, tree: Any, destination: Location, options: SaveOptions
) -> SaveResult:
    """Writes this process's share of `tree`; see the module docstring for the steps."""
    started = time.perf_counter()
    format, overwrite = options.format, options.overwrite  # noqa: A001
    max_memory, verify = options.max_memory, options.verify
    publication: list[Publication] = []  # the primary's
    staged = format == "safetensors" and destination.is_remote  # shards uploaded by each
    with contextlib.ExitStack() as held:

        def prepare() -> str:
            lock = held.enter_context(exclusive(destination))
            publication.append(begin(destination, overwrite, staged, lock.reclaimed))
            if isinstance(destination, LocalLocation):
                if format == "orbax" or not names_one_safetensors_file(destination):
                    publication[0].temporary.path.mkdir()  # type: ignore[attr-defined]
                # each host may mount the storage elsewhere: send the name only
                return publication[0].temporary.name
            if format == "orbax":
                OrbaxSink(destination).start()  # marks the prefix unfinished until the commit
            return ""  # a URL is the same everywhere: written in place

        group.arrive("entered")
        name = group.agree("temporary", prepare)
        temporary = publication[0].temporary if publication else _temporary(destination, name)
        if staged and not publication:
            temporary = staging(destination)  # each process stages and uploads its shards
        try:
            if format == "orbax":
                blocks, finish, sync = orbax_blocks(tree, temporary, options, group)
            else:
                sync = None
                one_file = names_one_safetensors_file(destination)  # else a folder
                _refuse_spanning_arrays(tree)
                assert isinstance(temporary, LocalLocation)
                blocks, finish = safetensors_blocks(tree, temporary.path, one_file, options, group)
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
                        progress = run_blocks(
                            blocks, max_memory, on_progress, threads=write_threads(temporary)
                        )
                finally:  # safetensors: each process closes what it opened
                    closing_error = call_collecting_error(finish) if format != "orbax" else None
            if closing_error is not None:
                raise closing_error
            if sync is not None:  # this process's Orbax database, durable before "written"
                sync()
            if staged:
                assert isinstance(temporary, LocalLocation)
                _upload_shards(temporary, destination)  # the index waits for the commit
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
                publication[0].commit(overwrite)
            elif staged:
                remove_staged(temporary)
            group.barrier("committed")
        except BaseException as error:
            group.fail(error)
            if group.is_primary:
                _wait_for_others_to_stop(group, error)
                if publication and not publication[0].committed:
                    publication[0].abort()
                    if publication[0].staged:  # the other processes' uploaded shards
                        with contextlib.suppress(Exception):
                            destination.remove()
            else:
                with contextlib.suppress(Exception):
                    group.arrive("stopped")
            if staged and not publication:
                with contextlib.suppress(Exception):
                    remove_staged(temporary)
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
    result_path = destination.path if isinstance(destination, LocalLocation) else str(destination)
    return SaveResult(result_path, format, progress.written_bytes, progress.total_leaves, seconds)


def _temporary(destination: Location, name: str) -> Location:
    """Where a non-primary process writes: the primary's temporary sibling, or the prefix."""
    return destination.with_name(name) if name else destination


def _refuse_spanning_arrays(tree: Any) -> None:
    """A safetensors file cannot be assembled from shards held by several processes."""
    spanning = [path for path, leaf in flatten(tree).items() if global_array(leaf) is not None]
    if spanning:
        raise UnsupportedError(
            f"Leaf {spanning[0]!r} is a jax.Array sharded across processes, which a safetensors "
            f"file cannot be assembled from under jax.distributed. Save as Orbax (each process "
            f"writes its shards), or gather it first (jax.experimental.multihost_utils."
            f"process_allgather)."
        )


def _upload_shards(staged: LocalLocation, destination: Location) -> None:
    """Uploads this process's shard files (not the index, which the primary commits last)."""
    if names_one_safetensors_file(destination):
        return  # one file: the primary's, uploaded by its commit
    for file in sorted(staged.path.glob("*.safetensors")):
        (destination / file.name).write_bytes(file.read_bytes())
        file.unlink()  # the primary's commit uploads what is left: the index


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


def _wait_for_others_to_stop(group: Group, error: BaseException) -> None:
    """Gives the other processes a while to stop writing before their output is removed.

    After a process went missing (a barrier timed out) it will never report stopping: the
    wait is then short, so that the primary cleans up and raises within one barrier
    timeout, before JAX's own heartbeat check aborts it.
    """
    missing = isinstance(error, CollectiveError) and error.missing_process
    wait = _MISSING_STOP_WAIT_SECONDS if missing else _STOP_WAIT_SECONDS
    with contextlib.suppress(Exception):
        group.gather("stopped", min(wait, group.timeout))
