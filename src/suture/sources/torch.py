"""PyTorch state dicts (``torch.save`` files: ``.bin``, ``.pt``, ``.pth``), behind ``allow_pickle``.

A PyTorch file is a pickle, and unpickling can run code, so it is opened only with
``allow_pickle=True`` (CLI ``--allow-pickle``), and then with ``weights_only=True``, PyTorch's
restricted unpickler. Tensor names split into tree paths on a separator, as for safetensors.
Needs the ``torch`` extra.

A zip file (what ``torch.save`` writes) is unpickled onto the meta device, which reads no
data, only each tensor's shape and the place of its storage's record. Every record is
checked against its storage (uncompressed, exactly the bytes the storage needs, before the
next entry) and each tensor is then read from its record like a safetensors tensor, just
the rows a view needs. A compressed record (``torch.save`` never writes one) is inflated up
to the end of the tensor at each read. A legacy file (``_use_new_zipfile_serialization=False``)
has no records, and torch cannot unpickle onto meta a file written in the other byte order:
such files are read whole into memory by ``torch.load``, which checks them itself.
Each storage is matched to the record whose data starts where torch places it; a file whose
storages start elsewhere (its zip written again) is read whole by ``torch.load`` as well.
"""

from __future__ import annotations

import math
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .._dtypes import to_dtype
from .._errors import (
    ArgumentError,
    CorruptCheckpointError,
    UnsupportedError,
)
from .._lazy.array import LazyArray
from .._lazy.graph import Node, ReadCost, SourceNode
from .._lazy.selection import Selection, outer_index, selection_shape
from .._location import LocalLocation
from .._paths import iter_leaves
from .checkpoint import Checkpoint
from .filesource import FileRangeSource, local_identity
from .names import tree_of_paths, tree_path_of
from .zip_entries import data_ends, data_start

# numpy has no such dtypes: their raw bits move through an integer of the same size
_VIEWED = {
    "bfloat16": "int16",
    "float8_e4m3fn": "uint8",
    "float8_e5m2": "uint8",
    "float8_e4m3fnuz": "uint8",
    "float8_e5m2fnuz": "uint8",
    "float8_e8m0fnu": "uint8",
}
_NATIVE = {"bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64"}
_NATIVE |= {"float16", "float32", "float64", "complex64", "complex128"}


class TorchTensorSource(SourceNode):
    """A CPU tensor of a file read whole (in memory), read as a numpy array."""

    def __init__(self, tensor: Any, dtype: np.dtype, path: str, origin: str) -> None:
        self.tensor, self.dtype = tensor.detach(), dtype  # a Parameter refuses .numpy()
        self.shape = tuple(int(n) for n in tensor.shape)
        self.path, self.origin = path, origin

    def read(self, selection: Selection) -> np.ndarray:
        import torch  # heavy: loaded on first use, not at import

        tensor = self.tensor.contiguous()
        if self.dtype.name in _VIEWED:  # numpy has no such dtype: move the raw bits
            array = tensor.view(getattr(torch, _VIEWED[self.dtype.name])).numpy().view(self.dtype)
        else:
            array = tensor.numpy()
        return np.array(outer_index(array, selection), copy=True)

    def inputs(self) -> tuple[Node, ...]:
        return ()


class TorchRecordSource(SourceNode):
    """A tensor that is not a C-contiguous run of an uncompressed record: a strided view
    (a transpose), or in a compressed record. Each read takes the bytes from the view's
    first element to its last (memory-mapped, or inflated), then picks the selection."""

    def __init__(self, record: _Record, view: _View, dtype: np.dtype, path: str) -> None:
        self.record, self.view, self.dtype = record, view, dtype
        self.shape = view.shape
        self.path, self.origin = path, str(record.file)

    def read_cost(self, selection: Selection, into: bool = False) -> ReadCost:
        selected = math.prod(selection_shape(selection)) * self.dtype.itemsize
        if not self.record.compressed:
            return ReadCost(selected, selected)
        spanned = self.view.span * self.dtype.itemsize  # inflated whole, whatever the selection
        return ReadCost(spanned, spanned + selected)

    def read(self, selection: Selection) -> np.ndarray:
        if self.view.span == 0:
            return np.empty(selection_shape(selection), self.dtype)
        start = self.view.offset * self.dtype.itemsize
        raw = self.record.read(start, self.view.span * self.dtype.itemsize, self.path)
        array = np.lib.stride_tricks.as_strided(
            raw.view(self.dtype),
            self.view.shape,
            tuple(step * self.dtype.itemsize for step in self.view.stride),
            writeable=False,
        )
        return np.array(outer_index(array, selection), copy=True)

    def inputs(self) -> tuple[Node, ...]:
        return ()


class _View:
    """Where a tensor lies in its storage, in elements: offset, shape, strides, and span
    (from its first element to its last, inclusive; 0 when it has none)."""

    def __init__(self, tensor: Any) -> None:
        self.offset = int(tensor.storage_offset())
        self.shape = tuple(int(n) for n in tensor.shape)
        self.stride = tuple(int(step) for step in tensor.stride())
        reach = sum((n - 1) * step for n, step in zip(self.shape, self.stride, strict=True))
        self.span = 0 if 0 in self.shape else 1 + reach


class _Record:
    """A storage's entry in the zip: where its data starts and must end, how it is stored."""

    def __init__(self, file: LocalLocation, info: zipfile.ZipInfo, data: int, end: int) -> None:
        self.file, self.info, self.data, self.end = file, info, data, end
        self.compressed = info.compress_type != zipfile.ZIP_STORED

    def read(self, start: int, count: int, name: str) -> np.ndarray:
        """Bytes ``[start, start + count)`` of the record."""
        try:
            if not self.compressed:
                return np.memmap(self.file.path, np.uint8, "r", self.data + start, (count,))
            with zipfile.ZipFile(self.file.path) as archive, archive.open(self.info) as stream:
                _skip(stream, start)
                raw = stream.read(count)
                if start + count == self.info.file_size and stream.read(1):  # checks the CRC
                    raise ValueError("it holds more than it declares")
            if len(raw) != count:
                raise ValueError(f"it ends {count - len(raw)} bytes early")
            return np.frombuffer(raw, np.uint8)
        except Exception as error:  # zipfile, zlib and mmap raise many kinds on damage
            raise CorruptCheckpointError(
                f"Tensor {name!r} of {str(self.file)!r} cannot be read from its record "
                f"{self.info.filename!r}: {error}. The file is damaged or was changed after "
                f"it was opened."
            ) from error


def _skip(stream: Any, count: int) -> None:
    """Inflates and drops `count` bytes, a piece at a time."""
    while count > 0:
        piece = stream.read(min(count, 1 << 20))
        if not piece:
            raise ValueError("it ends before the tensor's first element")
        count -= len(piece)


def open_torch(path: Path, allow_pickle: bool, separator: str = ".") -> Checkpoint:
    if not allow_pickle:
        raise ArgumentError(
            f"{str(path)!r} is a PyTorch pickle; unpickling can run code hidden in the file. "
            f"Open it only if you trust it, with allow_pickle=True (CLI: --allow-pickle), or "
            f"convert it to safetensors first."
        )
    try:
        import torch  # heavy: loaded on first use, not at import
    except ImportError as error:
        raise UnsupportedError(
            "Reading PyTorch files needs the torch extra: pip install 'suture[torch]'."
        ) from error
    records = _records(LocalLocation(path)) if _is_zip(path) else None
    state = _load(torch, path, "meta" if records is not None else "cpu")
    storages = _storage_records(state, records) if records is not None else None
    if records is not None and storages is None:  # places that start no record: torch maps them
        state = _load(torch, path, "cpu")
    flat: dict[str, Any] = {}
    named: dict[str, str] = {}
    for keys, value in iter_leaves(state):
        name = separator.join(keys)
        tree_path = tree_path_of(name, separator, named, path)
        if isinstance(value, torch.Tensor):
            value = _leaf(value, name, tree_path, path, storages)
        flat[tree_path] = value
    tree = tree_of_paths(flat, separator, path)
    return Checkpoint(tree, location=str(path), format="torch")


def _is_zip(path: Path) -> bool:
    """Whether `path` starts as a zip does (how torch tells its two formats apart)."""
    try:
        with open(path, "rb") as file:
            return file.read(4) == b"PK\x03\x04"
    except OSError as error:
        raise CorruptCheckpointError(f"Cannot read {str(path)!r}: {error}.") from error


def _load(torch: Any, path: Path, device: str) -> Any:
    """The unpickled file; onto "meta", it holds shapes and record places but reads no data.
    Onto "cpu" (a legacy file, or one in the other byte order) it is read whole."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except Exception as error:  # torch raises many kinds on damaged or unsafe input
        raise CorruptCheckpointError(
            f"{str(path)!r} could not be loaded as a PyTorch state dict with weights_only=True: "
            f"{type(error).__name__}: {error}."
        ) from error


def _leaf(
    tensor: Any,
    name: str,
    tree_path: str,
    path: Path,
    storages: dict[int, _Record] | None,
) -> LazyArray:
    """`tensor` as a lazy array: read from its storage's record (`storages`, by the place
    torch gave it on meta), or from memory where the file was read whole (None)."""
    where = f"Tensor {name!r} of {str(path)!r}"
    dtype = _dtype(tensor, where)
    if storages is None:  # a file read whole: the tensor is in memory
        if tensor.device.type != "cpu":
            raise _no_data(where, tensor)
        return LazyArray(TorchTensorSource(tensor, dtype, tree_path, str(path)), path=tree_path)
    storage = tensor.untyped_storage()
    # torch.load onto meta set the place (private); `_storage_records` matched every one
    record = _checked_record(storages[storage._checkpoint_offset], storage.nbytes(), where)
    view = _View(tensor)
    if view.offset + view.span > storage.nbytes() // dtype.itemsize:
        raise CorruptCheckpointError(
            f"{where} reaches element {view.offset + view.span} of a storage of "
            f"{storage.nbytes()} bytes. The file is damaged or hostile."
        )
    if record.compressed or not tensor.is_contiguous():
        source: SourceNode = TorchRecordSource(record, view, dtype, tree_path)
    else:
        start = record.data + view.offset * dtype.itemsize
        identity = local_identity(record.file)
        source = FileRangeSource(record.file, start, view.shape, dtype, tree_path, identity)
    return LazyArray(source, path=tree_path)


def _dtype(tensor: Any, where: str) -> np.dtype:
    """The numpy dtype of a dense tensor; sparse tensors and dtypes numpy lacks are refused."""
    import torch  # heavy: loaded on first use, not at import

    if tensor.layout != torch.strided:
        raise UnsupportedError(
            f"{where} is a sparse tensor ({str(tensor.layout).removeprefix('torch.')}); suture "
            f"reads dense tensors only. In torch, save it as tensor.to_dense()."
        )
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in _NATIVE and name not in _VIEWED:
        raise UnsupportedError(
            f"{where} has dtype {name}, which suture cannot read as a numpy array. In torch, "
            f"cast it to a dtype numpy holds (complex32 to tensor.to(torch.complex64), others "
            f"to torch.float32) and save it again."
        )
    return to_dtype(name)


def _no_data(where: str, tensor: Any) -> UnsupportedError:
    return UnsupportedError(
        f"{where} holds no data: it was saved on the {tensor.device.type} device, which keeps "
        f"its shape {tuple(tensor.shape)} but no values. Save it from a real device (after "
        f"materializing it, e.g. with model.to_empty(device='cpu') and loading weights)."
    )


def _records(file: LocalLocation) -> dict[str, _Record] | None:
    """Every entry of the zip by name, each to end before the next entry's header. None for
    a file written in the other byte order: torch's load onto meta crashes on it."""
    try:
        with zipfile.ZipFile(file.path) as archive, open(file.path, "rb") as raw:
            infos = archive.infolist()
            if _byte_order(archive, infos) != sys.byteorder:
                return None
            ends = data_ends(archive)
            return {
                info.filename: _Record(file, info, data_start(raw, info), ends[info.header_offset])
                for info in infos
            }
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise CorruptCheckpointError(
            f"{str(file)!r} is not a readable PyTorch zip file: {error}."
        ) from error


def _storage_records(state: Any, records: dict[str, _Record]) -> dict[int, _Record] | None:
    """The record of each storage: the one whose data starts at the place torch gave the
    storage on meta. None where a place is no record's start (a zip written again, its
    records compressed or moved): such a file is read whole by torch, which maps them itself.

    torch reads the places of files older than 2.7 from their records (written in the text
    order of their names: data/0, data/1, data/10, ...) and computes those of newer ones for
    the layout torch.save writes; either way, in a file torch.save wrote, each place is where
    its record's data starts.
    """
    import torch  # heavy: loaded on first use, not at import

    starts = {record.data: record for name, record in records.items() if "/data/" in name}
    found: dict[int, _Record] = {}
    for _, value in iter_leaves(state):
        if isinstance(value, torch.Tensor) and value.layout == torch.strided:
            place = getattr(value.untyped_storage(), "_checkpoint_offset", None)
            if place is None or place not in starts:
                return None
            found[place] = starts[place]
    return found


def _byte_order(archive: zipfile.ZipFile, infos: list[zipfile.ZipInfo]) -> str:
    """The byte order the file was written in (its ``byteorder`` record; this machine's if
    it has none, as torch assumes)."""
    for info in infos:
        if info.filename.rpartition("/")[2] == "byteorder":
            with archive.open(info) as stream:
                return stream.read(16).decode("ascii", "replace").strip()
    return sys.byteorder


def _checked_record(record: _Record, nbytes: int, where: str) -> _Record:
    """`record`, which must hold exactly the storage's `nbytes` bytes."""
    info = record.info
    fits = record.data + info.compress_size <= record.end
    if info.file_size == nbytes and fits and (record.compressed or info.compress_size == nbytes):
        return record
    how = "compressed" if record.compressed else "uncompressed"
    raise CorruptCheckpointError(
        f"{where}: its storage needs {nbytes} bytes, but its record {info.filename!r} declares "
        f"{info.file_size} bytes, stored {how} in {info.compress_size} bytes of the "
        f"{record.end - record.data} before the next entry. The file is damaged or truncated; "
        f"save it again from the model."
    )
