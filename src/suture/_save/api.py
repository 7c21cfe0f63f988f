"""`suture.save`: stream a tree (lazy or in memory) to an Orbax checkpoint or safetensors.

The result never appears half-written (`suture._location.publish` does the locking and the
commit): locally it is written into a temporary sibling of `path` (named with Orbax's
``.orbax-checkpoint-tmp`` marker, so every Orbax-aware tool sees it as unfinished) and
renamed into place when complete; on ``gs://`` and ``s3://`` it is published with Orbax's
commit marker. A lock keeps two writers off one destination. Sources are only ever
opened for reading.
"""

from __future__ import annotations

import functools
import os
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._errors import ArgumentError, DestinationError, UnsupportedError
from .._exec.distributed import collective
from .._exec.memory import tune_if_asked
from .._exec.progress import wants_progress
from .._hf import model_folder_side_files, with_config_edited, with_output_dtype
from .._lazy.array import LazyArray
from .._location import Location, location_of, names_one_safetensors_file
from .._location.publish import (
    destination_exists,
    is_unfinished,
    lock_of,
    unfinished_elsewhere,
)
from .._paths import flatten
from .._quant.export import quantize_for_serving
from .._quant.tensors import quantized_config
from ..sinks.orbax import DEFAULT_COMPRESSION
from ..sources.checkpoint import Checkpoint
from ..sources.open import open as open_checkpoint
from .collective import write_collective
from .mesh import shards_of
from .options import SaveOptions
from .overwrite import check_replaceable
from .steps import save_step
from .writer import SaveResult, write


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
    tune_allocator: bool | None = None,
    compression: str = DEFAULT_COMPRESSION,
    quantize: str | None = None,
    keep_unquantized: list[str] | tuple[str, ...] | None = None,
    group_size: int | None = None,
    step: int | None = None,
    item: str | None = None,
    target_sharding: Any = None,
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
        tune_allocator: let suture tune this process's allocator for the write (glibc: one
            malloc arena, freed memory returned to the system once the process outgrows its
            budget), which keeps peak memory within `max_memory`. The tuning is process-wide
            and lasts after the save (glibc cannot undo it): threads the program starts later
            share one malloc arena. None (the default) follows ``SUTURE_TUNE_ALLOCATOR=1``,
            and the command line always tunes (it owns its process). See docs/design.md,
            "Memory".
        compression: Orbax only: how each chunk is stored. ``"auto"`` (the default)
            bit-shuffles 2-byte and wider numbers and compresses them with LZ4 (blosc):
            smaller than zstd on bfloat16 and float32 weights, for about half of zstd's CPU
            to write and to read; 1-byte types (FP8, int8) get zstd. ``"zstd"`` is Orbax's
            own, zstd level 1 for every array. ``"none"`` stores chunks as they are: the
            least CPU, about a third more bytes for bfloat16 weights. Every chunk carries a
            checksum, and Orbax, TensorStore and suture read all three.
        quantize: ``"fp8-block"`` writes each 2-D linear weight as ``weight`` in FP8 E4M3
            plus ``weight_scale_inv`` (float32, one per 128 x 128 block), as DeepSeek-V3 is
            published, computed as transformers' FP8 quantizer computes it; embeddings,
            norms, the LM head and MoE routers stay as they are. A ``config.json`` among the
            side files gets the matching ``quantization_config``. Streamed like any save.
            compressed-tensors' preset schemes (any case) write its formats, the same bytes
            as its compressors: ``"W4A16"``/``"W8A16"`` (symmetric INT4/INT8 per group of
            128 input columns, ``pack-quantized``), ``"NVFP4A16"`` (``nvfp4-pack-quantized``),
            ``"FP8_DYNAMIC"`` (FP8 per output channel, ``float-quantized``); the kept linear
            modules are the config's ``ignore`` list.
        keep_unquantized: with `quantize`, regular expressions (searched in each tensor's
            name) of the weights kept in high precision, instead of the defaults
            (``embed``, ``norm``, ``lm_head``, the MoE router ``.gate.weight``, ``router``).
        group_size: with ``quantize="W4A16"`` or ``"W8A16"``, input columns per scale
            (default 128).

        step: write step `step` of the CheckpointManager run at `path` (``path/step/item``),
            which ``ocp.CheckpointManager(path, item_names=...)`` restores; the run folder is
            created if missing, and a new step appears whole (written aside, then renamed).
        item: with `step`, the item's name (``"model"``; default ``"default"``, a manager's
            item without ``item_names``).
        target_sharding: Orbax only: the sharding the checkpoint will be restored with;
            each array is written in chunks that tile its shards there (no chunk crosses
            a shard's edge, several chunks to a shard larger than `chunk_bytes`), so each
            host restoring it reads only chunks of its own shards. A
            ``suture.TargetSharding(mesh, rules)`` (``TargetSharding("fsdp=8,tensor=2",
            "rules.yaml")``: the mesh needs no devices), or jax shardings: a tree of the
            tree's structure, or ``{leaf path: sharding}``, of ``NamedSharding``s (None:
            the default chunks). See docs/guide/large-checkpoints.md.

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
    if step is not None or item is not None:
        keywords = dict(
            format=format,
            overwrite=overwrite,
            max_memory=max_memory,
            progress=progress,
            chunk_bytes=chunk_bytes,
            metadata=metadata,
            verify=verify,
            tune_allocator=tune_allocator,
            compression=compression,
            target_sharding=target_sharding,
        )
        if format != "orbax" or asynchronous:
            raise ArgumentError(
                "step= and item= write an Orbax CheckpointManager step, synchronously: drop "
                "format= and asynchronous=, or write a single checkpoint without step=."
            )
        return save_step(path, step, item, overwrite, lambda where: save(tree, where, **keywords))
    destination = location_of(path)
    options = SaveOptions.from_keywords(
        format=format,
        overwrite=overwrite,
        separator=separator,
        metadata=metadata,
        max_memory=max_memory,
        chunk_bytes=chunk_bytes,
        max_shard_size=max_shard_size,
        show_progress=wants_progress(progress),
        shard_map=shard_map,
        extra_files=extra_files,
        verify=verify,
        tune_allocator=tune_allocator,
        compression=compression,
    )
    destination.require_writable()
    folder_output = format == "orbax" or not names_one_safetensors_file(destination)
    if extra_files is None and folder_output:
        options = replace(options, extra_files=_side_files_of(tree))
    tree = _tree_of(tree)
    if "config.json" in options.extra_files:  # its dtype fields follow the weights written
        options = replace(options, extra_files=with_output_dtype(options.extra_files, tree))
    if quantize is not None:
        keep = None if keep_unquantized is None else tuple(keep_unquantized)
        tree, quantization = quantize_for_serving(tree, quantize, keep, separator, group_size)
        edited = with_config_edited(dict(options.extra_files), quantized_config(quantization))
        options = replace(options, extra_files=edited)
    elif keep_unquantized is not None or group_size is not None:
        raise ArgumentError(
            "keep_unquantized= and group_size= go with quantize= ('fp8-block', 'W4A16' ...)."
        )
    if target_sharding is not None:
        if format != "orbax":
            raise ArgumentError(
                "target_sharding= (--mesh, --sharding) lays out an Orbax checkpoint's chunks; "
                "safetensors has none. "
                "Write format='orbax', or drop target_sharding=."
            )
        options = replace(options, shards=shards_of(target_sharding, tree))
    _check_writable_path(destination, format)
    _check_destination(destination, overwrite, tree)
    group = collective()  # under jax.distributed every process writes its share

    tune_if_asked(options.tune_allocator)  # before the save starts its threads

    def job() -> SaveResult:
        if group is None:
            return write(tree, destination, options)
        return write_collective(group, tree, destination, options)

    return SaveHandle(job) if asynchronous else job()


def _side_files_of(tree: Any) -> dict[str, Location]:
    """The side files (config.json ...) of a Hugging Face folder given as a path or opened."""
    if isinstance(tree, (str, os.PathLike)):
        folder = tree
    elif isinstance(tree, Checkpoint) and tree.format == "safetensors":
        folder = tree.location
    else:
        return {}
    return {name: location_of(file) for name, file in model_folder_side_files(folder).items()}


def _tree_of(tree: Any) -> Any:
    if isinstance(tree, Checkpoint):
        return tree.tree
    if isinstance(tree, (str, os.PathLike)):
        return open_checkpoint(tree).tree
    return tree


def _check_writable_path(destination: Location, format: str) -> None:  # noqa: A002
    """A local destination's folder must exist; TensorStore (Orbax) takes only UTF-8 paths."""
    if destination.is_remote:
        return
    path = Path(destination)
    if not path.parent.is_dir():
        raise DestinationError(
            f"The folder {str(path.parent)!r} for {str(path)!r} does not exist. "
            f"Create it first, or write elsewhere."
        )
    if format == "orbax":
        try:
            str(path.absolute()).encode("utf-8")
        except UnicodeEncodeError:
            raise UnsupportedError(
                f"{str(path)!r} is not a UTF-8 path, and TensorStore (which writes Orbax "
                f"checkpoints) takes only UTF-8 paths. Write to a UTF-8 path, or write safetensors."
            ) from None


def _check_destination(destination: Location, overwrite: bool, tree: Any) -> None:
    exists = destination.exists()  # one listing on an object store
    if exists and overwrite:
        check_replaceable(destination)
    elif exists:
        if not (destination.is_remote and is_unfinished(destination)):
            raise destination_exists(destination)
        if not lock_of(destination).exists():  # no suture writer (dead or alive) of it
            raise unfinished_elsewhere(destination)
    target = str(destination.resolve())
    resolved = functools.cache(lambda place: str(location_of(place).resolve()))
    for leaf in flatten(tree).values():
        if not isinstance(leaf, LazyArray):
            continue
        for source in leaf.sources():  # thousands of leaves share a few files: each resolved once
            origin = resolved(source.origin) if source.origin else None
            if origin is not None and _is_within(origin, target):
                raise DestinationError(
                    f"{str(destination)!r} holds {source.path!r}, a source this save reads. Write "
                    f"to another path, then move it into place."
                )
            within = source.folder or source.origin
            folder = resolved(within) if within else None
            if folder is not None and _is_within(target, folder):
                raise DestinationError(
                    f"{str(destination)!r} is inside {folder!r}, the checkpoint folder this save "
                    f"reads {source.path!r} from: written there, the output would become part "
                    f"of that checkpoint (its tensors would appear twice when the folder is "
                    f"opened again). Write it outside the source folder."
                )


def _is_within(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or lies inside it (both resolved)."""
    return path == folder or path.startswith(f"{folder.rstrip('/')}/")
