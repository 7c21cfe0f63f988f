"""How many bytes suture read from files: TensorStore's count plus suture's own reads.

Orbax arrays are read through TensorStore's file key-value store, which keeps a running
count of bytes read in this process; local arrays in other formats (safetensors, npz) are
read by suture itself, which counts them here. Remote data (``gs://``, ``s3://``,
``http(s)://``) is always fetched through TensorStore's kvstore drivers, whose counts of
bytes read (and of requests) are added in. Tests and benchmarks use the total to prove that
a view reads only its chunks and that opening a checkpoint reads no array data.

Example:
    >>> with count_bytes_read() as counter:
    ...     pass
    >>> counter.bytes
    0
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_DRIVERS = ("file", "gcs", "s3", "http")
_METRICS = tuple(f"/tensorstore/kvstore/{driver}/bytes_read" for driver in _DRIVERS)
_REQUEST_METRICS = tuple(f"/tensorstore/kvstore/{driver}/read" for driver in _DRIVERS[1:])
_own_reads = {"bytes": 0}
_lock = threading.Lock()


def record_read(count: int) -> None:
    """Counts bytes that suture read from a file itself (not through TensorStore)."""
    with _lock:
        _own_reads["bytes"] += count


def bytes_read() -> int:
    """Bytes read from files in this process so far, by TensorStore and by suture."""
    return _own_reads["bytes"] + _metric_total(_METRICS)


def remote_requests() -> int:
    """Read requests sent to remote stores (gcs, s3, http) in this process so far."""
    return _metric_total(_REQUEST_METRICS)


def _metric_total(names: tuple[str, ...]) -> int:
    import tensorstore as ts  # heavy: loaded on first use, not at import

    total = 0
    for metric in ts.experimental_collect_matching_metrics("/tensorstore/kvstore/"):
        if metric.get("name") in names:
            total += int(sum(value.get("value", 0) for value in metric.get("values", [])))
    return total


@dataclass
class ByteCounter:
    """Bytes read inside a `count_bytes_read` block (final once the block exits)."""

    start: int
    bytes: int = 0


@contextmanager
def count_bytes_read() -> Iterator[ByteCounter]:
    """Counts the bytes read from files inside the block, by TensorStore and by suture.

    Counts are per process, so reads by other threads in the block count too.

    Example:
        >>> import numpy as np, suture, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
        >>> _ = suture.save({"w": np.ones((64, 64), np.float32)}, path, progress=False)
        >>> ckpt = suture.open(path)
        >>> with suture.count_bytes_read() as counter:
        ...     _ = ckpt["w"].read()
        >>> counter.bytes > 0
        True
    """
    counter = ByteCounter(start=bytes_read())
    try:
        yield counter
    finally:
        counter.bytes = bytes_read() - counter.start
