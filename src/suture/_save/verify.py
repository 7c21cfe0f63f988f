"""Verification of a write: every block read back from the output matches what was written.

While writing, each block's bytes are hashed (BLAKE2b) on their way to the sink; before the
result is moved into place, each block is read back from the temporary output and hashed
again. A mismatch is a `SurgeryError` naming the leaf and rows, and the output is discarded.
Digests are keyed by leaf path, the row a block is within (`Block.outer`) and its first row.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import CorruptCheckpointError
from .._exec.blocks import Block, LeafWriter
from .._lazy.array import LazyArray
from .._paths import flatten
from ..sources.orbax import read_item
from ..sources.safetensors import tensors_by_name


def digest(values: np.ndarray) -> str:
    data = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
    return hashlib.blake2b(data, digest_size=16).hexdigest()


# by leaf path, the row a block is within (`Block.outer`), its axis and its first position
Digests = dict[tuple[str, tuple[int, ...], int, int], str]


class DigestingWriter:
    """A writer that records a digest of every block before handing it on."""

    def __init__(
        self,
        inner: LeafWriter,
        key: tuple[str, tuple[int, ...]],
        digests: Digests,
        lock: threading.Lock,
    ) -> None:
        self._inner, self._key, self._digests, self._lock = inner, key, digests, lock

    def block_rows(self) -> int:
        return self._inner.block_rows()

    def held_while_writing(self, nbytes: int) -> int:
        return self._inner.held_while_writing(nbytes)

    def unit_along(self, axis: int) -> int | None:
        unit_along = getattr(self._inner, "unit_along", None)
        return None if unit_along is None else unit_along(axis)

    def write(self, rows: slice, values: np.ndarray) -> None:
        self._record(0, rows, values)
        self._inner.write(rows, values)

    def write_along(self, axis: int, rows: slice, values: np.ndarray) -> None:
        self._record(axis, rows, values)
        self._inner.write_along(axis, rows, values)  # type: ignore[attr-defined]

    def _record(self, axis: int, rows: slice, values: np.ndarray) -> None:
        value = digest(values)
        with self._lock:
            self._digests[(*self._key, axis, rows.start or 0)] = value


def with_digests(blocks: list[Block]) -> tuple[list[Block], Digests]:
    """`blocks` whose writers record digests, and the dict they record into."""
    digests: Digests = {}
    lock = threading.Lock()
    wrapped: dict[int, DigestingWriter] = {}
    result = []
    for block in blocks:
        writer = wrapped.setdefault(
            id(block.writer),
            DigestingWriter(block.writer, (block.path, block.outer), digests, lock),
        )
        result.append(dataclasses.replace(block, writer=writer))
    return result, digests


def check(blocks: list[Block], digests: Digests, written: dict[str, LazyArray]) -> None:
    """Reads every block back from `written` (by block path) and compares digests."""
    for block in blocks:
        leaf = written.get(block.path)
        if leaf is None:
            raise CorruptCheckpointError(
                f"Verification failed: {block.path!r} is missing from the written output."
            )
        part = leaf[block.outer] if block.outer else leaf
        values = part[block.index].read() if part.ndim else part.read()
        if values.dtype != block.array.dtype or digest(values) != digests.get(
            (block.path, block.outer, block.axis, block.rows.start or 0)
        ):
            where = "rows" if block.axis == 0 else f"positions of axis {block.axis}"
            within = f" of row {list(block.outer)}" if block.outer else ""
            raise CorruptCheckpointError(
                f"Verification failed: {where} {block.rows.start or 0} to {block.rows.stop}"
                f"{within} of {block.path!r} read back differently from what was written. "
                f"Nothing was "
                f"written to the destination; check the disk and try again."
            )


def written_leaves(folder_or_file: Path, format: str) -> dict[str, Any]:  # noqa: A002
    """The arrays of a just-written (still temporary) output, by the paths its blocks use."""
    if format == "orbax":
        return flatten(read_item(folder_or_file))

    return tensors_by_name(folder_or_file)
