"""numpy ``.npz`` archives (``np.savez``, ``np.savez_compressed``), one member at a time.

Opening reads each member's ``.npy`` header only. A stored (uncompressed) member is read
like a safetensors tensor, just the rows a view needs; a compressed member is inflated as a
stream up to the last row a read needs, never beyond what it declares. A member whose size
in the archive differs from what its ``.npy`` header declares is refused. Member names
split into tree paths on ``/``.
"""

from __future__ import annotations

import math
import zipfile
from typing import Any

import numpy as np

from .._errors import CorruptCheckpointError, UnsupportedError, check_shape
from .._iostats import record_read
from .._lazy.array import LazyArray
from .._lazy.graph import Node, ReadCost, SourceNode
from .._lazy.selection import Selection, outer_index, positions, selection_shape
from .._location import Location
from .._paths import unflatten
from .checkpoint import Checkpoint
from .filesource import FileRangeSource, local_identity
from .zip_entries import data_ends, data_start

_INFLATE_PIECE = 1 << 20  # bytes inflated at a time while skipping rows a read does not need


class ZipMemberSource(SourceNode):
    """A compressed npz member, inflated as a stream: only up to the last row a read needs.

    Inflating never yields more than the member declares (zipfile stops there) nor more
    than the rows asked for plus one piece, so a zip bomb costs what its header declares.
    """

    def __init__(
        self,
        file: Location,
        member: str,
        header_size: int,
        shape: tuple[int, ...],
        dtype: np.dtype,
        path: str,
        compressed_bytes: int = 0,
    ) -> None:
        self.file, self.member, self.header_size = file, member, header_size
        self.shape, self.dtype = shape, dtype
        self.path, self.origin = path, str(file)
        self.compressed_bytes = compressed_bytes

    def read_cost(self, selection: Selection, into: bool = False) -> ReadCost:
        """The whole member is read and inflated, whatever the selection; the result besides."""
        whole = math.prod(self.shape) * self.dtype.itemsize
        selected = math.prod(selection_shape(selection)) * self.dtype.itemsize
        return ReadCost(self.compressed_bytes or whole, whole + selected)

    def read(self, selection: Selection) -> np.ndarray:
        if self.shape and len(selection[0]) == 0:
            return np.empty(tuple(len(axis) for axis in selection), self.dtype)
        rows = positions(selection[0]) if self.shape else range(1)
        low, high = int(min(rows)), int(max(rows)) + 1
        row_bytes = self.dtype.itemsize * math.prod(self.shape[1:])
        try:
            with (
                self.file.open_reader() as reader,  # zipfile leaves a file it is given open
                zipfile.ZipFile(reader) as archive,
                archive.open(self.member) as stream,
            ):
                _skip(stream, self.header_size + low * row_bytes)
                raw = _read_exactly(stream, (high - low) * row_bytes)
                if high == (self.shape[0] if self.shape else 1) and stream.read(1):
                    raise ValueError("the member holds more data than its header declares")
                if not self.file.is_remote:  # remote reads are counted by TensorStore
                    record_read(archive.getinfo(self.member).compress_size)
        except Exception as error:  # zipfile, zlib and numpy raise many kinds on damage
            raise CorruptCheckpointError(
                f"Member {self.member!r} of {str(self.file)!r} cannot be read: {error}. The archive "
                f"is damaged or was changed while being read."
            ) from error
        block = raw.view(self.dtype).reshape((high - low, *self.shape[1:]) if self.shape else ())
        if not self.shape:
            return block.copy()
        first = selection[0]
        local = _shifted(first, low) if isinstance(first, range) else first - low
        return np.array(outer_index(block, (local, *selection[1:])), copy=True)

    def inputs(self) -> tuple[Node, ...]:
        return ()


def _shifted(axis: range, low: int) -> range:
    return range(axis.start - low, axis.stop - low, axis.step)


def _skip(stream: Any, count: int) -> None:
    while count > 0:
        piece = stream.read(min(count, _INFLATE_PIECE))
        if not piece:
            raise ValueError("the member ends before the data its header declares")
        count -= len(piece)


def _read_exactly(stream: Any, count: int) -> np.ndarray:
    buffer = np.empty(count, np.uint8)
    view, filled = memoryview(buffer), 0
    while filled < count:
        piece = stream.read(min(count - filled, _INFLATE_PIECE))
        if not piece:
            raise ValueError(
                f"the member ends {count - filled} bytes before the data its header declares"
            )
        view[filled : filled + len(piece)] = piece
        filled += len(piece)
    return buffer


def open_npz(path: Location) -> Checkpoint:
    """Opens an ``.npz`` archive lazily."""
    flat: dict[str, Any] = {}
    try:
        with (
            path.open_reader() as reader,
            zipfile.ZipFile(reader) as archive,
            path.open_reader() as raw,
        ):
            ends = data_ends(archive)
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                name = info.filename[: -len(".npy")]
                flat[name] = _member(path, archive, raw, info, name, ends[info.header_offset])
    except (CorruptCheckpointError, UnsupportedError):
        raise
    except Exception as error:  # zipfile, struct and numpy raise many kinds on damage
        raise CorruptCheckpointError(
            f"{str(path)!r} is not a readable .npz archive: {error}."
        ) from error
    return Checkpoint(unflatten(flat), location=str(path), format="npz")


def _member(
    path: Location,
    archive: zipfile.ZipFile,
    raw: Any,
    info: zipfile.ZipInfo,
    name: str,
    data_end: int,
) -> LazyArray:
    with archive.open(info) as stream:
        major, minor = np.lib.format.read_magic(stream)
        read_header = getattr(np.lib.format, f"read_array_header_{major}_{minor}", None)
        if read_header is None:
            raise CorruptCheckpointError(
                f"Member {name!r} of {str(path)!r} uses .npy format {major}.{minor}, which suture "
                f"does not read."
            )
        shape, fortran_order, dtype = read_header(stream, max_header_size=100_000)
        header_size = stream.tell()
    check_shape(tuple(shape), dtype, f"Member {name[:200]!r} of {str(path)!r}")
    if dtype.hasobject:
        raise CorruptCheckpointError(
            f"Member {name!r} of {str(path)!r} holds Python objects (pickles); refusing to read it."
        )
    if fortran_order:
        raise CorruptCheckpointError(
            f"Member {name!r} of {str(path)!r} is Fortran-ordered, which suture does not read."
        )
    if dtype.itemsize == 0:  # a view of bytes as such elements fails; there is nothing to read
        raise UnsupportedError(
            f"Member {name!r} of {str(path)!r} has dtype {dtype} of zero bytes per element: it "
            f"holds a shape {tuple(shape)} but no values, and suture reads arrays of values. "
            f"Remove it from the archive (np.load reads it as empty records)."
        )
    declared = header_size + math.prod(shape) * dtype.itemsize
    if info.file_size != declared:
        raise CorruptCheckpointError(
            f"Member {name!r} of {str(path)!r}: its .npy header declares {tuple(shape)} {dtype} "
            f"({declared} bytes with the header), but the archive says the member holds "
            f"{info.file_size} bytes. The archive is damaged or hostile; numpy refuses it too."
        )
    if info.compress_type == zipfile.ZIP_STORED:
        start = data_start(raw, info)
        _check_stored(info, start, data_end, name, path)
        data_offset = start + header_size
        identity = local_identity(path)
        return LazyArray(
            FileRangeSource(path, data_offset, tuple(shape), dtype, name, identity), path=name
        )
    member = ZipMemberSource(
        path, info.filename, header_size, tuple(shape), dtype, name, info.compress_size
    )
    return LazyArray(member, path=name)


def _check_stored(info: zipfile.ZipInfo, start: int, end: int, name: str, path: Location) -> None:
    """An uncompressed member must hold, before the next entry, the bytes it declares."""
    if info.compress_size == info.file_size and start + info.file_size <= end:
        return
    raise CorruptCheckpointError(
        f"Member {name!r} of {str(path)!r} is stored uncompressed and declares {info.file_size} "
        f"bytes, but the archive holds {min(info.compress_size, end - start)} bytes of it before "
        f"the next entry. The archive is damaged or hostile (numpy refuses it too); write it "
        f"again with np.savez."
    )
