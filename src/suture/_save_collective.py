"""`suture.save` as a collective under ``jax.distributed``: every process writes its share.

The steps, each ended by a barrier of all processes (`suture._distributed.Group`):

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
from pathlib import Path
from typing import Any

import numpy as np

from ._distributed import Group, global_array
from ._errors import SurgeryError
from ._execute import Block, run_blocks
from ._filesource import reading_directly
from ._paths import flatten
from ._progress import progress_bar
from ._save import (
    TMP_MARKER,
    SaveResult,
    _as_surgery_error,
    _call,
    _commit,
    _copy_extra_files,
    _exclusive,
    _is_io_failure,
    _orbax_blocks,
    _remove,
    _safetensors_blocks,
)
from ._verify import check, with_digests, written_leaves

_STOP_WAIT_SECONDS = 60.0


def write_collective(
    group: Group,
    tree: Any,
    destination: Path,
    format: str,  # noqa: A002
    overwrite: bool,
    separator: str,
    metadata: dict[str, Any] | None,
    **options: Any,
) -> SaveResult:
    """Writes this process's share of `tree`; see the module docstring for the steps.

    `options` are those `suture.save` hands its single-process writer (``max_memory`` ...).
    """
    started = time.perf_counter()
    max_memory, verify = options["max_memory"], options["verify"]
    with contextlib.ExitStack() as held:

        def prepare() -> str:
            held.enter_context(_exclusive(destination))
            name = destination.with_name(f"{destination.name}{TMP_MARKER}{uuid.uuid4().hex[:12]}")
            if format == "orbax":
                name.mkdir()
            return name.name  # each host may mount the storage elsewhere: send the name only

        temporary = destination.with_name(group.agree("temporary", prepare))
        try:
            if format == "orbax":
                blocks, finish, sync = _orbax_blocks(
                    tree, temporary, options["chunk_bytes"], max_memory, metadata, group
                )
            else:
                sync = None
                blocks, finish = _primary_safetensors(
                    group,
                    tree,
                    temporary,
                    destination.name.endswith(".safetensors"),  # one file, else a folder
                    separator,
                    options["max_shard_size"],
                    max_memory,
                    metadata,
                    options["shard_map"],
                )
            if verify:
                _check_verifiable(blocks)
                blocks, digests = with_digests(blocks)
            blocks = [_stopping_on_failure(block, group) for block in blocks]
            total = sum(block.nbytes for block in blocks)
            with progress_bar(
                f"Writing {destination.name}", total, options["show_progress"]
            ) as on_progress:
                try:
                    with reading_directly(block.array for block in blocks):
                        progress = run_blocks(blocks, max_memory, on_progress)
                finally:  # safetensors: each process closes what it opened
                    closing_error = _call(finish) if format != "orbax" else None
            if closing_error is not None:
                raise closing_error
            if sync is not None:  # this process's Orbax database, durable before "written"
                sync()
            group.barrier("written")
            if group.is_primary:
                if format == "orbax":
                    finish()
                _copy_extra_files(options["extra_files"], temporary)
            group.barrier("finished")
            if verify and blocks:
                check(blocks, digests, written_leaves(temporary, format))
            group.barrier("verified")
            if group.is_primary:
                _commit(temporary, destination, overwrite)
            group.barrier("committed")
        except BaseException as error:
            group.fail(error)
            if group.is_primary:
                _wait_for_others_to_stop(group)
                _remove(temporary)
            else:
                with contextlib.suppress(Exception):
                    group.arrive("stopped")
            if isinstance(error, (OSError, ValueError)) and (
                isinstance(error, OSError) or _is_io_failure(error)
            ):
                raise _as_surgery_error(error, destination) from error
            raise
    seconds = time.perf_counter() - started
    return SaveResult(destination, format, progress.written_bytes, progress.total_leaves, seconds)


def _primary_safetensors(group: Group, tree: Any, *arguments: Any) -> tuple[list[Block], Any]:
    """The primary's blocks for `_safetensors_blocks(tree, *arguments)`; none for the others."""
    spanning = [path for path, leaf in flatten(tree).items() if global_array(leaf) is not None]
    if spanning:
        raise SurgeryError(
            f"Leaf {spanning[0]!r} is a jax.Array sharded across processes, which a safetensors "
            f"file cannot be assembled from under jax.distributed. Save as Orbax (each process "
            f"writes its shards), or gather it first (jax.experimental.multihost_utils."
            f"process_allgather)."
        )
    if not group.is_primary:
        return [], lambda: None
    return _safetensors_blocks(tree, *arguments)


def _check_verifiable(blocks: list[Block]) -> None:
    shards = [block.path for block in blocks if hasattr(block.writer, "index")]
    if shards:
        raise SurgeryError(
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
    from dataclasses import replace

    return replace(block, writer=_StoppingWriter(block.writer, group))


def _wait_for_others_to_stop(group: Group) -> None:
    """Gives the other processes a while to stop writing before their folder is removed."""
    with contextlib.suppress(Exception):
        group.gather("stopped", min(_STOP_WAIT_SECONDS, group.timeout))
