"""How many bytes suture read from files, as TensorStore counts them.

Every array read goes through TensorStore's file key-value store, which keeps a running
count of bytes read in this process. Tests and benchmarks use it to prove that a view
reads only its chunks and that opening a checkpoint reads no array data.

Example:
    >>> with count_bytes_read() as counter:
    ...     pass
    >>> counter.bytes
    0
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_METRIC = "/tensorstore/kvstore/file/bytes_read"


def bytes_read() -> int:
    """Bytes TensorStore has read from files in this process so far."""
    import tensorstore as ts

    for metric in ts.experimental_collect_matching_metrics(_METRIC):
        if metric.get("name") == _METRIC:
            return int(sum(value.get("value", 0) for value in metric.get("values", [])))
    return 0


@dataclass
class ByteCounter:
    """Bytes read inside a `count_bytes_read` block (final once the block exits)."""

    start: int
    bytes: int = 0


@contextmanager
def count_bytes_read() -> Iterator[ByteCounter]:
    """Counts the bytes TensorStore reads from files inside the block."""
    counter = ByteCounter(start=bytes_read())
    try:
        yield counter
    finally:
        counter.bytes = bytes_read() - counter.start
