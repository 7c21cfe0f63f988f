"""Lazy nodes that dequantize or quantize a block of rows as it is read.

A read of a slice of a dequantized weight reads that slice of the stored values and only
the scales of the blocks it touches; a read of a quantized weight reads the source's rows
and columns of the 128 x 128 blocks it touches (a block's scale needs all of it).

Example:
    >>> import numpy as np, ml_dtypes
    >>> from suture._lazy.graph import MemorySource
    >>> w = MemorySource(np.full((4, 4), 2.0, ml_dtypes.float8_e4m3fn))
    >>> s = MemorySource(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))
    >>> node = FP8DequantNode(w, s, (2, 2), np.dtype(np.float32), "fp8")
    >>> node.read((range(3, 4), range(4))).tolist()
    [[6.0, 6.0, 8.0, 8.0]]
    >>> [part for _, part in node.input_selections((range(3, 4), range(4)))]
    [(range(3, 4), range(0, 4)), (range(1, 2), range(0, 2))]
"""

from __future__ import annotations

import math
import re
import threading
import warnings
from typing import Any

import ml_dtypes
import numpy as np

from .._buffers import aligned_empty, scratch_buffer
from .._errors import CorruptCheckpointError, LossyCastError, SutureWarning
from .._lazy.graph import Node
from .._lazy.selection import (
    Selection,
    extent,
    indices,
    outer_index,
    positions,
    selection_shape,
)
from .._lazy.views import checking_casts
from .formats import (
    FLOAT32_MAX,
    MXFP4_BLOCK,
    SMALLEST_INVERSE,
    STRIP_ELEMENTS,
    TABLE_BYTES,
    dequantize_fp8_into,
    dequantize_mxfp4,
    mxfp4_overflow_scale,
    quantize_fp8,
    scale_values,
    unheld_values,
)

VALUES_STRIP_BYTES = 8 << 20  # stored FP8 values read at a time


def _span(axis: Any, block: int, length: int) -> range:
    """The block-aligned range of indices covering every index `axis` selects."""
    ends = extent(axis)
    if ends is None:
        return range(0)
    low, high = ends[0] // block, ends[1] // block + 1
    return range(low * block, min(high * block, length))


def _block_span(axis: Any, block: int) -> range:
    """The range of block numbers that the indices `axis` selects fall in."""
    ends = extent(axis)
    if ends is None:
        return range(0)
    return range(ends[0] // block, ends[1] // block + 1)


class FP8DequantNode(Node):
    """An FP8 `weight` times `scale` (``scale_inv``) of its `block`, read as `dtype`."""

    def __init__(
        self,
        weight: Node,
        scale: Node,
        block: tuple[int, int],
        dtype: np.dtype,
        name: str,
        tensor: str = "",
        scale_name: str = "",
    ) -> None:
        self.weight, self.scale, self.block, self.name = weight, scale, block, name
        self.shape, self.dtype = weight.shape, np.dtype(dtype)
        self.tensor, self.scale_name = tensor, scale_name or f"{tensor}_scale_inv"
        self.overflow = _OverflowWarning(tensor, self.dtype)

    def inputs(self) -> tuple[Node, ...]:
        return (self.weight, self.scale)

    def _scale_selection(self, selection: Selection) -> Selection:
        return (
            *selection[:-2],
            _block_span(selection[-2], self.block[0]),
            _block_span(selection[-1], self.block[1]),
        )

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return [(self.weight, selection), (self.scale, self._scale_selection(selection))]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        held = sum(m.held_while_reading(part) for m, part in self.input_selections(selection))
        count = math.prod(selection_shape(selection))
        blocks = math.prod(selection_shape(self._scale_selection(selection)))
        tables = min(blocks * 256 * self.dtype.itemsize, TABLE_BYTES)  # a lookup table a block
        index = min(count, STRIP_ELEMENTS) * 8
        return held + tables + index + (0 if into else count * self.dtype.itemsize)

    def describe(self) -> str:
        return f"dequantize {self.name} -> {self.dtype.name}"

    def read(self, selection: Selection) -> np.ndarray:
        out = aligned_empty(selection_shape(selection), self.dtype)
        self.read_into(selection, out)
        return out

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        scale_selection = self._scale_selection(selection)
        scales = self.scale.read(scale_selection)
        self._refuse_damaged_scales(scales, scale_selection)
        rows = indices(selection[-2]) // self.block[0] - scale_selection[-2].start
        cols = indices(selection[-1]) // self.block[1] - scale_selection[-1].start
        shape = selection_shape(selection)
        row_bytes = math.prod(shape[:-2]) * shape[-1] * self.weight.dtype.itemsize
        step = max(1, VALUES_STRIP_BYTES // max(1, row_bytes))
        for start in range(0, shape[-2], step):
            # the stored values a strip of rows at a time into this thread's buffer: no
            # fresh pages for each read, and the strip is still in cache when dequantized
            stop = min(shape[-2], start + step)
            part = (*selection[:-2], selection[-2][start:stop], selection[-1])
            values = scratch_buffer("fp8 values", (stop - start) * row_bytes)
            values = values.view(self.weight.dtype).reshape(selection_shape(part))
            self.weight.read_into(part, values)
            strip_rows = rows[start:stop]
            low, high = int(strip_rows.min()), int(strip_rows.max()) + 1
            strip_scales = scales[..., low:high, :]
            target = out[..., start:stop, :]
            if dequantize_fp8_into(target, values, strip_scales, strip_rows - low, cols):
                bad = unheld_values(target, values)
                if bad.any():
                    at = tuple(int(i) for i in np.argwhere(bad)[0])
                    scale = strip_scales[(*at[:-2], strip_rows[at[-2]] - low, cols[at[-1]])]
                    where = (*at[:-2], start + at[-2], at[-1])
                    index = tuple(positions(a)[i] for a, i in zip(selection, where, strict=True))
                    self.overflow.say(int(bad.sum()), index, f"scale_inv {scale}", scale)

    def _refuse_damaged_scales(self, scales: np.ndarray, scale_selection: Selection) -> None:
        """A stored scale that is not finite (NaN or inf, UE8M0's byte 255) is damage, as in
        the grouped formats: refused naming the block, not read as NaN or inf values."""
        finite = np.isfinite(scale_values(scales))
        if finite.all():
            return
        at = tuple(int(i) for i in np.argwhere(~finite)[0])
        block = [positions(axis)[i] for axis, i in zip(scale_selection, at, strict=True)]
        raw = np.asarray(scales[at])
        shown = f"byte {int(raw.view(np.uint8))}" if raw.dtype.itemsize == 1 else repr(float(raw))
        raise CorruptCheckpointError(
            f"Tensor {self.tensor or '(unnamed)'!r} ({self.name}): the scale of block {block} "
            f"({self.scale_name!r}, stored {shown}) is not finite; expected a finite scale "
            f"({int((~finite).sum())} such scale(s) in this read). The checkpoint's scales are "
            f"damaged: take the tensor from an intact copy."
        )


class MXFP4DequantNode(Node):
    """``(..., rows, groups, 16)`` packed FP4 `blocks` and ``(..., rows, groups)`` E8M0
    `scales`, read as ``(..., groups * 32, rows)`` of `dtype` (transformers' layout)."""

    def __init__(
        self, blocks: Node, scales: Node, dtype: np.dtype, name: str, tensor: str = ""
    ) -> None:
        self.blocks, self.scales, self.name = blocks, scales, name
        *lead, rows, groups, width = blocks.shape
        self.shape = (*lead, groups * width * 2, rows)
        self.dtype = np.dtype(dtype)
        self.overflow = _OverflowWarning(tensor, self.dtype)

    def inputs(self) -> tuple[Node, ...]:
        return (self.blocks, self.scales)

    def _parts(self, selection: Selection) -> tuple[Selection, Selection, range]:
        lead, columns, rows = selection[:-2], selection[-2], selection[-1]
        groups = _block_span(columns, MXFP4_BLOCK)
        width = self.blocks.shape[-1]
        return (*lead, rows, groups, range(width)), (*lead, rows, groups), groups

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        blocks, scales, _ = self._parts(selection)
        return [(self.blocks, blocks), (self.scales, scales)]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        held = sum(m.held_while_reading(part) for m, part in self.input_selections(selection))
        blocks, _, _ = self._parts(selection)
        unpacked = math.prod(selection_shape(blocks)) * 2 * 4  # float32, before selecting
        count = math.prod(selection_shape(selection))
        return held + 2 * unpacked + (0 if into else count * self.dtype.itemsize)

    def describe(self) -> str:
        return f"dequantize {self.name} -> {self.dtype.name}"

    def read(self, selection: Selection) -> np.ndarray:
        blocks_part, scales_part, groups = self._parts(selection)
        blocks, scales = self.blocks.read(blocks_part), self.scales.read(scales_part)
        values = dequantize_mxfp4(blocks, scales, self.dtype)  # cast in its table: same bits
        columns = indices(selection[-2]) - groups.start * MXFP4_BLOCK
        lead = tuple(range(n) for n in values.shape[:-2])
        values = outer_index(values, (*lead, range(values.shape[-2]), columns))
        raw = scales.view(np.uint8)
        if (raw >= min(mxfp4_overflow_scale(self.dtype), 255)).any():
            self._say_unheld(values, raw[..., columns // MXFP4_BLOCK], selection)
        return np.ascontiguousarray(np.swapaxes(values, -1, -2))

    def _say_unheld(
        self, values: np.ndarray, scale_bytes: np.ndarray, selection: Selection
    ) -> None:
        """Says (once for the tensor) a block with scale byte 255, E8M0's NaN, or else values
        that overflowed `dtype`; `values` and `scale_bytes` (each value's scale byte) are
        ``(..., rows, columns)`` of `selection`, before the transpose."""
        damaged = scale_bytes == 255
        bad = damaged if damaged.any() else ~np.isfinite(values)
        if not bad.any():
            return
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        lead = tuple(positions(a)[i] for a, i in zip(selection[:-2], at[:-2], strict=True))
        row, column = positions(selection[-1])[at[-2]], positions(selection[-2])[at[-1]]
        byte = int(scale_bytes[at])
        block = (*lead, int(row), int(column) // MXFP4_BLOCK)
        where = (*lead, int(column), int(row))
        if damaged.any():
            self.overflow.say_damaged_scale(int(damaged.sum()), where, block, byte)
        else:
            scale = f"block {list(block)}, scale byte {byte}: 2**{byte - 127}"
            self.overflow.say(int(bad.sum()), where, scale, 1.0)


class _OverflowWarning:
    """Says once per tensor that dequantizing it gave inf or NaN from finite codes, or
    met an MXFP4 scale byte 255 (E8M0's NaN)."""

    def __init__(self, tensor: str, dtype: np.dtype) -> None:
        self.tensor, self.dtype, self.said = tensor, dtype, False
        self._lock = threading.Lock()

    def _first(self) -> bool:
        """Whether this is the tensor's first report (later ones are not made)."""
        with self._lock:
            first, self.said = not self.said, True
        return first

    def say_damaged_scale(
        self, count: int, where: tuple[int, ...], block: tuple[int, ...], byte: int
    ) -> None:
        """An MXFP4 `block` (index of its scale) whose scale is `byte` 255, E8M0's NaN."""
        if not self._first():
            return
        scales = f"{self.tensor}_scales" if self.tensor else "the scales"
        warnings.warn(
            f"Tensor {self.tensor or '(unnamed)'!r}: the scale of block {list(block)} "
            f"({scales}{list(block)}, {MXFP4_BLOCK} values) is byte {byte}, E8M0's NaN (OCP "
            f"MX spec): its values are read as transformers reads them, ldexp(value, 128) (0 "
            f"stays 0, ±0.5 is ±2**127 where the dtype holds it, the rest ±inf), the first at "
            f"element {where} ({count} value(s) under such scales in this read). The "
            f"checkpoint's scales are damaged: take the tensor from an intact copy. Later ones "
            f"of this tensor are not reported.",
            SutureWarning,
            stacklevel=2,
        )

    def say(self, count: int, where: tuple[int, ...], scale: str, value: Any) -> None:
        if not self._first():
            return
        largest = float(ml_dtypes.finfo(self.dtype).max)
        if np.isfinite(value) and largest < float(np.finfo(np.float32).max):
            cause = (
                f"the values exceed the largest {self.dtype.name} ({largest:g}): dequantize "
                f"to bfloat16 or float32 instead"
            )
        elif np.isfinite(value):
            cause = (
                "the values exceed float32's range, in which they are computed (transformers "
                "gives inf too): the checkpoint's scales are out of range (a damaged file?)"
            )
        else:
            cause = "the checkpoint's scale is not finite (a damaged file?)"
        warnings.warn(
            f"Tensor {self.tensor or '(unnamed)'!r}: dequantizing to {self.dtype.name} gives "
            f"{count} inf or NaN value(s) from finite codes, the first at element {where} "
            f"({scale}): {cause}. Later ones of this tensor are not reported.",
            SutureWarning,
            stacklevel=2,
        )


class _Quantizer:
    """One 2-D weight quantized to FP8 by blocks. The scales found while its values are
    written are kept (a few bytes per block), and a read of the scale tensor waits for block
    rows being quantized at that moment, so that it need not read the weight again."""

    def __init__(self, source: Node, block: tuple[int, int], name: str = "") -> None:
        self.source, self.block, self.name = source, block, name
        self.scale_rows: dict[int, np.ndarray] = {}  # block row -> scale_inv of every column
        self._pending: dict[int, threading.Event] = {}  # block rows being quantized now
        self._lock = threading.Lock()
        self.strict = checking_casts()  # as a cast built here would: read when built
        self._warned = False

    @property
    def scale_shape(self) -> tuple[int, int]:
        rows, cols = self.source.shape
        return -(-rows // self.block[0]), -(-cols // self.block[1])

    def span(self, selection: Selection) -> Selection:
        rows, cols = self.source.shape
        return (_span(selection[0], self.block[0], rows), _span(selection[1], self.block[1], cols))

    def quantize(self, span: Selection) -> tuple[np.ndarray, np.ndarray]:
        """The FP8 values and scales of `span` (whole blocks); scales of whole block rows
        are kept."""
        whole_rows = span[1] == range(self.source.shape[1])
        first = span[0].start // self.block[0] if len(span[0]) else 0
        count = -(-len(span[0]) // self.block[0])
        done, owned = threading.Event(), []
        if whole_rows:
            with self._lock:
                for row in range(first, first + count):
                    if row not in self.scale_rows and row not in self._pending:
                        self._pending[row] = done
                        owned.append(row)
        try:
            source = self.source.read(span)
            values, scales = quantize_fp8(
                source, self.block, lambda unheld, why: self._unheld(span, source, unheld, why)
            )
            if whole_rows:
                with self._lock:
                    for index, row in enumerate(scales):
                        self.scale_rows[first + index] = row
        finally:
            with self._lock:
                for row in owned:
                    del self._pending[row]
            done.set()
        return values, scales

    def _unheld(self, span: Selection, source: np.ndarray, unheld: np.ndarray, why: str) -> None:
        """Values of `span` that FP8 cannot hold, `why` ``"range"`` (inf, NaN, beyond float32)
        or ``"tiny"`` (a block below float32's smallest subnormal): refused under strict
        casts, else said once for the tensor (they are written as NaN, saturated, or 0)."""
        if not self.strict and self._warned:
            return
        at = tuple(int(i) for i in np.argwhere(unheld)[0])
        row, col = span[0].start + at[0], span[1].start + at[1]
        found = (
            f"Tensor {self.name!r}: block (row {row // self.block[0]}, column "
            f"{col // self.block[1]}) of {self.block[0]}x{self.block[1]} holds {source[at]} at "
            f"element ({row}, {col}) ({int(unheld.sum())} such value(s) in block rows "
            f"{span[0].start // self.block[0]} to {(span[0].stop - 1) // self.block[0]})"
        )
        keep = (
            f"keep the tensor unquantized (keep_unquantized / --keep-unquantized "
            f"'^{re.escape(self.name)}$')"
        )
        if self.strict and why == "tiny":
            raise LossyCastError(
                f"{found}: every nonzero value of that block rounds to 0 in float32 (below its "
                f"smallest subnormal, {float(SMALLEST_INVERSE):.4g}), beyond the reach of FP8's "
                f"float32 scales, so quantize='fp8-block' would write the whole block as 0. "
                f"Scale the values up (and the layer's output back), or {keep}; without strict "
                f"casts such blocks are written as 0, with a warning."
            )
        if self.strict:
            raise LossyCastError(
                f"{found}: FP8 E4M3 has no infinity, and its float32 scales reach only "
                f"±{float(FLOAT32_MAX):.4g}, so quantize='fp8-block' would write NaN there or "
                f"saturate. Fix the source's values (clip them, or "
                f"take the checkpoint from before they went wrong), or {keep}; without strict "
                f"casts they are written as NaN (inf, NaN) or ±{float(FLOAT32_MAX):.4g} (larger "
                f"float64), with a warning."
            )
        with self._lock:
            if self._warned:
                return
            self._warned = True
        if why == "tiny":
            written = (
                f"written as 0, as is every other value of that block: all its nonzero values "
                f"round to 0 in float32 (below its smallest subnormal, "
                f"{float(SMALLEST_INVERSE):.4g}), beyond the reach of FP8's float32 scales"
            )
        else:
            written = (
                f"written as NaN (inf and NaN: FP8 E4M3 has no infinity) or "
                f"±{float(FLOAT32_MAX):.4g} (larger float64 values: its scales are float32); "
                f"the other values of those blocks are quantized as usual"
            )
        warnings.warn(
            f"{found}: {written}. Later blocks of this tensor are not reported. Pass "
            f"strict_casts=True (--strict-casts) to refuse them instead, or {keep}.",
            SutureWarning,
            stacklevel=2,
        )

    def scales_of(self, rows: np.ndarray) -> np.ndarray:
        """``scale_inv`` of the block `rows` (every column): kept ones, ones being computed
        (waited for), the rest computed here."""
        with self._lock:
            missing = {int(row) for row in rows} - set(self.scale_rows)
            waits = {id(event): event for row in missing if (event := self._pending.get(row))}
        for event in waits.values():
            event.wait()  # set in `quantize`'s finally: the other read finishes or fails
        with self._lock:
            missing = sorted({int(row) for row in rows} - set(self.scale_rows))
        every_column = range(self.source.shape[1])
        for low, high in _runs_of(missing):
            stop = min(self.source.shape[0], (high + 1) * self.block[0])
            self.quantize((range(low * self.block[0], stop), every_column))
        if not len(rows):
            return np.zeros((0, self.scale_shape[1]), np.float32)
        return np.stack([self.scale_rows[int(row)] for row in rows])


class FP8QuantNode(Node):
    """The FP8 E4M3 values of a 2-D weight quantized by `block` (transformers' formula)."""

    def __init__(self, quantizer: _Quantizer) -> None:
        self.quantizer = quantizer
        self.shape, self.dtype = quantizer.source.shape, np.dtype(ml_dtypes.float8_e4m3fn)

    def inputs(self) -> tuple[Node, ...]:
        return (self.quantizer.source,)

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return [(self.quantizer.source, self.quantizer.span(selection))]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        ((source, span),) = self.input_selections(selection)
        count = math.prod(selection_shape(span))
        result = 0 if into else math.prod(selection_shape(selection))
        return source.held_while_reading(span) + 3 * count * 4 + count + result

    def describe(self) -> str:
        block = self.quantizer.block
        return f"quantize fp8 e4m3, {block[0]}x{block[1]} blocks"

    def read(self, selection: Selection) -> np.ndarray:
        span = self.quantizer.span(selection)
        values, _ = self.quantizer.quantize(span)
        local = tuple(
            indices(axis) - part.start
            if not isinstance(axis, range)
            else range(axis.start - part.start, axis.stop - part.start, axis.step)
            for axis, part in zip(selection, span, strict=True)
        )
        return outer_index(values, local)


class FP8ScaleNode(Node):
    """The float32 ``weight_scale_inv`` of each block of a `_Quantizer`'s weight."""

    def __init__(self, quantizer: _Quantizer) -> None:
        self.quantizer = quantizer
        self.shape, self.dtype = quantizer.scale_shape, np.dtype(np.float32)

    def inputs(self) -> tuple[Node, ...]:
        return (self.quantizer.source,)

    def _source_span(self, selection: Selection) -> Selection:
        rows, cols = self.quantizer.source.shape
        block = self.quantizer.block
        spans = []
        for axis, size, length in zip(selection, block, (rows, cols), strict=True):
            ends = extent(axis)
            spans.append(
                range(0)
                if ends is None
                else range(ends[0] * size, min(length, (ends[1] + 1) * size))
            )
        return tuple(spans)

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return [(self.quantizer.source, self._source_span(selection))]

    def describe(self) -> str:
        block = self.quantizer.block
        return f"fp8 scales of {block[0]}x{block[1]} blocks"

    def read(self, selection: Selection) -> np.ndarray:
        wanted = indices(selection[0])
        return outer_index(self.quantizer.scales_of(wanted), (range(len(wanted)), selection[1]))


def _runs_of(numbers: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for number in numbers:
        if runs and runs[-1][1] == number - 1:
            runs[-1] = (runs[-1][0], number)
        else:
            runs.append((number, number))
    return runs


def quantized_pair(source: Node, block: tuple[int, int], name: str = "") -> tuple[Node, Node]:
    """The FP8 values node and the ``scale_inv`` node of a 2-D weight `source` (`name`d in
    errors and warnings)."""
    quantizer = _Quantizer(source, block, name)
    return FP8QuantNode(quantizer), FP8ScaleNode(quantizer)
