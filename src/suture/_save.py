"""`suture.save`: stream a tree (lazy or in memory) to an Orbax checkpoint or safetensors.

The result never appears half-written (`suture._location.publish` does the locking and the
commit): locally it is written into a temporary sibling of `path` (named with Orbax's
``.orbax-checkpoint-tmp`` marker, so every Orbax-aware tool sees it as unfinished) and
renamed into place when complete; on ``gs://`` and ``s3://`` it is published with Orbax's
commit marker. A lock keeps two writers off one destination. Sources are only ever
opened for reading.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._checkpoint import Checkpoint
from ._distributed import Group, collective, global_array, share_blocks
from ._errors import SurgeryError
from ._execute import (
    DEFAULT_MAX_MEMORY,
    Block,
    Budget,
    block_budget,
    check_blocks_fit,
    leaf_blocks,
    run_blocks,
)
from ._filesource import reading_directly
from ._format import parse_bytes
from ._lazy import LazyArray, as_lazy
from ._location import LocalLocation, Location, location_of
from ._location.publish import TMP_MARKER as PUBLISH_TMP_MARKER
from ._location.publish import (
    begin,
    destination_exists,
    exclusive,
    is_unfinished,
    rename_into_place,
)
from ._paths import flatten
from ._progress import progress_bar, wants_progress
from ._replace import check_replaceable
from ._sidefiles import model_folder_side_files
from ._verify import check, with_digests, written_leaves
from .sinks.orbax import DEFAULT_CHUNK_BYTES, OrbaxSink, keys_and_kinds, merge_process_databases
from .sinks.safetensors import SafetensorsSink

FORMATS = ("orbax", "safetensors")


@dataclass(frozen=True)
class SaveResult:
    """What a save wrote (`path`: a `Path`, or the URL of a remote destination)."""

    path: Path | str
    format: str
    bytes_written: int
    leaves: int
    seconds: float
    peak_in_flight: int = 0  # the most bytes the blocks in flight held at once (<= max_memory)


class SaveHandle:
    """A save running in the background; `wait()` returns its `SaveResult` or raises its error."""

    def __init__(self, job: Any) -> None:
        self._result: SaveResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(job,), name="suture-save", daemon=False
        )
        self._thread.start()

    def _run(self, job: Any) -> None:
        try:
            self._result = job()
        except BaseException as error:  # handed to wait()
            self._error = error

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> SaveResult:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"The save is still running after {timeout} s.")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def save(
    tree: Any,
    path: str | os.PathLike,
    *,
    format: str = "orbax",  # noqa: A002 (the public word for it)
    overwrite: bool = False,
    max_memory: int | str | None = None,
    progress: bool | None = None,
    asynchronous: bool = False,
    chunk_bytes: int | str | None = None,
    max_shard_size: int | str | None = None,
    separator: str = ".",
    metadata: dict[str, Any] | None = None,
    shard_map: dict[str, str] | None = None,
    extra_files: dict[str, str | os.PathLike] | None = None,
    verify: bool = False,
) -> SaveResult | SaveHandle:
    """Writes `tree` to `path`, streaming lazy leaves under a memory budget.

    Under ``jax.distributed`` with several processes this is a collective, like Orbax's
    save: every process calls it with the same tree and path, and each writes only its
    share (its shards of globally sharded jax.Arrays, about 1/N of the blocks of other
    leaves); the primary commits once all have written. The result's counts are this
    process's own. See docs/design.md, "Multi-host".

    Args:
        tree: an in-memory tree, a lazy tree (``suture.transform(...)``), an opened
            `Checkpoint`, or a checkpoint path (a copy, perhaps in another format).
        path: the destination: a checkpoint folder for Orbax. For safetensors, a path
            ending in ``.safetensors`` is one file; any other path is a folder laid out as
            Hugging Face's ``save_pretrained`` does (``model.safetensors``, or shards and
            ``model.safetensors.index.json``), which ``from_pretrained`` reads. A local
            path, or a ``gs://`` or ``s3://`` URL: there the result is committed as Orbax
            commits on GCS, with ``commit_success.txt`` written last.
        format: ``"orbax"`` or ``"safetensors"``.
        overwrite: replace an existing checkpoint at `path` (atomically: the new one takes
            its place in one rename or exchange; the old one is removed afterwards). Anything
            else at `path` is refused. On object stores there is no rename: the old one is
            deleted before the new one is written.
        max_memory: how much the process may grow while writing (``"4GiB"`` works);
            default 1 GiB. Each block counts what reading it holds, its values and what
            writing it holds, and the blocks in flight stay within the budget, so the
            process grows by at most this plus a few tens of MiB (docs/design.md,
            "Writing"). A leaf larger than the budget is written a block of chunks at a
            time (a layer, or a row, too large for one block in parts); a leaf whose
            smallest block alone would exceed the budget (a map of whole arrays, say) is a
            `SurgeryError` before anything is written.
        progress: a progress bar on stderr; None shows it when stderr is a terminal.
        asynchronous: return a `SaveHandle` at once and write in the background; arrays
            of an in-memory tree must not be modified until ``handle.wait()`` returns.
        chunk_bytes: Orbax only: the largest chunk (default 16 MiB, or a sixteenth of
            `max_memory` when that is less); stacked arrays get one member per chunk.
        max_shard_size: safetensors folders only: shards of at most this size, with
            ``model.safetensors.index.json``.
        separator: safetensors only: joins the tree's keys into tensor names.
        metadata: Orbax custom metadata, or safetensors ``__metadata__`` (strings only).
        shard_map: safetensors only: ``{tensor name: shard file}`` to reproduce a layout
            (e.g. ``ckpt.layout["weight_map"]``), instead of `max_shard_size`.
        extra_files: ``{name: source file or URL}`` copied into a folder output (``config.json``).
            When `tree` is a Hugging Face folder (its path or its opened `Checkpoint`), its
            side files (``config.json``, tokenizer files ...) are copied by default.
        verify: read the output back before moving it into place and check every block's
            digest against what was written; a mismatch discards the output.

    Returns:
        A `SaveResult` (or a `SaveHandle` when `asynchronous`).

    Raises:
        SurgeryError: `path` exists without ``overwrite=True``, `path` is a source being
            read, another process is writing `path`, a leaf the format cannot hold.

    Example:
        >>> import numpy as np, suture, tempfile, os
        >>> folder = tempfile.mkdtemp()
        >>> result = suture.save({"w": np.ones((2, 2))}, os.path.join(folder, "ckpt"), progress=False)
        >>> float(suture.open(result.path)["w"].read().sum())
        4.0
    """
    destination = location_of(path)
    if format not in FORMATS:
        raise SurgeryError(f"Unknown output format {format!r}: use one of {', '.join(FORMATS)}.")
    destination.require_writable()
    folder_output = format == "orbax" or not destination.name.endswith(".safetensors")
    if extra_files is None and folder_output:
        extra_files = _side_files_of(tree)
    tree = _tree_of(tree)
    _check_writable_path(destination, format)
    _check_destination(destination, overwrite, tree)
    options = {
        "max_memory": parse_bytes(max_memory) if max_memory is not None else DEFAULT_MAX_MEMORY,
        "chunk_bytes": parse_bytes(chunk_bytes) if chunk_bytes is not None else None,
        "max_shard_size": parse_bytes(max_shard_size) if max_shard_size is not None else None,
        "show_progress": wants_progress(progress),
        "shard_map": shard_map,
        "extra_files": {name: location_of(file) for name, file in (extra_files or {}).items()},
        "verify": verify,
    }

    if options["chunk_bytes"] is None:  # small budgets get small chunks, so a block fits them
        options["chunk_bytes"] = max(1 << 16, min(DEFAULT_CHUNK_BYTES, options["max_memory"] // 16))
    group = collective()  # under jax.distributed every process writes its share

    def job() -> SaveResult:
        if group is not None:
            from ._save_collective import write_collective

            if not isinstance(destination, LocalLocation):
                raise SurgeryError(
                    f"Cannot write {str(destination)!r} from several processes: a save under "
                    f"jax.distributed writes local or mounted paths only. Save to a shared "
                    f"mounted folder, or from one process."
                )
            return write_collective(
                group, tree, destination.path, format, overwrite, separator, metadata, **options
            )
        return _write(tree, destination, format, overwrite, separator, metadata, **options)

    return SaveHandle(job) if asynchronous else job()


def _side_files_of(tree: Any) -> dict[str, Path]:
    """The side files (config.json ...) of a Hugging Face folder given as a path or opened."""
    if isinstance(tree, (str, os.PathLike)):
        return model_folder_side_files(tree)
    if isinstance(tree, Checkpoint) and tree.format == "safetensors":
        return model_folder_side_files(tree.location)
    return {}


def _tree_of(tree: Any) -> Any:
    if isinstance(tree, Checkpoint):
        return tree.tree
    if isinstance(tree, (str, os.PathLike)):
        from ._open import open as open_checkpoint

        return open_checkpoint(tree).tree
    return tree


def _check_writable_path(destination: Location, format: str) -> None:  # noqa: A002
    """A local destination's folder must exist; TensorStore (Orbax) takes only UTF-8 paths."""
    if destination.is_remote:
        return
    path = Path(destination)
    if not path.parent.is_dir():
        raise SurgeryError(
            f"The folder {str(path.parent)!r} for {str(path)!r} does not exist. "
            f"Create it first, or write elsewhere."
        )
    if format == "orbax":
        try:
            str(path.absolute()).encode("utf-8")
        except UnicodeEncodeError:
            raise SurgeryError(
                f"{str(path)!r} is not a UTF-8 path, and TensorStore (which writes Orbax "
                f"checkpoints) takes only UTF-8 paths. Write to a UTF-8 path, or write safetensors."
            ) from None


def _check_destination(destination: Location, overwrite: bool, tree: Any) -> None:
    if overwrite and destination.exists() and not destination.is_remote:
        check_replaceable(destination)
    if (
        not overwrite
        and destination.exists()
        and not (destination.is_remote and is_unfinished(destination))
    ):
        raise destination_exists(destination)
    target = str(destination.resolve())
    for leaf in flatten(tree).values():
        if not isinstance(leaf, LazyArray):
            continue
        for source in leaf.sources():
            origin = str(location_of(source.origin).resolve()) if source.origin else None
            if origin is not None and (origin == target or origin.startswith(f"{target}/")):
                raise SurgeryError(
                    f"{str(destination)!r} holds {source.path!r}, a source this save reads. Write "
                    f"to another path, then move it into place."
                )


def _write(
    tree: Any,
    destination: Location,
    format: str,  # noqa: A002
    overwrite: bool,
    separator: str,
    metadata: dict[str, Any] | None,
    max_memory: int,
    chunk_bytes: int,
    max_shard_size: int | None,
    show_progress: bool,
    shard_map: dict[str, str] | None,
    extra_files: dict[str, Location],
    verify: bool,
) -> SaveResult:
    started = time.perf_counter()
    with exclusive(destination):
        # safetensors is written with positional writes: staged locally for an object store
        publication = begin(destination, overwrite, staged=format == "safetensors")
        temporary = publication.temporary
        try:
            if format == "orbax":
                blocks, finish, _ = _orbax_blocks(
                    tree, temporary, chunk_bytes, max_memory, metadata
                )
            else:
                assert isinstance(temporary, LocalLocation)
                one_file = destination.name.endswith(".safetensors")
                blocks, finish = _safetensors_blocks(
                    tree,
                    temporary.path,
                    one_file,
                    separator,
                    max_shard_size,
                    max_memory,
                    metadata,
                    shard_map,
                )
            check_blocks_fit(blocks, max_memory)
            if verify:
                blocks, digests = with_digests(blocks)
            total = sum(block.nbytes for block in blocks)
            with progress_bar(f"Writing {destination.name}", total, show_progress) as on_progress:
                budget: list[Budget] = []
                try:
                    with reading_directly(block.array for block in blocks):
                        progress = run_blocks(
                            blocks, max_memory, on_progress, on_budget=budget.append
                        )
                finally:
                    finish_error = _call(finish)
            if finish_error is not None:
                raise finish_error
            if verify:
                check(blocks, digests, written_leaves(temporary, format))
            _copy_extra_files(extra_files, temporary)
            publication.commit(overwrite)
        except (OSError, ValueError) as error:
            publication.abort()
            if isinstance(error, ValueError) and not _is_io_failure(error):
                raise
            raise _as_surgery_error(error, destination) from error
        except BaseException:
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


def _call(finish: Any) -> BaseException | None:
    try:
        finish()
    except BaseException as error:  # reported after the blocks' own error, if any
        return error
    return None


def _orbax_blocks(
    tree: Any,
    folder: Location | Path,
    chunk_bytes: int,
    max_memory: int,
    metadata: Any,
    group: Group | None = None,
) -> tuple[list[Block], Any, Any]:
    """The blocks to write, the function that finishes the checkpoint, and the one that
    makes this process's writes durable (the finish does it for a single process).

    With a `group` (under jax.distributed) the blocks are this process's share, written to
    its own database (each process syncs its own), and the finish (for the primary, after
    every process has written) also merges the processes' databases.
    """
    sink = OrbaxSink(folder, chunk_bytes, None if group is None else group.index)
    if group is None:
        sink.start()
    arrays: list[tuple[str, LazyArray, Any]] = []
    owned: list[Block] = []  # shards of global jax.Arrays that this process holds
    leaves = keys_and_kinds(tree)
    if len(leaves) == 1 and leaves[0][0] == ():
        raise SurgeryError("An Orbax checkpoint needs a tree; wrap the array: {'array': x}.")
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
        blocks = [
            block
            for leaf in arrays
            for block in leaf_blocks(*leaf, block_budget(max_memory), max_memory)
        ]
        return blocks, lambda: sink.finish(metadata), sink.sync
    blocks = owned + share_blocks(arrays, block_budget(max_memory), group.count, group.index)
    return blocks, lambda: (sink.finish(metadata), merge_process_databases(folder)), sink.sync


def _copy_extra_files(extra_files: dict[str, Location], folder: Location | Path) -> None:
    if not extra_files:
        return
    folder = location_of(folder)
    if isinstance(folder, LocalLocation) and not folder.is_dir():
        raise SurgeryError(
            "extra_files= needs a folder output: Orbax, or safetensors to a path that does not "
            "end in '.safetensors'."
        )
    for name, source in extra_files.items():
        if "/" in name or name.startswith("."):
            raise SurgeryError(f"extra file name {name!r} must be a plain file name.")
        (folder / name).write_bytes(source.read_bytes())


def _safetensors_blocks(
    tree: Any,
    destination: Path,
    one_file: bool,
    separator: str,
    max_shard_size: int | None,
    max_memory: int,
    metadata: Any,
    shard_map: dict[str, str] | None,
) -> tuple[list[Block], Any]:
    tensors: dict[str, LazyArray] = {}
    others = []
    for path, leaf in flatten(tree).items():
        if isinstance(leaf, LazyArray) or (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            name = path.replace("/", separator)
            if name in tensors:
                raise SurgeryError(
                    f"Two leaves get the tensor name {name!r}; choose another separator."
                )
            tensors[name] = as_lazy(leaf, path=path)
        else:
            others.append(path)
    if others:
        raise SurgeryError(
            f"safetensors holds only arrays, but {len(others)} leaves are not: "
            f"{', '.join(repr(p) for p in others[:5])}. Drop them (rules.drop) or save as Orbax."
        )
    sink = SafetensorsSink(tensors, max_shard_size, metadata, shard_map, folder=not one_file)
    writers = sink.open_writers(destination)
    blocks = [
        block
        for name, array in tensors.items()
        for block in leaf_blocks(name, array, writers[name], block_budget(max_memory), max_memory)
    ]
    return blocks, sink.close


# The collective writer (_save_collective) works on local paths through these.
TMP_MARKER = PUBLISH_TMP_MARKER


@contextlib.contextmanager
def _exclusive(destination: Path) -> Iterator[None]:
    with exclusive(location_of(destination)):
        yield


def _commit(temporary: Path, destination: Path, overwrite: bool) -> None:
    rename_into_place(temporary, destination, overwrite)


def _remove(path: Path) -> None:
    LocalLocation(path).remove()


def _is_io_failure(error: ValueError) -> bool:
    """A TensorStore write failure (it reports I/O errors as ValueError)."""
    text = str(error)
    return "No space left" in text or "RESOURCE_EXHAUSTED" in text or "Error writing" in text


def _as_surgery_error(error: Exception, destination: Location) -> SurgeryError:
    import errno

    if getattr(error, "errno", None) == errno.ENOSPC or "No space left" in str(error):
        return SurgeryError(
            f"No space left on the device while writing {str(destination)!r}; nothing was left "
            f"behind. Free space or write elsewhere."
        )
    return SurgeryError(f"Writing {str(destination)!r} failed: {error}.")
