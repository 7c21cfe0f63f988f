"""numpy ``.npz`` archives (``np.savez``, ``np.savez_compressed``), one member at a time.

Opening reads each member's ``.npy`` header only. A stored (uncompressed) member is read
like a safetensors tensor, just the rows a view needs; a compressed member is inflated
whole when first read. Member names split into tree paths on ``/``.
"""

from __future__ import annotations

import math
import zipfile
from typing import Any

import numpy as np

from .._checkpoint import Checkpoint
from .._errors import CorruptCheckpointError
from .._filesource import FileRangeSource
from .._iostats import record_read
from .._lazy import LazyArray
from .._location import Location
from .._nodes import Node, ReadCost, SourceNode
from .._paths import unflatten
from .._selection import Selection, outer_index, selection_shape


class ZipMemberSource(SourceNode):
    """A compressed npz member: inflated whole on each read (the format allows nothing less)."""

    def __init__(
        self,
        file: Location,
        member: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        path: str,
        compressed_bytes: int = 0,
    ) -> None:
        self.file, self.member, self.shape, self.dtype = file, member, shape, dtype
        self.path, self.origin = path, str(file)
        self.compressed_bytes = compressed_bytes

    def read_cost(self, selection: Selection, into: bool = False) -> ReadCost:
        """The whole member is read and inflated, whatever the selection; the result besides."""
        whole = math.prod(self.shape) * self.dtype.itemsize
        selected = math.prod(selection_shape(selection)) * self.dtype.itemsize
        return ReadCost(self.compressed_bytes or whole, whole + selected)

    def read(self, selection: Selection) -> np.ndarray:
        try:
            with (
                zipfile.ZipFile(self.file.open_reader()) as archive,
                archive.open(self.member) as stream,
            ):
                array = np.lib.format.read_array(stream, allow_pickle=False)
                if not self.file.is_remote:  # remote reads are counted by TensorStore
                    record_read(archive.getinfo(self.member).compress_size)
        except Exception as error:  # zipfile, zlib and numpy raise many kinds on damage
            raise CorruptCheckpointError(
                f"Member {self.member!r} of {str(self.file)!r} cannot be read: {error}. The archive "
                f"is damaged or was changed while being read."
            ) from error
        if array.shape != self.shape or array.dtype != self.dtype:
            raise CorruptCheckpointError(
                f"Member {self.member!r} of {str(self.file)!r} changed: its header said {self.shape} "
                f"{self.dtype}, it holds {array.shape} {array.dtype}."
            )
        return np.array(outer_index(array, selection), copy=True)

    def inputs(self) -> tuple[Node, ...]:
        return ()


def open_npz(path: Location) -> Checkpoint:
    """Opens an ``.npz`` archive lazily."""
    flat: dict[str, Any] = {}
    try:
        with zipfile.ZipFile(path.open_reader()) as archive, path.open_reader() as raw:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                name = info.filename[: -len(".npy")]
                flat[name] = _member(path, archive, raw, info, name)
    except CorruptCheckpointError:
        raise
    except Exception as error:  # zipfile, struct and numpy raise many kinds on damage
        raise CorruptCheckpointError(
            f"{str(path)!r} is not a readable .npz archive: {error}."
        ) from error
    return Checkpoint(unflatten(flat), location=str(path), format="npz")


def _member(
    path: Location, archive: zipfile.ZipFile, raw: Any, info: zipfile.ZipInfo, name: str
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
    if dtype.hasobject:
        raise CorruptCheckpointError(
            f"Member {name!r} of {str(path)!r} holds Python objects (pickles); refusing to read it."
        )
    if fortran_order:
        raise CorruptCheckpointError(
            f"Member {name!r} of {str(path)!r} is Fortran-ordered, which suture does not read."
        )
    if info.compress_type == zipfile.ZIP_STORED:
        raw.seek(info.header_offset)
        local_header = raw.read(30)
        name_length = int.from_bytes(local_header[26:28], "little")
        extra_length = int.from_bytes(local_header[28:30], "little")
        data_offset = info.header_offset + 30 + name_length + extra_length + header_size
        return LazyArray(
            FileRangeSource(path, data_offset, tuple(shape), dtype, path=name), path=name
        )
    member = ZipMemberSource(path, info.filename, tuple(shape), dtype, name, info.compress_size)
    return LazyArray(member, path=name)
