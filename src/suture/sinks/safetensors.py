"""Writing safetensors files tensor by tensor, block by block, as the safetensors library reads them.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's
dtype, shape and byte range; ``__metadata__``), padded with spaces to 8 bytes, then the
tensors' bytes back to back. All shapes and dtypes are known before any data is read, so the
header is written first and each block of rows goes straight to its place in the file
(positional writes: several blocks can be written at once). Nothing is held beyond the
blocks in flight.

Output is one file, or a folder laid out as Hugging Face's ``save_pretrained`` lays it out:
``model.safetensors``, or shards ``model-00001-of-00003.safetensors`` ... with
``model.safetensors.index.json`` (``metadata.total_size`` and ``weight_map``).
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import ArgumentError, UnsupportedError
from .._lazy.array import LazyArray
from .names import check_safetensors_name, check_shard_file_name

SAFETENSORS_DTYPES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e8m0fnu": "F8_E8M0",
    "complex64": "C64",
}
INDEX_NAME = "model.safetensors.index.json"
MAX_HEADER_BYTES = 100 << 20  # the safetensors library refuses larger headers
SINGLE_NAME = "model.safetensors"


class SafetensorsTensorWriter:
    """One tensor's byte range in an open file, written in blocks of rows."""

    def __init__(self, descriptor: int, offset: int, array: LazyArray) -> None:
        self._descriptor, self._offset, self._array = descriptor, offset, array
        self._row_bytes = (
            array.nbytes // array.shape[0] if array.ndim and array.shape[0] else array.nbytes
        )

    def block_rows(self) -> int:
        return 1

    def held_while_writing(self, nbytes: int) -> int:
        return 0  # written straight from the block (positional writes)

    def row(self, index: int) -> SafetensorsTensorWriter:
        """The writer of row `index` alone: its bytes, in blocks of the row's own rows."""
        return SafetensorsTensorWriter(
            self._descriptor, self._offset + index * self._row_bytes, self._array[index]
        )

    def write(self, rows: slice, values: np.ndarray) -> None:
        start = rows.start or 0
        data = np.ascontiguousarray(values)
        if data.dtype.byteorder == ">":
            data = data.astype(data.dtype.newbyteorder("<"))
        raw = memoryview(data.reshape(-1).view(np.uint8))  # bytes, whatever the dtype
        write_fully(self._descriptor, raw, self._offset + start * self._row_bytes)


def write_fully(descriptor: int, data: memoryview, offset: int) -> None:
    """`os.pwrite` until every byte is written; a write of nothing means the disk is full."""
    while len(data):
        written = os.pwrite(descriptor, data, offset)
        if written == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        data, offset = data[written:], offset + written


@dataclass
class _Shard:
    filename: str
    names: list[str]
    arrays: list[LazyArray]

    @property
    def nbytes(self) -> int:
        return sum(array.nbytes for array in self.arrays)


class SafetensorsSink:
    """Lays tensors out in one file or in a folder; `open_writers` creates the files.

    `folder` False writes one file; True writes a Hugging Face folder: ``model.safetensors``,
    or shards and their index when `max_shard_size` or `shard_map` splits the tensors.
    """

    def __init__(
        self,
        tensors: dict[str, LazyArray],
        max_shard_size: int | None,
        metadata: dict[str, str] | None,
        shard_map: dict[str, str] | None = None,
        folder: bool = True,
    ) -> None:
        for name, array in tensors.items():
            check_safetensors_name(name)
            if array.dtype.name not in SAFETENSORS_DTYPES:
                raise UnsupportedError(
                    f"Tensor {name!r} has dtype {array.dtype.name}, which safetensors cannot store. "
                    f"Cast it (rules.cast) to one of: {', '.join(sorted(SAFETENSORS_DTYPES))}."
                )
        if metadata is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise ArgumentError("safetensors metadata must map strings to strings.")
        self.metadata = metadata
        self.folder = folder
        if shard_map:
            self.shards = _shards_from_map(tensors, shard_map)
        else:
            self.shards = _assign_shards(tensors, max_shard_size)
        if not folder and len(self.shards) > 1:
            raise ArgumentError(
                f"The tensors need {len(self.shards)} shard files, but the output is one "
                f"'.safetensors' file. Give a folder path (a name without '.safetensors') to "
                f"write shards and their index, or leave out max_shard_size."
            )
        self._descriptors: list[int] = []

    def open_writers(
        self, destination: Path, only: set[str] | None = None, index: bool = True
    ) -> dict[str, SafetensorsTensorWriter]:
        """Creates the file(s): `destination` itself, or files in the folder `destination`.

        `only`: create just these shard files (under jax.distributed each process writes
        its share of the shards); `index`: write the folder's index (one process does).
        """
        writers = {}
        if self.folder:
            destination.mkdir(exist_ok=only is not None)
        for shard in self.shards:
            if only is not None and shard.filename not in only:
                continue
            file_path = destination / shard.filename if self.folder else destination
            header = _header(shard, self.metadata)
            descriptor = os.open(file_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            self._descriptors.append(descriptor)
            write_fully(descriptor, memoryview(len(header).to_bytes(8, "little") + header), 0)
            os.ftruncate(descriptor, 8 + len(header) + shard.nbytes)
            offset = 8 + len(header)
            for name, array in zip(shard.names, shard.arrays, strict=True):
                writers[name] = SafetensorsTensorWriter(descriptor, offset, array)
                offset += array.nbytes
        if (
            index
            and self.folder
            and (len(self.shards) > 1 or self.shards[0].filename != SINGLE_NAME)
        ):
            index = {
                "metadata": {"total_size": sum(shard.nbytes for shard in self.shards)},
                "weight_map": {
                    name: shard.filename for shard in self.shards for name in shard.names
                },
            }
            (destination / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        return writers

    def close(self, sync: bool = True) -> None:
        for descriptor in self._descriptors:
            if sync:
                os.fsync(descriptor)
            os.close(descriptor)
        self._descriptors.clear()


def _assign_shards(tensors: dict[str, LazyArray], max_shard_size: int | None) -> list[_Shard]:
    groups: list[list[tuple[str, LazyArray]]] = [[]]
    size = 0
    for name, array in tensors.items():
        if max_shard_size is not None and groups[-1] and size + array.nbytes > max_shard_size:
            groups.append([])
            size = 0
        groups[-1].append((name, array))
        size += array.nbytes
    if len(groups) == 1:
        return [_Shard(SINGLE_NAME, [n for n, _ in groups[0]], [a for _, a in groups[0]])]
    count = len(groups)
    return [
        _Shard(
            f"model-{i:05d}-of-{count:05d}.safetensors",
            [n for n, _ in group],
            [a for _, a in group],
        )
        for i, group in enumerate(groups, 1)
    ]


def _shards_from_map(tensors: dict[str, LazyArray], shard_map: dict[str, str]) -> list[_Shard]:
    """Shards as `shard_map` (name -> file) lays them out; unmapped tensors join the last file."""
    files: dict[str, _Shard] = {}
    for filename in shard_map.values():
        check_shard_file_name(filename)
        files.setdefault(filename, _Shard(filename, [], []))
    last = list(files.values())[-1]
    for name, array in tensors.items():
        shard = files.get(shard_map.get(name, ""), last)
        shard.names.append(name)
        shard.arrays.append(array)
    return [shard for shard in files.values() if shard.names]


def _header(shard: _Shard, metadata: dict[str, str] | None) -> bytes:
    entries: dict[str, Any] = {}
    if metadata:
        entries["__metadata__"] = metadata
    offset = 0
    for name, array in zip(shard.names, shard.arrays, strict=True):
        entries[name] = {
            "dtype": SAFETENSORS_DTYPES[array.dtype.name],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    header = json.dumps(entries, separators=(",", ":")).encode()
    if len(header) > MAX_HEADER_BYTES:
        raise UnsupportedError(
            f"The safetensors header of {shard.filename} would be {len(header):,} bytes; the "
            f"safetensors library reads at most {MAX_HEADER_BYTES:,}. Shorten the tensor names, "
            f"or shard the output (max_shard_size)."
        )
    return header + b" " * (-len(header) % 8)
