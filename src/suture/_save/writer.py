"""Writing a tree from one process: its blocks, the run under the budget, the publication.

`write` is the single-process path of `suture.save`; the collective path (`collective.py`)
builds on the same pieces: `orbax_blocks`, `safetensors_blocks`, `copy_extra_files` and
the mapping of write failures to `SurgeryError`.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import errno
import tempfile
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._errors import ArgumentError, DestinationError, PathConflictError, UnsupportedError
from .._exec.blocks import (
    Block,
    block_budget,
    block_budget_for,
    check_blocks_fit,
    leaf_blocks,
    write_threads,
)
from .._exec.distributed import Group, global_array, share, share_blocks
from .._exec.progress import progress_bar
from .._exec.runner import Budget, run_blocks
from .._lazy.array import LazyArray, as_lazy
from .._location import LocalLocation, Location, location_of, names_one_safetensors_file
from .._location.publish import begin, exclusive
from .._paths import flatten
from ..sinks.orbax import OrbaxSink, keys_and_kinds, merge_process_databases
from ..sinks.safetensors import SafetensorsSink
from ..sources.filesource import reading_directly
from .mesh import chunking
from .options import SaveOptions
from .verify import check, with_digests, written_leaves


@dataclass(frozen=True)
class SaveResult:
    """What a save wrote (`path`: a `Path`, or the URL of a remote destination)."""

    path: Path | str
    format: str
    bytes_written: int
    leaves: int
    seconds: float
    peak_in_flight: int = 0  # the most bytes the blocks in flight held at once (<= max_memory)


def write(tree: Any, destination: Location, options: SaveOptions) -> SaveResult:
    """Writes `tree` to `destination` from this process alone, publishing it atomically."""
    format, overwrite, max_memory = options.format, options.overwrite, options.max_memory  # noqa: A001
    started = time.perf_counter()
    with exclusive(destination) as held:
        # safetensors is written with positional writes: staged locally for an object store
        staged = format == "safetensors"
        publication = begin(destination, overwrite, staged, reclaimed=held.reclaimed)
        temporary = publication.temporary
        settle: Any = lambda: None  # noqa: E731 (replaced by the Orbax sink's)
        try:
            one_file = names_one_safetensors_file(destination)
            if format == "orbax":
                blocks, finish, settle = orbax_blocks(tree, temporary, options)
            else:
                assert isinstance(temporary, LocalLocation)
                blocks, finish = safetensors_blocks(tree, temporary.path, one_file, options)
            check_blocks_fit(blocks, max_memory, _cost_at(tree, options, one_file))
            side_files = copying_beside(options.extra_files, temporary)
            settle = _also_waiting_for(side_files, settle)
            if options.verify:
                blocks, digests = with_digests(blocks)
            total = sum(block.nbytes for block in blocks)
            with progress_bar(
                f"Writing {destination.name}", total, options.show_progress
            ) as on_progress:
                budget: list[Budget] = []
                try:
                    with reading_directly(block.array for block in blocks):
                        progress = run_blocks(
                            blocks,
                            max_memory,
                            on_progress,
                            threads=write_threads(temporary),
                            on_budget=budget.append,
                        )
                finally:
                    finish_error = call_collecting_error(finish)
            if finish_error is not None:
                raise finish_error
            side_files.result()
            if options.verify:
                check(blocks, digests, written_leaves(temporary, format))
            publication.commit(overwrite)
        except (OSError, ValueError) as error:
            call_collecting_error(settle)  # nothing still being created outlives the abort
            publication.abort()
            if isinstance(error, ValueError) and not is_io_failure(error):
                raise
            raise as_surgery_error(error, destination) from error
        except BaseException:
            call_collecting_error(settle)
            publication.abort()
            raise
    return SaveResult(
        destination.path if isinstance(destination, LocalLocation) else str(destination),
        format,
        progress.written_bytes,
        progress.total_leaves,
        time.perf_counter() - started,
        budget[0].peak if budget else 0,
    )


def _cost_at(tree: Any, options: SaveOptions, one_file: bool) -> Any:
    """``cost_at(budget, paths)`` for `check_blocks_fit`: the costliest block of the leaves at
    `paths` when they are planned under `budget` (in a scratch folder, written nothing)."""

    def cost_at(budget: int, paths: set[str]) -> int:
        trial = replace(options.under_budget(budget), shard_map=None, max_shard_size=None)
        named = {
            (path if trial.format == "orbax" else path.replace("/", trial.separator)): leaf
            for path, leaf in flatten(tree).items()
        }
        leaves = {f"leaf{i}": named[path] for i, path in enumerate(sorted(paths)) if path in named}
        with tempfile.TemporaryDirectory() as scratch:
            if trial.format == "orbax":
                blocks, _, settle = orbax_blocks(leaves, Path(scratch) / "trial", trial)
                call_collecting_error(settle)  # a trial starts no thread that outlives it
            else:
                # a folder of shards is created by its sink: one that does not exist yet
                where = Path(scratch) / ("scratch.safetensors" if one_file else "trial")
                blocks, closing = safetensors_blocks(leaves, where, one_file, trial)
                call_collecting_error(closing)
        return max((block.cost for block in blocks), default=0)

    return cost_at


def call_collecting_error(finish: Any) -> BaseException | None:
    """Calls `finish`; returns its error instead of raising it (reported after the blocks' own)."""
    try:
        finish()
    except BaseException as error:  # reported after the blocks' own error, if any
        return error
    return None


def orbax_blocks(
    tree: Any, folder: Location | Path, options: SaveOptions, group: Group | None = None
) -> tuple[list[Block], Any, Any]:
    """The blocks to write, the function that finishes the checkpoint, and the one that
    settles this process's writes: under a `group`, makes its database durable; for a
    single process (whose finish makes it durable), waits for the arrays' creation, which
    on a bucket goes on while the blocks run (call it before an abort that skips finish).

    With a `group` (under jax.distributed) the blocks are this process's share, written to
    its own database (each process syncs its own), and the finish (for the primary, after
    every process has written) also merges the processes' databases.
    """
    chunk_of = chunking(options.shards, options.chunk_bytes) if options.shards else None
    process = None if group is None else group.index
    sink = OrbaxSink(folder, options.chunk_bytes, process, chunk_of, options.compression)
    try:
        return _sink_blocks(sink, tree, options, group)
    except BaseException:
        # Each array is created in TensorStore's threads from its `add_array` on: an error
        # or Ctrl-C before the caller holds `settle` must wait for those here, or they
        # write into the folder after its abort removed it.
        call_collecting_error(sink.settle)
        raise


def _sink_blocks(
    sink: OrbaxSink, tree: Any, options: SaveOptions, group: Group | None
) -> tuple[list[Block], Any, Any]:
    """`orbax_blocks` once its sink exists."""
    max_memory, metadata = options.max_memory, options.metadata
    budget = block_budget_for(sink.folder, max_memory)  # a block's share of max_memory
    if group is None:
        sink.start()
    arrays: list[tuple[str, LazyArray, Any]] = []
    owned: list[Block] = []  # shards of global jax.Arrays that this process holds
    leaves = keys_and_kinds(tree)
    if len(leaves) == 1 and leaves[0][0] == ():
        raise UnsupportedError("An Orbax checkpoint needs a tree; wrap the array: {'array': x}.")
    for keys, kinds, leaf in leaves:
        path = "/".join(keys)
        if group is not None and global_array(leaf) is not None:
            owned.extend(sink.add_sharded(keys, kinds, global_array(leaf)))
            continue
        if isinstance(leaf, LazyArray) or (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            array: LazyArray | None = as_lazy(leaf, path=path)
        else:
            array = sink.add_value(keys, kinds, leaf)
        if array is not None:
            arrays.append((path, array, sink.add_array(keys, kinds, array)))
    if group is None:
        sink.write_tree()  # while the arrays are being created
        if not sink.folder.is_remote:
            sink.opened()
        # On a bucket the creation takes a few round trips in a row: the blocks start
        # reading meanwhile, each block's write waits for its array, and `finish` (or
        # the settling before an abort) for every array.
        blocks = [block for leaf in arrays for block in leaf_blocks(*leaf, budget, max_memory)]
        sink.drop_behind(sum(block.nbytes for block in blocks))
        return blocks, lambda: sink.finish(metadata), sink.settle
    sink.opened()
    blocks = owned + share_blocks(arrays, budget, group.count, group.index)
    sink.drop_behind(sum(block.nbytes for block in blocks))
    return blocks, lambda: (sink.finish(metadata), merge_process_databases(sink.folder)), sink.sync


def copying_beside(extra_files: Mapping[str, Location], folder: Location | Path) -> Future:
    """`copy_extra_files` in a thread of its own, while the blocks are written: on a bucket
    each side file is a round trip, which then no longer comes after the last block's."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="suture-side-files")
    copying = pool.submit(contextvars.copy_context().run, copy_extra_files, extra_files, folder)
    pool.shutdown(wait=False)  # the thread ends with the copy; the save waits on `copying`
    return copying


def _also_waiting_for(copying: Future, settle: Any) -> Any:
    """`settle`, after `copying` has ended (nothing of the save is written after an abort)."""

    def settled() -> None:
        concurrent.futures.wait([copying])
        settle()

    return settled


def copy_extra_files(extra_files: Mapping[str, Location], folder: Location | Path) -> None:
    """Copies side files (``config.json`` ...) into a folder output."""
    if not extra_files:
        return
    folder = location_of(folder)
    if isinstance(folder, LocalLocation) and not folder.is_dir():
        raise ArgumentError(
            "extra_files= needs a folder output: Orbax, or safetensors to a path that does not "
            "end in '.safetensors'."
        )
    for name, source in extra_files.items():
        parts = name.split("/")
        if len(parts) > 2 or any(not part or part.startswith(".") for part in parts):
            raise ArgumentError(
                f"extra file name {name!r} must be a plain file name, or one inside a folder "
                f"of the output ('1_Pooling/config.json')."
            )
        if len(parts) == 2 and isinstance(folder, LocalLocation):
            (folder.path / parts[0]).mkdir(exist_ok=True)
        (folder / name).write_bytes(source.read_bytes())


def safetensors_blocks(
    tree: Any, destination: Path, one_file: bool, options: SaveOptions, group: Group | None = None
) -> tuple[list[Block], Any]:
    """The blocks that write `tree` as safetensors into `destination`, and the closing call.

    With a `group` (under jax.distributed) this process writes whole shard files, about 1/N
    of the bytes, and the primary the folder's index.
    """
    separator, max_memory = options.separator, options.max_memory
    tensors: dict[str, LazyArray] = {}
    others = []
    for path, leaf in flatten(tree).items():
        if isinstance(leaf, LazyArray) or (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            name = path.replace("/", separator)
            if name in tensors:
                raise PathConflictError(
                    f"Two leaves get the tensor name {name!r}; choose another separator."
                )
            tensors[name] = as_lazy(leaf, path=path)
        else:
            others.append(path)
    if others:
        raise UnsupportedError(
            f"safetensors holds only arrays, but {len(others)} leaves are not: "
            f"{', '.join(repr(p) for p in others[:5])}. Drop them (rules.drop) or save as Orbax."
        )
    sink = SafetensorsSink(
        tensors, options.max_shard_size, options.metadata, options.shard_map, folder=not one_file
    )
    if group is None:
        writers = sink.open_writers(destination)
    else:
        costs = [shard.nbytes for shard in sink.shards]
        mine = {s.filename for s in share(sink.shards, costs, group.count, group.index)}
        if one_file:  # the primary writes the one file, and publishes it
            mine = {sink.shards[0].filename} if group.is_primary else set()
        writers = sink.open_writers(destination, only=mine, index=group.is_primary)
    blocks = [
        block
        for name, array in tensors.items()
        if name in writers  # under jax.distributed: this process's shards only
        for block in leaf_blocks(name, array, writers[name], block_budget(max_memory), max_memory)
    ]
    return blocks, sink.close


def is_io_failure(error: ValueError) -> bool:
    """A TensorStore write failure (it reports I/O errors as ValueError)."""
    text = str(error)
    return "No space left" in text or "RESOURCE_EXHAUSTED" in text or "Error writing" in text


def as_surgery_error(error: Exception, destination: Location) -> DestinationError:
    if getattr(error, "errno", None) == errno.ENOSPC or "No space left" in str(error):
        return DestinationError(
            f"No space left on the device while writing {str(destination)!r}; nothing was left "
            f"behind. Free space or write elsewhere."
        )
    return DestinationError(f"Writing {str(destination)!r} failed: {error}.")
