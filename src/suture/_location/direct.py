"""Reading large ranges of local files around the page cache (``O_DIRECT``).

A streamed save reads each source byte once. Through the page cache every page read is
inserted, copied out and later evicted again: for a checkpoint larger than memory that
costs as much system time as the rest of the surgery (30 GiB of safetensors read on four
threads: 17.7 CPU s buffered, 1.0 CPU s with ``O_DIRECT``, the same wall time), and the
eviction competes with writing the output. So a save whose reads from local files exceed a
quarter of the machine's memory (`should_read_direct`) reads its large ranges (1 MiB and
up) with ``O_DIRECT`` while it runs (`direct_reads`): each range goes through a per-thread
buffer aligned as ``O_DIRECT`` requires, 8 MiB at a time, and is copied into place.

``SUTURE_DIRECT_IO=1`` reads large ranges directly in every read, ``SUTURE_DIRECT_IO=0``
never. A file system that refuses ``O_DIRECT`` (tmpfs on older kernels) is read through the
page cache instead. Example:

    >>> should_read_direct(0)
    False
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator

import numpy as np

from .._buffers import scratch_buffer

ALIGNMENT = 4096  # what O_DIRECT asks of offsets, lengths and buffers on common file systems
PIECE_BYTES = 8 << 20
SMALLEST_DIRECT_READ = 1 << 20  # smaller reads keep the page cache (and its read-ahead)

_lock = threading.Lock()
_active = 0  # saves running with direct reads
_refused: set[int] = set()  # devices whose file system refused O_DIRECT


def should_read_direct(local_bytes: int) -> bool:
    """Whether a save reading `local_bytes` from local files should read them directly."""
    setting = os.environ.get("SUTURE_DIRECT_IO", "")
    if setting in ("0", "1"):
        return setting == "1"
    memory = _physical_memory()
    return memory is not None and local_bytes >= memory // 4


@contextlib.contextmanager
def direct_reads(enabled: bool) -> Iterator[None]:
    """Large local reads inside the block (on any thread) go around the page cache."""
    global _active
    if not enabled:
        yield
        return
    with _lock:
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1


def wanted(count: int) -> bool:
    """Whether a read of `count` bytes should go around the page cache now."""
    if not hasattr(os, "O_DIRECT") or count < SMALLEST_DIRECT_READ:
        return False
    setting = os.environ.get("SUTURE_DIRECT_IO", "")
    return setting == "1" or (setting != "0" and _active > 0)


def read_direct(path: str | os.PathLike, offset: int, into: np.ndarray) -> int | None:
    """Fills `into` from `offset` of `path` with O_DIRECT; returns the bytes read (fewer at
    the end of the file), or None where the file system refuses O_DIRECT."""
    flat = into.reshape(-1).view(np.uint8)
    with _opened(path) as descriptor:
        if descriptor is None:
            return None
        done = 0
        while done < len(flat):
            want = min(PIECE_BYTES, len(flat) - done)
            piece = _aligned_read(descriptor, offset + done, want, first=done == 0)
            if piece is None:
                return None
            flat[done : done + len(piece)] = piece
            done += len(piece)
            if len(piece) < want:  # the end of the file
                break
        return done


def read_direct_view(path: str | os.PathLike, offset: int, count: int) -> np.ndarray | None:
    """`count` bytes from `offset` of `path` (fewer at the end of the file), read with
    O_DIRECT into this thread's buffer and returned as a view of it (valid until this
    thread's next direct read); None where the file system refuses O_DIRECT."""
    with _opened(path) as descriptor:
        return None if descriptor is None else _aligned_read(descriptor, offset, count, True)


@contextlib.contextmanager
def _opened(path: str | os.PathLike) -> Iterator[int | None]:
    """`path` opened with O_DIRECT, or None where its file system refuses it."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as error:
        if error.errno == errno.EINVAL:
            yield None
            return
        raise
    try:
        yield None if os.fstat(descriptor).st_dev in _refused else descriptor
    finally:
        os.close(descriptor)


def _aligned_read(descriptor: int, start: int, count: int, first: bool) -> np.ndarray | None:
    """Reads the aligned span around ``[start, start + count)`` into this thread's buffer;
    returns the view of what was asked (shorter at the end of the file)."""
    low = start - start % ALIGNMENT
    high = -(-(start + count) // ALIGNMENT) * ALIGNMENT
    scratch = scratch_buffer("direct", high - low)
    view = memoryview(scratch)
    done = 0
    while done < len(view):
        try:
            got = os.preadv(descriptor, [view[done:]], low + done)
        except OSError as error:
            if error.errno == errno.EINVAL and first and done == 0:  # refused by the fs
                _refused.add(os.fstat(descriptor).st_dev)
                return None
            raise
        done += got
        if got == 0 or done % ALIGNMENT:  # a short read off a boundary: the end of the file
            break
    usable = max(0, min(count, done - (start - low)))
    return scratch[start - low : start - low + usable]


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
