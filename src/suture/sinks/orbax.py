"""Writing Orbax checkpoints leaf by leaf and block by block, with TensorStore.

The output is the layout that orbax-checkpoint's PyTreeCheckpointHandler writes, which
both ``orbax.checkpoint.StandardCheckpointer().restore`` and v1 ``ocp.load`` read
(the tests prove it): ``_METADATA`` (the tree, key kinds and value types),
``_CHECKPOINT_METADATA``, ``_strings.json`` for strings, and each array as a zarr3 array in
one OCDBT database.

Why not ``orbax.checkpoint.v1.partial.save``: it takes whole arrays, so a leaf larger than
the memory budget (a stack of all layers, say) could not be written slice by slice. Writing
through TensorStore lets a leaf be written one block of chunks at a time; measured in
``bench/streaming.py``.

Under ``jax.distributed`` (see ``suture._exec.distributed``) each process writes its share into its
own OCDBT database, ``ocdbt.process_<index>/``, and the primary merges them into the
checkpoint's root database, as Orbax's multi-process saves do; a globally sharded
``jax.Array`` is chunked by its shards, each written by the process holding its first replica.

Arrays are chunked along their first axis (rows per chunk so that a chunk holds at most
`chunk_bytes`; a row longer than that is cut along its own axes); a stacked array gets one
member per chunk, so reading one layer back reads about one layer's bytes (a layer larger
than a chunk is cut along its first axis too). A transposed matrix whose rows would each be
a column strip of its source is chunked in tiles of its columns instead (see `_chunk_shape`).
Each chunk is compressed as `chunk_codecs` says and carries a checksum of its contents.
"""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import UnsupportedError
from .._exec.blocks import Block, chunk_rows, rereads, stack_axis
from .._interrupts import native_call
from .._lazy.array import LazyArray
from .._location import LocalLocation, Location, location_of, remote_context, writeback
from .._location.writeback import fsync_tree
from .._paths import children, is_namedtuple
from .names import OrbaxNames

# glibc serves allocations over 32 MiB with fresh pages every time (a page fault per 4 KiB),
# and TensorStore allocates a copy and a compressed buffer per chunk: 64 MiB chunks cost
# twice the system time of 16 MiB ones (bench/larger_than_memory.py).
DEFAULT_CHUNK_BYTES = 16 << 20
_HANDLER = "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler"
_SEQUENCE_KEY, _DICT_KEY = 1, 2
PROCESS_PREFIX = "ocdbt.process_"  # Orbax's name for one process's database
REMOTE_DATA_FILE_BYTES = 8 << 20
# request slots of the writes' own (`OrbaxSink`), as many as the reads have
WRITE_RESOURCES = {
    f"{driver}_request_concurrency": {"limit": 64} for driver in ("gcs", "s3", "http")
}
# Saves writing this much or more drop their finished data files from the page cache as
# they go (`OrbaxSink.drop_behind`); smaller ones are often read back at once.
DROP_BEHIND_BYTES = 1 << 30
DATA_FOLDER = "d"  # where an OCDBT database keeps its data files
# How chunks are stored (`chunk_codecs`): "auto" (the default) by element size: 2-byte and
# wider numbers bit-shuffled, then LZ4 (blosc), byte-sized ones zstd level 1; "zstd" is zstd
# level 1 everywhere, as Orbax stores chunks; "none" stores them as they are. Every chunk
# carries a checksum of its contents, so damage is an error, not garbage: zstd's own
# (xxhash64) or a crc32c codec.
COMPRESSIONS = ("auto", "zstd", "none")
DEFAULT_COMPRESSION = "auto"
# blosc encodes at most INT_MAX bytes less its header at once; a larger chunk gets zstd
BLOSC_LARGEST_CHUNK = (1 << 31) - (1 << 16)


def _fill_value(dtype: np.dtype) -> Any:
    """zarr3's fill value of zero for `dtype`: a complex number is a pair of parts.

    Example:
        >>> [_fill_value(np.dtype(t)) for t in ("bool", "int8", "complex64")]
        [False, 0, [0, 0]]
    """
    if dtype.kind == "b":
        return False
    return [0, 0] if dtype.kind == "c" else 0


def chunk_codecs(compression: str, dtype: np.dtype, chunk_bytes: int = 0) -> list[dict]:
    """The zarr3 codecs of every chunk (of `chunk_bytes`) of a `dtype` array for
    `compression` (one of `COMPRESSIONS`).

    "auto" stores 2-byte and wider numbers bit-shuffled, then LZ4-compressed (blosc), plus a
    crc32c: on bfloat16 weights that is smaller than zstd level 1 (0.755 of the raw bytes
    against 0.780) for about half of zstd's CPU on top of the write, and reads back at about
    half of zstd's CPU too; on float32 it is smaller still (0.88 against 0.92). Byte-sized
    types (FP8, int8, bool) stay zstd: there bit-shuffling groups nothing, and LZ4 has no
    entropy coder (FP8 weights: 0.97 against zstd's 0.81). So do chunks over blosc's limit
    (`BLOSC_LARGEST_CHUNK`). Orbax, TensorStore and suture read all three (TensorStore
    decodes any zarr3 codec chain).

    Example:
        >>> [codec["name"] for codec in chunk_codecs("auto", np.dtype("float32"))]
        ['bytes', 'blosc', 'crc32c']
        >>> [codec["name"] for codec in chunk_codecs("auto", np.dtype("int8"))]
        ['bytes', 'zstd']
        >>> [codec["name"] for codec in chunk_codecs("none", np.dtype("float32"))]
        ['bytes', 'crc32c']
    """
    stored = {"name": "bytes", "configuration": {"endian": "little"}}
    checksum = {"name": "crc32c"}
    dtype = np.dtype(dtype)
    # a complex number shuffles as its two parts
    element = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
    if compression == "auto" and element >= 2 and chunk_bytes <= BLOSC_LARGEST_CHUNK:
        # clevel 5: zarr's long-time blosc default; for LZ4 it sets the block size, and
        # measured no larger and no slower than 1 or 9 here
        shuffled = {"cname": "lz4", "clevel": 5, "shuffle": "bitshuffle", "typesize": element}
        return [stored, {"name": "blosc", "configuration": {**shuffled, "blocksize": 0}}, checksum]
    if compression in ("auto", "zstd"):
        # zstd's own checksum (xxhash64 of the chunk) catches a damaged chunk as a crc32c
        # codec would, at 0.4 of its CPU (TensorStore's crc32c is not hardware-accelerated:
        # 2.5 ms against 6.1 ms on top of zstd's 26 ms per 16 MiB of bfloat16)
        return [stored, {"name": "zstd", "configuration": {"level": 1, "checksum": True}}]
    if compression == "none":  # the least CPU; for bfloat16 weights a third more than "auto"
        return [stored, checksum]
    raise ValueError(f"unknown compression {compression!r}")


def encoding_copies(codecs: list[dict]) -> int:
    """How many chunk-sized buffers TensorStore holds while it encodes a chunk: its copy of
    the chunk and the compressed bytes, and, for blosc, which compresses a whole chunk at
    once rather than as it streams, the chunk's bytes gathered before that (a 1 GiB stack
    written under a 128 MiB budget grew by 201 MiB with blosc where 192 were allowed)."""
    return 3 if any(codec["name"] == "blosc" for codec in codecs) else 2


class OrbaxArrayWriter:
    """One zarr3 array in the checkpoint's OCDBT database, written in blocks.

    A block (rows of the first axis, or positions of a stacking axis) is handed to
    TensorStore one chunk at a time: TensorStore holds what it is given and its compressed
    bytes (`encoding_copies`), so this keeps what it holds to that many chunks. On an object
    store (`together`) all of a block's chunks are handed over before any is waited for, so
    that they go up in the same OCDBT commit, side by side; TensorStore then holds the
    block's compressed bytes.
    """

    def __init__(
        self,
        opening: Any,
        chunk: tuple[int, ...],
        itemsize: int,
        rows: tuple[int, ...] = (),
        together: bool = False,
        copies: int = 2,
    ) -> None:
        self._opening, self._chunk, self._itemsize, self._rows = opening, chunk, itemsize, rows
        self._together = together  # a block's chunks handed over at once (object stores)
        self._copies = copies  # chunk-sized buffers TensorStore holds encoding one chunk

    @property
    def _store(self) -> Any:
        store = self._opening.result()  # opened before the blocks run (`OrbaxSink.opened`)
        for index in self._rows:
            store = store[index]
        return store

    def block_rows(self) -> int:
        return self._chunk[0] if self._chunk else 1

    def unit_along(self, axis: int) -> int | None:
        return self._chunk[axis] if axis < len(self._chunk) else None

    def held_while_writing(self, nbytes: int) -> int:
        chunk_bytes = math.prod(self._chunk) * self._itemsize
        if self._together:  # every chunk's compressed bytes, and one being compressed
            return nbytes + (self._copies - 1) * min(nbytes, chunk_bytes)
        return self._copies * min(nbytes, chunk_bytes)

    def row(self, index: int) -> OrbaxArrayWriter:
        """The writer of row `index` alone (its chunks are one row high)."""
        return OrbaxArrayWriter(
            self._opening,
            self._chunk[1:],
            self._itemsize,
            (*self._rows, index),
            self._together,
            self._copies,
        )

    def write(self, rows: slice, values: np.ndarray) -> None:
        self.write_along(0, rows, values)

    def write_along(self, axis: int, rows: slice, values: np.ndarray) -> None:
        store = self._store
        if not store.ndim:
            store.write(values).result()
            return
        start = rows.start or 0
        span = (slice(None),) * axis + (slice(start, start + values.shape[axis]),)
        _write_by_chunks(store[span].translate_to[0], values, self._chunk, self._together)


def _write_by_chunks(
    target: Any, values: np.ndarray, chunk: tuple[int, ...], together: bool = False
) -> None:
    """Writes `values` into `target` (of its shape, origin 0) one chunk at a time: cut along
    the first axis a chunk does not cover whole, each part cut further along the next one.

    `together`: every chunk is handed over before any is waited for, so that they share
    OCDBT commits (on an object store each commit costs round trips); TensorStore then
    holds all the block's compressed chunks at once.
    """
    pending: list[Any] = []
    failures: list[BaseException] = []
    try:
        _hand_over(target, values, chunk, pending, wait=not together)
    finally:  # TensorStore may read `values` until then: nothing reuses them before
        for future in pending:
            try:
                future.result()
            except Exception as error:  # noqa: BLE001 (the first one is raised below)
                failures.append(error)
    if failures:
        raise failures[0]


def _hand_over(
    target: Any, values: np.ndarray, chunk: tuple[int, ...], pending: list[Any], wait: bool
) -> None:
    cut = [axis for axis, length in enumerate(chunk) if length < values.shape[axis]]
    if not cut:
        # The block is not touched until the write is committed, so TensorStore may encode
        # straight from it instead of copying it first.
        future = target.write(values, can_reference_source_data_indefinitely=True)
        if wait:
            future.result()
        else:
            pending.append(future)
        return
    axis, extent = cut[0], values.shape[cut[0]]
    for start in range(0, extent, chunk[axis]):
        part = (slice(None),) * axis + (slice(start, min(start + chunk[axis], extent)),)
        _hand_over(target[part].translate_to[0], values[part], chunk, pending, wait)


class OrbaxShardWriter:
    """One shard of a globally sharded jax.Array: its chunks, written whole."""

    def __init__(self, opening: Any, index: tuple[slice, ...], copies: int = 2) -> None:
        self._opening, self.index, self._copies = opening, index, copies

    def block_rows(self) -> int:
        return 1

    def held_while_writing(self, nbytes: int) -> int:
        return self._copies * nbytes  # TensorStore's copy of the shard, its encoded bytes

    def write(self, rows: slice, values: np.ndarray) -> None:
        store = self._opening.result()
        target = store[self.index] if store.ndim else store
        target.write(values).result()


class OrbaxSink:
    """Collects a checkpoint's leaves; `start` marks it begun, `finish` writes its metadata.

    `folder` is a `Location` (or a local `Path`): a local folder, or a ``gs://``/``s3://``
    prefix written through TensorStore's kvstore driver.
    """

    def __init__(
        self,
        folder: Location | Path,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        process: int | None = None,
        chunk_of: Any = None,
        compression: str = DEFAULT_COMPRESSION,
    ) -> None:
        import tensorstore as ts  # heavy: loaded on first use, not at import

        self.folder = location_of(folder)
        # Under jax.distributed each process writes its own database (merged by `merge`).
        self._database = (
            self.folder if process is None else self.folder / f"{PROCESS_PREFIX}{process}"
        )
        self.chunk_bytes = chunk_bytes
        if compression not in COMPRESSIONS:
            raise ValueError(f"unknown compression {compression!r}")
        self._compression = compression
        # ``chunk_of(path, array)``: a chunk of the caller's choosing (None: the default),
        # e.g. one that tiles the array's shards on a target mesh (`suture._save.mesh`)
        self._chunk_of = chunk_of
        self._entries: dict[str, dict] = {}
        self._strings: dict[str, str] = {}
        self._names = OrbaxNames()
        self._openings: list[Any] = []  # TensorStore futures of the arrays being created
        self._tree_written = False  # `_METADATA` and `_strings.json` (`write_tree`)
        # Chunks are not fsync'd one by one (TensorStore's default): that stalls each writing
        # thread on the disk. `sync` makes everything durable once, before publication.
        self._context = ts.Context(
            {
                "file_io_concurrency": {"limit": 64},
                "file_io_sync": False,
                # On a bucket, commits run one after another and every block's write waits
                # for its commit: the writes get request slots of their own, instead of
                # queueing behind the reads of the blocks in flight (a stack's members and
                # a long range's parts, a hundred at once).
                **(WRITE_RESOURCES if self.folder.is_remote else {}),
            },
            parent=remote_context() if self.folder.is_remote else None,
        )
        self._started = time.time_ns()
        # An OCDBT commit writes its new data in one file, on one connection, and commits
        # run one after another: on a bucket, files of a few MiB go up side by side.
        self._data_files = (
            {"target_data_file_size": REMOTE_DATA_FILE_BYTES} if self.folder.is_remote else {}
        )
        self._dropper: writeback.DropBehind | None = None
        self._synced: set[tuple[int, ...]] = set()  # files the dropper made durable

    def start(self) -> None:
        """Creates the folder with a ``_CHECKPOINT_METADATA`` recording a start, no commit.

        Until `finish` records the commit, suture and Orbax see the folder as unfinished
        (this matters on object stores, where the folder is written in place).
        """
        if isinstance(self.folder, LocalLocation):
            self.folder.path.mkdir()
        _write_json(self.folder / "_CHECKPOINT_METADATA", self._checkpoint_metadata(None, None))

    def _checkpoint_metadata(self, committed: int | None, custom: dict | None) -> dict:
        return {
            "item_handlers": _HANDLER,
            "metrics": {},
            "performance_metrics": {},
            "init_timestamp_nsecs": self._started,
            "commit_timestamp_nsecs": committed,
            "custom_metadata": custom or {},
        }

    def add_array(
        self, keys: tuple[str, ...], kinds: tuple[int, ...], array: LazyArray
    ) -> OrbaxArrayWriter:
        chosen = self._chunk_of("/".join(keys), array) if self._chunk_of else None
        chunk = chosen if chosen is not None else _chunk_shape(array, self.chunk_bytes)
        itemsize = np.dtype(array.dtype).itemsize
        codecs = self._codecs(array, chunk)
        return OrbaxArrayWriter(
            self._open(keys, kinds, array, chunk, codecs),
            chunk,
            itemsize,
            together=self.folder.is_remote,
            copies=encoding_copies(codecs),
        )

    def add_sharded(
        self, keys: tuple[str, ...], kinds: tuple[int, ...], global_array: Any
    ) -> list[Block]:
        """Blocks writing this process's shards of a jax.Array (those with replica_id 0).

        Chunks follow the shards (their first axis split further to fit `chunk_bytes`), so
        no chunk is written by two processes.
        """
        path = "/".join(keys)
        array = LazyArray.from_array(global_array, path=path)  # shape and dtype only
        chunk = _shard_chunk_shape(global_array, self.chunk_bytes)
        codecs = self._codecs(array, chunk)
        store = self._open(keys, kinds, array, chunk, codecs)
        copies = encoding_copies(codecs)
        blocks = []
        for shard in global_array.addressable_shards:
            if shard.replica_id != 0:
                continue
            data = LazyArray.from_array(shard.data, path=path)
            writer = OrbaxShardWriter(store, shard.index, copies)
            blocks.append(Block(path, data, writer, slice(None), copies * data.nbytes))
        return blocks

    def _codecs(self, array: LazyArray, chunk: tuple[int, ...]) -> list[dict]:
        itemsize = np.dtype(array.dtype).itemsize
        return chunk_codecs(self._compression, array.dtype, math.prod(chunk) * itemsize)

    def _open(
        self,
        keys: tuple[str, ...],
        kinds: tuple[int, ...],
        array: LazyArray,
        chunk: tuple[int, ...],
        codecs: list[dict],
    ) -> Any:
        import tensorstore as ts  # heavy: loaded on first use, not at import

        name = ".".join(keys)
        value_type = "scalar" if array.stored_as == "scalar" else "np.ndarray"
        self._add_entry(keys, kinds, value_type)
        spec = {
            "driver": "zarr3",
            "kvstore": {
                "driver": "ocdbt",
                "base": self._database.resolve().kvstore_spec(),
                "path": name,
                **self._data_files,
            },
            "metadata": {
                "shape": list(array.shape),
                "data_type": _zarr_dtype(array.dtype, keys),
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk)}},
                "codecs": codecs,
                "fill_value": _fill_value(array.dtype),
            },
            "create": True,
            # Orbax readers expect every chunk, zeros included (its _METADATA says so below).
            "store_data_equal_to_fill_value": True,
        }
        # Opened together, the arrays' creations share OCDBT commits (one each is a few
        # round trips on a bucket); `opened` waits for them all.
        with native_call():  # an interrupt between the two would lose the creation going on
            opening = ts.open(spec, context=self._context)
            self._openings.append(opening)
        return opening

    def opened(self) -> None:
        """Waits until every array added so far is created (all of them, also when one
        failed: its error is raised once none goes on writing into the folder)."""
        failures = []
        with native_call():  # interrupted, the opens would go on writing into the folder
            for opening in self._openings:
                try:
                    opening.result()
                except Exception as error:  # each creation waited for, failed or not
                    failures.append(error)
        if failures:
            raise failures[0]

    def add_value(
        self, keys: tuple[str, ...], kinds: tuple[int, ...], value: Any
    ) -> LazyArray | None:
        """Records a non-array leaf; returns a 0-d array to write for a Python number."""
        name = ".".join(keys)
        if value is None:
            self._add_entry(keys, kinds, "None", skip_deserialize=True)
            return None
        if isinstance(value, str):
            self._add_entry(keys, kinds, "string")
            self._strings[name] = value
            return None
        if isinstance(value, (bool, int, float)):
            scalar = LazyArray.from_array(np.asarray(value), path="/".join(keys))
            scalar.stored_as = "scalar"
            return scalar
        raise UnsupportedError(
            f"Leaf {'/'.join(keys)!r} is a {type(value).__name__}, which an Orbax checkpoint "
            f"cannot hold. Drop it (rules.drop) or turn it into an array, a number or a string."
        )

    def _add_entry(
        self,
        keys: tuple[str, ...],
        kinds: tuple[int, ...],
        value_type: str,
        skip_deserialize: bool = False,
    ) -> None:
        self._names.add(keys)
        self._entries[str(keys)] = {
            "key_metadata": [
                {"key": key, "key_type": kind} for key, kind in zip(keys, kinds, strict=True)
            ],
            "value_metadata": {"value_type": value_type, "skip_deserialize": skip_deserialize},
        }

    def drop_behind(self, nbytes: int) -> None:
        """Writes back and drops from the page cache each data file once written, when the
        blocks to write hold `nbytes` of `DROP_BEHIND_BYTES` or more (local folders on
        Linux): the cache then reuses its pages instead of growing by the whole output
        (see `suture._location.writeback`). Stopped by `sync` and `finish`."""
        if (
            nbytes >= DROP_BEHIND_BYTES
            and isinstance(self._database, LocalLocation)
            and writeback.available()
            and self._dropper is None
        ):
            self._dropper = writeback.DropBehind(self._database.path / DATA_FOLDER)

    def _stop_dropping(self) -> None:
        if self._dropper is not None:
            self._dropper.stop()
            self._synced |= self._dropper.synced
            self._dropper = None

    def sync(self) -> None:
        """Makes this sink's database durable: fsyncs its files and folders (local only;
        an object store has nothing to sync)."""
        self._stop_dropping()
        if isinstance(self._database, LocalLocation):
            fsync_tree(self._database.path, self._synced)

    def settle(self) -> None:
        """Before an abort that skips `finish`: stops dropping written files from the page
        cache and waits for the arrays still being created (on a bucket the blocks run
        meanwhile), so that nothing of this sink outlives the abort."""
        self._stop_dropping()
        self.opened()

    def write_tree(self) -> None:
        """Writes `_METADATA` and `_strings.json` once every leaf is added: written while
        the arrays are being created (`opened` waits for those), they cost no round trip
        of their own on a bucket, and `finish` has one file less to write. The folder stays
        unfinished until `finish` records the commit."""
        metadata = {
            "tree_metadata": self._entries,
            "use_ocdbt": True,
            "use_zarr3": True,
            "store_array_data_equal_to_fill_value": True,
            "custom_metadata": None,
        }
        _write_json(self.folder / "_METADATA", metadata)
        if self._strings:
            _write_json(self.folder / "_strings.json", self._strings)
        self._tree_written = True

    def finish(self, custom_metadata: dict | None = None) -> None:
        """Writes `_METADATA` and `_strings.json` (unless `write_tree` did) and
        `_CHECKPOINT_METADATA`, then fsyncs the whole checkpoint (so that it is durable
        before it is published)."""
        self.settle()  # on a bucket the blocks ran while the arrays were being created
        if not self._tree_written:
            self.write_tree()
        _write_json(
            self.folder / "_CHECKPOINT_METADATA",
            self._checkpoint_metadata(time.time_ns(), custom_metadata),
        )
        if isinstance(self.folder, LocalLocation):
            fsync_tree(self.folder.path, self._synced)


def merge_process_databases(folder: Location | Path) -> None:
    """Merges the per-process databases under `folder` into its root database, as Orbax does.

    Only the databases' indexes are copied (in one atomic transaction); the data files stay
    in the process folders, which the merged root refers to. `folder` is local or a
    ``gs://``/``s3://`` prefix.
    """
    import tensorstore as ts  # heavy: loaded on first use, not at import

    folder = location_of(folder).resolve()
    context = ts.Context({}, parent=remote_context() if folder.is_remote else None)

    def database(where: Location) -> Any:
        return ts.KvStore.open({"driver": "ocdbt", "base": where.kvstore_spec()}, context=context)

    names = [name for name in folder.subfolders() if name.startswith(PROCESS_PREFIX)]
    children = [database(folder / name) for name in sorted(names)]
    root = database(folder).result()
    transaction = ts.Transaction(atomic=True)
    copies = [
        child.result().experimental_copy_range_to(root.with_transaction(transaction))
        for child in children
    ]
    for copy in copies:
        copy.result()
    transaction.commit_async().result()


def _shard_chunk_shape(global_array: Any, chunk_bytes: int) -> tuple[int, ...]:
    """A shard's shape, its first axis cut to a divisor that keeps a chunk under `chunk_bytes`."""
    shard = tuple(global_array.sharding.shard_shape(global_array.shape))  # jax shards evenly
    if not shard:
        return ()
    rows = chunk_rows(shard, np.dtype(global_array.dtype).itemsize, chunk_bytes)
    while shard[0] % rows:
        rows -= 1
    return tuple(max(1, length) for length in (rows, *shard[1:]))


def _write_json(path: Location, value: Any) -> None:
    path.write_bytes(json.dumps(value).encode())


def _zarr_dtype(dtype: np.dtype, keys: tuple[str, ...]) -> str:
    if dtype.kind == "b":
        return "bool"
    if _zarr3_stores(dtype.name):
        return dtype.name
    raise UnsupportedError(
        f"Leaf {'/'.join(keys)!r} has dtype {dtype}, which TensorStore's zarr3 driver (Orbax's "
        f"format) cannot store. Cast it to a dtype Orbax writes (float8_e4m3fn, bfloat16, "
        f"float32 ...: --dtype), or write safetensors (--format safetensors)."
    )


@functools.cache
def _zarr3_stores(name: str) -> bool:
    """Whether TensorStore's zarr3 driver takes the dtype `name` (ml_dtypes has more than it
    writes: float8_e4m3 and float6 are not among them), asked of an array in memory."""
    import tensorstore as ts  # heavy: loaded on first use, not at import

    grid = {"name": "regular", "configuration": {"chunk_shape": [1]}}
    spec = {"shape": [1], "data_type": name, "chunk_grid": grid}
    try:
        ts.open(
            {"driver": "zarr3", "kvstore": "memory://", "metadata": spec, "create": True}
        ).result()
    except ValueError:
        return False
    return True


def _chunk_shape(array: LazyArray, chunk_bytes: int) -> tuple[int, ...]:
    """The chunk of `array`: whole trailing axes while they fit `chunk_bytes`, then as many
    as fit along the next axis, and 1 along the axes before it (so a row longer than a
    chunk is cut along its own axes). A stacked array gets one member per chunk.

    A transposed matrix (MaxText's `logits_dense`, HF's `lm_head` turned around) is cut into
    tiles instead: a quarter of its rows (`TILE_ROW_PARTS`) by as many columns as fit. Chunks
    of whole rows would each be a column strip of the source, whose every row a block of them
    reads, so blocks of rows would read the source many times over (or run alone, as one
    block of the whole budget); a block of tile columns holds every row of a few source rows,
    and reads them once. A quarter, not all, of the rows: a restore that splits the rows over
    a mesh (fsdp) reads about as much beyond its shard as from chunks of whole rows.
    """
    if array.ndim == 0:
        return ()
    shape = [max(1, length) for length in array.shape]
    stacked = stack_axis(array.node)
    if stacked is not None:
        shape[stacked] = 1
    by_rows = _chunk_from_last_axis(shape, array.dtype.itemsize, chunk_bytes)
    if stacked is None and len(shape) >= 2 and by_rows[0] < shape[0]:
        rows = _even_length(shape[0], -(-shape[0] // TILE_ROW_PARTS))
        inner = array.dtype.itemsize * rows * math.prod(shape[1:-1])
        columns = _even_length(shape[-1], max(1, chunk_bytes // inner))
        if (
            inner <= chunk_bytes
            and rereads(array, 0, by_rows[0])
            and not rereads(array, len(shape) - 1, columns)
        ):
            return (rows, *shape[1:-1], columns)
    return by_rows


TILE_ROW_PARTS = 4  # a transposed matrix's tiles: this many along its rows (`_chunk_shape`)


def _chunk_from_last_axis(shape: list[int], itemsize: int, chunk_bytes: int) -> tuple[int, ...]:
    """Whole trailing axes while they fit `chunk_bytes`, then as many as fit along the next."""
    chunk = [1] * len(shape)
    inner = itemsize
    for axis in reversed(range(len(shape))):
        if inner * shape[axis] > chunk_bytes:
            chunk[axis] = _even_length(shape[axis], max(1, chunk_bytes // inner))
            break
        chunk[axis] = shape[axis]
        inner *= shape[axis]
    return tuple(chunk)


def _even_length(length: int, most: int) -> int:
    """A chunk's length along an axis of `length` cut into chunks of at most `most`: a
    divisor of `length` where one is at least half of `most`, else chunks of nearly equal
    lengths.

    A chunk that the array's end cuts short is padded to its whole shape in the file, and
    TensorStore copies what is written into it into a fresh buffer of that shape before
    encoding (a chunk written whole is encoded straight from the block): the (2048, 7168)
    expert weights of DeepSeek-V3 in chunks of 1170 rows encoded 14 % of padding and
    copied a third of their bytes.

    Example:
        >>> _even_length(2048, 1170), _even_length(7168, 4096), _even_length(11, 4)
        (1024, 3584, 4)
    """
    count = -(-length // most)
    for pieces in range(count, 2 * count + 1):
        if length % pieces == 0:
            return length // pieces
    return -(-length // count)


def keys_and_kinds(tree: Any) -> list[tuple[tuple[str, ...], tuple[int, ...], Any]]:
    """``(keys, key kinds, leaf)`` for every leaf: kind 1 for a list/tuple index, else 2."""
    found: list[tuple[tuple[str, ...], tuple[int, ...], Any]] = []

    def visit(node: Any, keys: tuple[str, ...], kinds: tuple[int, ...]) -> None:
        items = children(node)
        if items is None:
            found.append((keys, kinds, node))
            return
        kind = (
            _SEQUENCE_KEY
            if isinstance(node, (list, tuple)) and not is_namedtuple(node)
            else _DICT_KEY
        )
        for key, child in items:
            visit(child, (*keys, key), (*kinds, kind))

    visit(tree, (), ())
    return found
