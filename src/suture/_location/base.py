"""The `Location` interface, and local paths (``pread``, ``pwrite``, atomic rename)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from .._buffers import aligned_empty, scratch_buffer
from .._errors import CorruptCheckpointError
from .._iostats import record_read
from . import direct

# The most bytes a metadata file (JSON: _METADATA, an index.json, ...) may hold once
# decoded; the safetensors header has its own (100 MiB, as the safetensors library).
MAX_METADATA_BYTES = 256 << 20


class Location:
    """A file or folder of a checkpoint, local or remote (see the module docstring)."""

    is_remote = False

    # --- naming -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def parent(self) -> Location:
        raise NotImplementedError

    def __truediv__(self, name: str) -> Location:
        raise NotImplementedError

    def with_name(self, name: str) -> Location:
        return self.parent / name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    # --- reading ------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def is_file(self) -> bool:
        raise NotImplementedError

    def is_dir(self) -> bool:
        raise NotImplementedError

    def children(self) -> list[str]:
        """Names of the files and folders directly inside this folder, sorted."""
        raise NotImplementedError

    def subfolders(self) -> list[str]:
        """Names of the folders directly inside this folder, sorted."""
        raise NotImplementedError

    def children_and_subfolders(self) -> tuple[list[str], list[str]]:
        """`children` and `subfolders` together (an object store lists once for both)."""
        return self.children(), self.subfolders()

    def read_bytes(self, limit: int | None = None, what: str = "") -> bytes:
        """The whole file; with `limit`, refused when it holds (or decodes to) more bytes.

        Raises:
            CorruptCheckpointError: over `limit` (`what` names the file's role).
        """
        raise NotImplementedError

    def read_range(self, offset: int, count: int, what: str = "") -> np.ndarray:
        """`count` bytes at `offset` as a fresh uint8 array (aligned, writable).

        Raises:
            CorruptCheckpointError: the file holds fewer bytes; `what` names the data.
        """
        raise NotImplementedError

    def read_into(self, offset: int, into: np.ndarray, what: str = "") -> None:
        """Fills `into` (C-contiguous, any dtype) with its size in bytes from `offset`.

        Raises:
            CorruptCheckpointError: the file holds fewer bytes; `what` names the data.
        """
        into.reshape(-1).view(np.uint8)[:] = self.read_range(offset, into.nbytes, what)

    def read_scratch(self, offset: int, count: int, what: str = "") -> np.ndarray:
        """`count` bytes at `offset` as a view of a per-thread buffer, valid until this
        thread's next `read_scratch` (for reads that are cast or copied into place at once).

        Raises:
            CorruptCheckpointError: the file holds fewer bytes; `what` names the data.
        """
        buffer = scratch_buffer("read", count)
        self.read_into(offset, buffer, what)
        return buffer

    def read_head(self, count: int) -> bytes:
        """The first `count` bytes, or the whole file when it is shorter."""
        raise NotImplementedError

    def size(self) -> int:
        """The file's size (remote: found with a few one-byte ranged reads, then cached)."""
        raise NotImplementedError

    def open_reader(self) -> Any:
        """A seekable binary file object (remote: ranged reads behind a buffer), for zipfile."""
        raise NotImplementedError

    def kvstore_spec(self) -> dict[str, Any]:
        """A TensorStore kvstore spec for this folder (its path ends in ``/``)."""
        raise NotImplementedError

    # --- writing ------------------------------------------------------------------------
    def write_bytes(self, data: bytes) -> None:
        raise NotImplementedError

    def create_bytes(self, data: bytes) -> bool:
        """Writes `data` only where nothing is there yet; returns whether it was written
        (object stores: in one conditional request, where the store honours it)."""
        raise NotImplementedError

    def remove(self) -> None:
        """Deletes this file, or this folder with everything in it; absent is fine."""
        raise NotImplementedError

    def remove_file(self) -> None:
        """Deletes this file, known to be one (an object store: one request, no listing)."""
        self.remove()

    def require_writable(self) -> None:
        """Raises SurgeryError where suture cannot write (``http(s)://``)."""


class LocalLocation(Location):
    """A path on this machine."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def __str__(self) -> str:
        return str(self.path)

    def __fspath__(self) -> str:
        return str(self.path)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def parent(self) -> LocalLocation:
        return LocalLocation(self.path.parent)

    def __truediv__(self, name: str) -> LocalLocation:
        return LocalLocation(self.path / name)

    def resolve(self) -> LocalLocation:
        return LocalLocation(self.path.resolve())

    def exists(self) -> bool:
        return self.path.exists()

    def is_file(self) -> bool:
        return self.path.is_file()

    def is_dir(self) -> bool:
        return self.path.is_dir()

    def children(self) -> list[str]:
        return sorted(child.name for child in self.path.iterdir())

    def subfolders(self) -> list[str]:
        return sorted(child.name for child in self.path.iterdir() if child.is_dir())

    def read_bytes(self, limit: int | None = None, what: str = "") -> bytes:
        if limit is None:
            return self.path.read_bytes()
        with open(self.path, "rb") as stream:
            size = os.fstat(stream.fileno()).st_size  # read(limit + 1) would allocate it all
            if size > limit:
                raise too_large(self, limit, what)
            parts, total = [], 0
            while total <= limit:  # the size said, or (a file with none) at most the limit
                part = stream.read(min(max(size + 1, 1 << 16), limit + 1 - total))
                if not part:
                    break
                parts.append(part)
                total += len(part)
        if total > limit:
            raise too_large(self, limit, what)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def read_range(self, offset: int, count: int, what: str = "") -> np.ndarray:
        buffer = aligned_empty((count,), np.dtype(np.uint8))
        self.read_into(offset, buffer, what)
        return buffer

    def read_into(self, offset: int, into: np.ndarray, what: str = "") -> None:

        count = into.nbytes
        got = direct.read_direct(self.path, offset, into) if direct.wanted(count) else None
        if got is None:
            with open(self.path, "rb", buffering=0) as stream:
                got = read_fully(stream.fileno(), into, offset) if count else 0
        if got != count:
            raise short_read(self, what, count, offset, got)
        record_read(count)

    def read_scratch(self, offset: int, count: int, what: str = "") -> np.ndarray:
        view = direct.read_direct_view(self.path, offset, count) if direct.wanted(count) else None
        if view is None:
            return super().read_scratch(offset, count, what)
        if len(view) != count:
            raise short_read(self, what, count, offset, len(view))
        record_read(count)
        return view

    def read_head(self, count: int) -> bytes:
        with open(self.path, "rb") as stream:
            return stream.read(count)

    def size(self) -> int:
        return self.path.stat().st_size

    def open_reader(self) -> Any:
        return open(self.path, "rb")  # noqa: SIM115 (the caller closes it)

    def kvstore_spec(self) -> dict[str, Any]:
        return {"driver": "file", "path": f"{self.path.resolve()}/"}

    def write_bytes(self, data: bytes) -> None:
        self.path.write_bytes(data)

    def remove(self) -> None:
        if self.path.is_dir() and not self.path.is_symlink():
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


def short_read(
    location: Location, what: str, count: int, offset: int, got: int | None
) -> CorruptCheckpointError:
    subject = f"tensor {what!r} needs" if what else "a read needs"
    gave = f"the file gave {got}" if got is not None else "the file ends before that"
    return CorruptCheckpointError(
        f"{str(location)!r} is shorter than its header says: {subject} {count} bytes at offset "
        f"{offset}, {gave}. The file is truncated or was changed while being read."
    )


def too_large(location: Location, limit: int, what: str = "") -> CorruptCheckpointError:
    subject = f"{what} {str(location)!r}" if what else repr(str(location))
    return CorruptCheckpointError(
        f"{subject} holds more than {limit:,} bytes (decoded), more than any checkpoint's "
        f"metadata needs; suture stops reading there rather than exhaust memory. The file "
        f"is damaged or hostile (a compressed body that inflates without bound, a server that "
        f"sends too much); restore it from a copy."
    )


def read_fully(descriptor: int, buffer: np.ndarray, offset: int) -> int:
    """Reads into `buffer` from `offset` until it is full or the file ends; returns bytes read.

    One ``preadv`` may return fewer bytes than asked (Linux: at most 2,147,479,552), so a
    short read is only the end of the file when a read returns nothing.
    """
    view = memoryview(buffer.reshape(-1).view(np.uint8))  # C-contiguous: no copy
    done = 0
    while done < len(view):
        got = os.preadv(descriptor, [view[done:]], offset + done)
        if got == 0:
            break
        done += got
    return done


class RangeReader(io.RawIOBase):
    """A read-only, seekable file over a location's ranged reads (for zipfile, msgpack).

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "f"
        >>> _ = path.write_bytes(b"abcdef")
        >>> reader = RangeReader(LocalLocation(path))
        >>> _ = reader.seek(2); reader.read(3)
        b'cde'
    """

    def __init__(self, location: Location) -> None:
        self._location, self._position = location, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: None}[whence]
        self._position = (self._location.size() if base is None else base) + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer: Any) -> int:
        count = max(0, min(len(buffer), self._location.size() - self._position))
        if count:
            data = self._location.read_range(self._position, count)
            memoryview(buffer).cast("B")[:count] = data
            self._position += count
        return count
