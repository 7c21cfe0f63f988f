"""`suture.save`: stream a tree (lazy or in memory) to an Orbax checkpoint or safetensors.

The result is written into a temporary sibling of `path` and renamed into place only when
complete, so `path` never holds a half-written result: a crash leaves at most the
temporary sibling (named with Orbax's ``.orbax-checkpoint-tmp`` marker, so every
Orbax-aware tool, suture included, sees it as unfinished). A lock file keeps two writers
off one destination. Sources are only ever opened for reading.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._checkpoint import Checkpoint
from ._distributed import Group, collective, global_array, share_blocks
from ._errors import SurgeryError
from ._execute import DEFAULT_MAX_MEMORY, Block, block_budget, plan_blocks, run_blocks
from ._format import parse_bytes
from ._lazy import LazyArray, as_lazy
from ._paths import flatten
from ._progress import progress_bar, wants_progress
from ._replace import check_replaceable, replace
from ._sidefiles import model_folder_side_files
from ._verify import check, with_digests, written_leaves
from .sinks.orbax import DEFAULT_CHUNK_BYTES, OrbaxSink, keys_and_kinds, merge_process_databases
from .sinks.safetensors import SafetensorsSink

FORMATS = ("orbax", "safetensors")
TMP_MARKER = ".orbax-checkpoint-tmp-suture-"


@dataclass(frozen=True)
class SaveResult:
    """What a save wrote."""

    path: Path
    format: str
    bytes_written: int
    leaves: int
    seconds: float


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
            ``model.safetensors.index.json``), which ``from_pretrained`` reads.
        format: ``"orbax"`` or ``"safetensors"``.
        overwrite: replace an existing checkpoint at `path` (atomically: the new one takes
            its place in one rename or exchange; the old one is removed afterwards). Anything
            else at `path` is refused.
        max_memory: bytes of array data in flight at once (``"4GiB"`` works); default 1 GiB.
            A leaf larger than the budget is written a block of chunks at a time.
        progress: a progress bar on stderr; None shows it when stderr is a terminal.
        asynchronous: return a `SaveHandle` at once and write in the background; arrays
            of an in-memory tree must not be modified until ``handle.wait()`` returns.
        chunk_bytes: Orbax only: the largest chunk (default 64 MiB); stacked arrays get one
            member per chunk.
        max_shard_size: safetensors folders only: shards of at most this size, with
            ``model.safetensors.index.json``.
        separator: safetensors only: joins the tree's keys into tensor names.
        metadata: Orbax custom metadata, or safetensors ``__metadata__`` (strings only).
        shard_map: safetensors only: ``{tensor name: shard file}`` to reproduce a layout
            (e.g. ``ckpt.layout["weight_map"]``), instead of `max_shard_size`.
        extra_files: ``{name: source file}`` copied into a folder output (``config.json``).
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
    destination = Path(path)
    if format not in FORMATS:
        raise SurgeryError(f"Unknown output format {format!r}: use one of {', '.join(FORMATS)}.")
    folder_output = format == "orbax" or not destination.name.endswith(".safetensors")
    if extra_files is None and folder_output:
        extra_files = _side_files_of(tree)
    tree = _tree_of(tree)
    _check_writable_path(destination, format)
    _check_destination(destination, overwrite, tree)
    options = {
        "max_memory": parse_bytes(max_memory) if max_memory is not None else DEFAULT_MAX_MEMORY,
        "chunk_bytes": parse_bytes(chunk_bytes) if chunk_bytes is not None else DEFAULT_CHUNK_BYTES,
        "max_shard_size": parse_bytes(max_shard_size) if max_shard_size is not None else None,
        "show_progress": wants_progress(progress),
        "shard_map": shard_map,
        "extra_files": {name: Path(file) for name, file in (extra_files or {}).items()},
        "verify": verify,
    }

    group = collective()  # under jax.distributed every process writes its share

    def job() -> SaveResult:
        if group is not None:
            from ._save_collective import write_collective

            return write_collective(
                group, tree, destination, format, overwrite, separator, metadata, **options
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


def _check_writable_path(destination: Path, format: str) -> None:  # noqa: A002
    """The destination's folder must exist; TensorStore (Orbax) takes only UTF-8 paths."""
    if not destination.parent.is_dir():
        raise SurgeryError(
            f"The folder {str(destination.parent)!r} for {str(destination)!r} does not exist. "
            f"Create it first, or write elsewhere."
        )
    if format == "orbax":
        try:
            str(destination.absolute()).encode("utf-8")
        except UnicodeEncodeError:
            raise SurgeryError(
                f"{str(destination)!r} is not a UTF-8 path, and TensorStore (which writes Orbax "
                f"checkpoints) takes only UTF-8 paths. Write to a UTF-8 path, or write safetensors."
            ) from None


def _check_destination(destination: Path, overwrite: bool, tree: Any) -> None:
    if destination.exists() and overwrite:
        check_replaceable(destination)
    if destination.exists() and not overwrite:
        raise SurgeryError(
            f"{str(destination)!r} already exists. Pass overwrite=True (--overwrite) to replace it (the old "
            f"one is removed only once the new one is complete), or choose another path."
        )
    target = destination.resolve()
    for leaf in flatten(tree).values():
        if not isinstance(leaf, LazyArray):
            continue
        for source in leaf.sources():
            origin = Path(source.origin).resolve() if source.origin else None
            if origin is not None and (origin == target or target in origin.parents):
                raise SurgeryError(
                    f"{str(destination)!r} holds {source.path!r}, a source this save reads. Write "
                    f"to another path, then move it into place."
                )


def _write(
    tree: Any,
    destination: Path,
    format: str,  # noqa: A002
    overwrite: bool,
    separator: str,
    metadata: dict[str, Any] | None,
    max_memory: int,
    chunk_bytes: int,
    max_shard_size: int | None,
    show_progress: bool,
    shard_map: dict[str, str] | None,
    extra_files: dict[str, Path],
    verify: bool,
) -> SaveResult:
    started = time.perf_counter()
    with _exclusive(destination):
        temporary = destination.with_name(f"{destination.name}{TMP_MARKER}{uuid.uuid4().hex[:12]}")
        try:
            if format == "orbax":
                blocks, finish = _orbax_blocks(tree, temporary, chunk_bytes, max_memory, metadata)
            else:
                one_file = destination.name.endswith(".safetensors")
                blocks, finish = _safetensors_blocks(
                    tree,
                    temporary,
                    one_file,
                    separator,
                    max_shard_size,
                    max_memory,
                    metadata,
                    shard_map,
                )
            if verify:
                blocks, digests = with_digests(blocks)
            total = sum(block.nbytes for block in blocks)
            with progress_bar(f"Writing {destination.name}", total, show_progress) as on_progress:
                try:
                    progress = run_blocks(blocks, max_memory, on_progress)
                finally:
                    finish_error = _call(finish)
            if finish_error is not None:
                raise finish_error
            if verify:
                check(blocks, digests, written_leaves(temporary, format))
            _copy_extra_files(extra_files, temporary)
            _commit(temporary, destination, overwrite)
        except (OSError, ValueError) as error:
            _remove(temporary)
            if isinstance(error, ValueError) and not _is_io_failure(error):
                raise
            raise _as_surgery_error(error, destination) from error
        except BaseException:
            _remove(temporary)
            raise
    return SaveResult(
        destination,
        format,
        progress.written_bytes,
        progress.total_leaves,
        time.perf_counter() - started,
    )


def _call(finish: Any) -> BaseException | None:
    try:
        finish()
    except BaseException as error:  # reported after the blocks' own error, if any
        return error
    return None


def _orbax_blocks(
    tree: Any,
    folder: Path,
    chunk_bytes: int,
    max_memory: int,
    metadata: Any,
    group: Group | None = None,
) -> tuple[list[Block], Any]:
    """The blocks to write and the function that finishes the checkpoint.

    With a `group` (under jax.distributed) the blocks are this process's share, written to
    its own database, and the finish (for the primary, after every process has written)
    also merges the processes' databases.
    """
    if group is None:
        folder.mkdir()
    sink = OrbaxSink(folder, chunk_bytes, None if group is None else group.index)
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
            block for leaf in arrays for block in plan_blocks(*leaf, block_budget(max_memory))
        ]
        return blocks, lambda: sink.finish(metadata)
    blocks = owned + share_blocks(arrays, block_budget(max_memory), group.count, group.index)
    return blocks, lambda: (sink.finish(metadata), merge_process_databases(folder))


def _copy_extra_files(extra_files: dict[str, Path], folder: Path) -> None:
    if not extra_files:
        return
    if not folder.is_dir():
        raise SurgeryError(
            "extra_files= needs a folder output: Orbax, or safetensors to a path that does not "
            "end in '.safetensors'."
        )
    for name, source in extra_files.items():
        if "/" in name or name.startswith("."):
            raise SurgeryError(f"extra file name {name!r} must be a plain file name.")
        shutil.copyfile(source, folder / name)


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
        for block in plan_blocks(name, array, writers[name], block_budget(max_memory))
    ]
    return blocks, sink.close


def _commit(temporary: Path, destination: Path, overwrite: bool) -> None:
    """Moves the finished result into place, atomically replacing an old one (`_replace`)."""
    if destination.exists() or destination.is_symlink():
        if not overwrite:
            raise SurgeryError(
                f"{str(destination)!r} appeared while writing; the new result was discarded."
            )
        old = replace(temporary, destination)
        if old is not None:
            _remove(old)
        return
    os.rename(temporary, destination)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@contextlib.contextmanager
def _exclusive(destination: Path) -> Iterator[None]:
    """A lock file beside `destination`, naming its writer as ``pid@host``.

    A lock whose writer is gone is taken over, but only when that writer ran on this host:
    on storage shared by several hosts, another host's process cannot be checked from here.
    """
    lock = destination.with_name(f".{destination.name}.suture-lock")
    for _ in range(2):
        try:
            descriptor = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            pid, host = _lock_owner(lock)
            if pid is not None and host not in (None, socket.gethostname()):
                raise SurgeryError(
                    f"Another process (pid {pid} on host {host!r}) is writing "
                    f"{str(destination)!r}. Wait for it to finish, or write elsewhere; if that "
                    f"writer is gone, remove {str(lock)!r}."
                ) from None
            if pid is not None and _alive(pid):
                raise SurgeryError(
                    f"Another process (pid {pid}) is writing {str(destination)!r}. Wait for it "
                    f"to finish, or write elsewhere."
                ) from None
            _remove(lock)  # stale: its writer died
    else:
        raise SurgeryError(
            f"Could not lock {str(destination)!r} for writing; remove {str(lock)!r}."
        )
    try:
        os.write(descriptor, f"{os.getpid()}@{socket.gethostname()}".encode())
        os.close(descriptor)
        yield
    finally:
        _remove(lock)


def _lock_owner(lock: Path) -> tuple[int | None, str | None]:
    """The lock's writer: ``(pid, host)``; a lock from before hosts were recorded has no host."""
    try:
        text = lock.read_text().strip()
    except OSError:
        return None, None
    pid_text, _, host = text.partition("@")
    try:
        return (int(pid_text or "0") or None), (host or None)
    except ValueError:
        return None, None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_io_failure(error: ValueError) -> bool:
    """A TensorStore write failure (it reports I/O errors as ValueError)."""
    text = str(error)
    return "No space left" in text or "RESOURCE_EXHAUSTED" in text or "Error writing" in text


def _as_surgery_error(error: Exception, destination: Path) -> SurgeryError:
    import errno

    if getattr(error, "errno", None) == errno.ENOSPC or "No space left" in str(error):
        return SurgeryError(
            f"No space left on the device while writing {str(destination)!r}; nothing was left "
            f"behind. Free space or write elsewhere."
        )
    return SurgeryError(f"Writing {str(destination)!r} failed: {error}.")
