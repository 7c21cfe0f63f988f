"""What the allocator keeps: glibc's malloc arenas, trimming freed memory, resident size.

The process's growth while writing is the blocks in flight plus what the allocator keeps
after `free`. With one malloc arena (`limit_malloc_arenas`) memory freed by one thread is
re-used by the next, and with fixed thresholds (`keep_freed_memory`) chunk-sized buffers
come from the heap and stay there; all of it is trimmed when the process nears its budget.
This tuning is process-wide, so importing suture never does it: the command line does (it owns its
process), and a library caller asks for it (``suture.save(..., tune_allocator=True)`` or
``SUTURE_TUNE_ALLOCATOR=1``).
"""

from __future__ import annotations

import ctypes
import os


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 (both exist: glibc)
    except (OSError, AttributeError):  # not glibc
        return None
    return libc


_LIBC = _glibc()
_TRIM = _LIBC.malloc_trim if _LIBC is not None else None
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
MMAP_THRESHOLD = 32 << 20  # glibc's largest (on 64-bit): smaller blocks come from the heap
TRIM_THRESHOLD = 64 << 20  # free memory kept at the top of the heap for the next chunks


def limit_malloc_arenas() -> None:
    """Limits glibc to one malloc arena for threads started from now on (unless the
    environment sets ``MALLOC_ARENA_MAX``).

    glibc gives threads arenas of their own (up to 8 per core), and memory freed in one
    arena is re-used only by the threads of that arena. TensorStore's threads encode and
    write chunks in buffers they allocate and free, so each of its arenas kept a few chunks'
    worth after `free`: the process grew by 0.1 to 0.4 GiB beyond the blocks in flight
    (bench/larger_than_memory.py). With one arena the next chunk re-uses those pages, which
    also spares their page faults; the save's threads spend their time in numpy and
    TensorStore's codecs, not in `malloc`. Threads that already have an arena keep it.

    This is process-wide and lasts for the rest of the process, so suture does it only where
    it owns the process (the command line), when ``SUTURE_TUNE_ALLOCATOR=1`` is set (at
    import), or when a save is asked for it (`tune_if_asked`).
    """
    if _LIBC is not None and "MALLOC_ARENA_MAX" not in os.environ:
        _LIBC.mallopt(_M_ARENA_MAX, 1)


def keep_freed_memory() -> None:
    """Makes glibc serve every allocation of up to 32 MiB from its heap and keep up to
    64 MiB free at the heap's top (unless the environment sets either threshold).

    glibc starts by mapping allocations of 128 KiB and up with fresh pages, raising that
    threshold only as such mappings are freed, and hands the heap's top back to the system
    once twice that much is free there; TensorStore's encoders then faulted in the same few
    MiB again and again (zstd's buffers, the chunk copies), on this project's virtual
    machine partly as 2 MiB huge pages, each zeroed by the kernel. Fixed thresholds keep
    those pages: the FP8 one pass at 32 experts faults 34 thousand pages
    instead of 70 to 110 thousand, in 15.3 CPU s instead of 16.7 to 17.1. The process
    still grows within its budget: past it, `trim_freed_memory` hands everything free back.
    """
    if _LIBC is None:
        return
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        _LIBC.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def tune_malloc() -> None:
    """The allocator tuning for a process that suture owns or was asked to tune: one arena
    (`limit_malloc_arenas`) and fixed thresholds (`keep_freed_memory`)."""
    limit_malloc_arenas()
    keep_freed_memory()


def tuning_asked_by_environment() -> bool:
    """Whether ``SUTURE_TUNE_ALLOCATOR`` asks for the tuning for the whole process."""
    return os.environ.get("SUTURE_TUNE_ALLOCATOR", "").strip().lower() in ("1", "true", "yes")


def tune_if_asked(asked: bool | None) -> None:
    """Tunes the allocator for the process when `asked` (None: ``SUTURE_TUNE_ALLOCATOR``).

    The tuning cannot be undone for the rest of the process: glibc fixes its arena limit the
    first time a thread asks for an arena while a limit is set.

    Example:
        >>> tune_if_asked(False)  # changes nothing
    """
    if asked if asked is not None else tuning_asked_by_environment():
        tune_malloc()


def trim_freed_memory(baseline: int | None, max_memory: int) -> None:
    """Hands memory that glibc keeps after `free` back to the system, once the process has
    grown by more than `max_memory` since `baseline` (its size when writing began).

    TensorStore's threads encode chunks in buffers of their own; glibc keeps what it frees
    (below the top of its heap, or in holes between live blocks) for re-use. Trimming only
    when the process nears its budget spares the page faults of re-using trimmed memory
    otherwise: with one malloc arena the next chunk re-uses what the last one freed, and
    trimming at three quarters of the budget tripled the page faults of a 256 MiB budget.
    """
    if _TRIM is None:
        return
    resident = resident_bytes()
    if resident is None or baseline is None or resident - baseline > max_memory:
        _TRIM(0)


def resident_bytes() -> int | None:
    """This process's resident memory (None where /proc is not available)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return None


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


if tuning_asked_by_environment():
    tune_malloc()  # asked for the whole process: as early as possible, before threads start
