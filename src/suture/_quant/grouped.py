"""Lazy nodes for weights stored packed with a scale per group of each row.

A `GroupedDequantNode` is the logical ``(..., rows, cols)`` weight; its `Codec` says which
stored tensors a read of some columns needs and how their bytes become values. A read takes
the selected rows and the columns of the groups (and packed words) it touches, never more:
the stream holds a block of rows at a time, as the FP8 node does.

A scale that is not finite (UE8M0's byte 255, a NaN, a global scale of 0) is a
`CorruptCheckpointError` naming the tensor, the group and the value: these formats have no
reference that reads such a scale as anything but garbage.

Example:
    >>> from suture._lazy.graph import MemorySource
    >>> packed = MemorySource(np.array([[0x21, 0x43]], np.uint8))  # 0.5, 1, 1.5, 2
    >>> scales = MemorySource(np.array([[128]], np.uint8))          # 2 ** 1
    >>> node = GroupedDequantNode(E2M1Codec(packed, scales, 4, "w", "w.scale"), np.float32)
    >>> node.shape, node.read((range(1), range(1, 3))).tolist()
    ((1, 4), [[2.0, 3.0]])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np

from .._buffers import aligned_empty, assign, scratch_buffer
from .._errors import CorruptCheckpointError
from .._lazy.graph import Node
from .._lazy.selection import Selection, extent, indices, positions, selection_shape
from . import bytetable
from .e2m1 import E2M1, dequantize_e2m1
from .formats import MXFP4_BLOCK, dequantize_mxfp4, scale_values
from .intpack import dequantize_groups, packed_words, unpack_signed, unpack_values
from .nodes import _OverflowWarning

TILE_OUT_BYTES = 1 << 20  # a tile decoded before it is copied into a transposed result


def _aligned(axis: Any, align: int, length: int) -> range:
    """The range of columns, from and to multiples of `align` (or `length`), covering `axis`."""
    ends = extent(axis)
    if ends is None:
        return range(0)
    first, last = ends
    low = first // align * align
    return range(low, min(length, -(-(last + 1) // align) * align))


def _exponents(raw: np.ndarray) -> bool:
    """Whether stored scales are UE8M0 exponent bytes."""
    return raw.dtype.name in ("uint8", "float8_e8m0fnu")


def _float_scales(raw: np.ndarray) -> np.ndarray:
    """Stored scales as float32: UE8M0 bytes as ``2 ** (s - 127)``, floats as they are."""
    return scale_values(raw)


class Codec:
    """How one format stores a weight: the tensors it reads and how they become values."""

    shape: tuple[int, ...]
    group: int  # values per scale along the last axis
    align: int  # a read's columns start and end at multiples of this (or the row's end)
    label: str
    tensor: str
    scale_name: str
    out_dtype: np.dtype = np.dtype(np.float32)
    largest: float = 6.0  # the largest magnitude a code (less its zero point) decodes to

    def nodes(self) -> tuple[Node, ...]:
        raise NotImplementedError

    def parts(self, lead: Selection, rows: Any, columns: range) -> list[tuple[Node, Selection]]:
        raise NotImplementedError

    def decode(
        self, arrays: list[np.ndarray], rows: Any, columns: range
    ) -> tuple[np.ndarray, np.ndarray]:
        """The values ``(..., rows, len(columns))`` (float32, or `out_dtype` where the
        codec casts in a table) and their float32 scales ``(..., rows, groups)`` (checked
        by the node)."""
        raise NotImplementedError

    def by_bytes(self, arrays: list[np.ndarray], columns: range) -> ByteTable | None:
        """The read as two 4-bit codes a byte (`bytetable`), or None where it is not."""
        return None


class ByteTable(NamedTuple):
    """A read as `bytetable` decodes it: ``(..., rows, n)`` bytes of two codes each, the
    stored scales ``(..., rows, 2 n / group)``, their float32 values, the 16 code values."""

    packed: np.ndarray
    scales: np.ndarray
    scale_of: Callable[[np.ndarray], np.ndarray]
    codes: np.ndarray


class E2M1Codec(Codec):
    """FP4 E2M1 bytes ``(..., rows, cols / 2)``, a scale per `group` values of a row
    ``(..., rows, cols / group)``, and optionally one `global_scale` that divides
    (compressed-tensors) or multiplies (ModelOpt's ``weight_scale_2``) each scale."""

    def __init__(
        self,
        packed: Node,
        scales: Node,
        group: int,
        tensor: str,
        scale_name: str,
        table: np.ndarray = E2M1,
        global_scale: Node | None = None,
        global_op: str = "divide",
        label: str = "fp4 e2m1",
    ) -> None:
        self.packed, self.scales, self.group, self.table = packed, scales, group, table
        self.global_scale, self.global_op = global_scale, global_op
        self.tensor, self.scale_name, self.label = tensor, scale_name, label
        *lead, rows, width = packed.shape
        self.shape = (*lead, rows, width * 2)
        self.align = group

    def nodes(self) -> tuple[Node, ...]:
        extra = (self.global_scale,) if self.global_scale is not None else ()
        return (self.packed, self.scales, *extra)

    def parts(self, lead: Selection, rows: Any, columns: range) -> list[tuple[Node, Selection]]:
        groups = range(columns.start // self.group, -(-columns.stop // self.group))
        found = [
            (self.packed, (*lead, rows, range(columns.start // 2, columns.stop // 2))),
            (self.scales, (*lead, rows, groups)),
        ]
        if self.global_scale is not None:
            found.append((self.global_scale, tuple(range(n) for n in self.global_scale.shape)))
        return found

    def decode(
        self, arrays: list[np.ndarray], rows: Any, columns: range
    ) -> tuple[np.ndarray, np.ndarray]:
        scales = _float_scales(arrays[1])
        if self.global_scale is None and self.group == MXFP4_BLOCK and _exponents(arrays[1]):
            # UE8M0 scales per 32: one lookup per byte of (scale, byte) -> both values, as
            # MXFP4's; the same float32 products (exact powers of two), cast once
            packed = arrays[0].view(np.uint8)
            blocks = packed.reshape(*packed.shape[:-1], -1, MXFP4_BLOCK // 2)
            return dequantize_mxfp4(blocks, arrays[1], self.out_dtype), scales
        if self.global_scale is not None:
            value = np.float32(arrays[2].reshape(-1)[0])
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                if self.global_op == "divide":  # compressed-tensors: scale / global_scale
                    scales = (scales / value).astype(np.float32)
                else:  # ModelOpt: weight_scale.float() * weight_scale_2
                    scales = (scales * value).astype(np.float32)
        return dequantize_e2m1(arrays[0], scales, self.group, self.table), scales

    def by_bytes(self, arrays: list[np.ndarray], columns: range) -> ByteTable | None:
        if self.global_scale is None:  # UE8M0 per 32 has its own table (dequantize_mxfp4)
            return None
        value = np.float32(arrays[2].reshape(-1)[0])
        divide = self.global_op == "divide"

        def scale_of(stored: np.ndarray) -> np.ndarray:  # as `decode` computes them
            with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
                scales = _float_scales(stored)
                return (scales / value if divide else scales * value).astype(np.float32)

        return ByteTable(arrays[0].view(np.uint8), arrays[1], scale_of, self.table)


class IntCodec(Codec):
    """compressed-tensors ``pack-quantized``: `bits`-bit integers densely in int32 words
    ``(..., rows, ceil(cols * bits / 32))``, float scales ``(..., rows, cols / group)`` (one
    per row for the channel strategy, one for the tensor), and, when asymmetric, zero
    points packed along the rows ``(..., ceil(rows * bits / 32), groups)``."""

    def __init__(
        self,
        packed: Node,
        scales: Node,
        zero_points: Node | None,
        shape: tuple[int, ...],
        bits: int,
        group: int,
        tensor: str,
        scale_name: str,
        label: str,
    ) -> None:
        self.packed, self.scales, self.zero_points = packed, scales, zero_points
        self.shape, self.bits, self.group = shape, bits, group
        self.tensor, self.scale_name, self.label = tensor, scale_name, label
        self.align = math.lcm(group, 32)  # 32 values fill `bits` whole words
        self.largest = float((1 << bits) - 1)  # |q - z| at most
        # one scale serves every value, whatever its shape ((1,), (1, 1), ()): a read never
        # selects rows or groups of it
        self.per_tensor = math.prod(scales.shape) == 1

    def nodes(self) -> tuple[Node, ...]:
        extra = (self.zero_points,) if self.zero_points is not None else ()
        return (self.packed, self.scales, *extra)

    def parts(self, lead: Selection, rows: Any, columns: range) -> list[tuple[Node, Selection]]:
        words = range(
            columns.start // 32 * self.bits,
            min(self.packed.shape[-1], packed_words(columns.stop, self.bits)),
        )
        groups = range(columns.start // self.group, -(-columns.stop // self.group))
        scales = (
            tuple(range(n) for n in self.scales.shape) if self.per_tensor else (*lead, rows, groups)
        )
        found = [(self.packed, (*lead, rows, words)), (self.scales, scales)]
        if self.zero_points is not None:
            found.append((self.zero_points, (*lead, self._zero_words(rows), groups)))
        return found

    def _zero_words(self, rows: Any) -> range:
        """The words of the zero points (packed down the rows) that hold `rows`' values."""
        ends = extent(rows)
        if ends is None:
            return range(0)
        return range(ends[0] * self.bits // 32, packed_words(ends[1] + 1, self.bits))

    def decode(
        self, arrays: list[np.ndarray], rows: Any, columns: range
    ) -> tuple[np.ndarray, np.ndarray]:
        values = unpack_values(arrays[0], self.bits, len(columns))
        scales = _float_scales(arrays[1])
        if self.per_tensor:
            scales = np.broadcast_to(scales.reshape(-1)[0], (*values.shape[:-1], 1))
        zero_points = None
        if self.zero_points is not None:
            along_rows = np.swapaxes(arrays[2], -1, -2)  # (..., groups, words)
            first = self._zero_words(rows).start * 32  # the bit the words read start at
            picked = indices(rows, np.intp)
            low = int(picked.min())
            count = int(picked.max()) + 1 - low
            unpacked = unpack_signed(along_rows, self.bits, count, low * self.bits - first)
            zero_points = np.swapaxes(unpacked, -1, -2)[..., picked - low, :]
        group = min(self.group, len(columns))
        return dequantize_groups(values, scales, zero_points, group), scales

    def by_bytes(self, arrays: list[np.ndarray], columns: range) -> ByteTable | None:
        if self.bits != 4 or self.zero_points is not None or self.per_tensor:
            return None
        raw = np.ascontiguousarray(arrays[0]).astype("<i4", copy=False).view(np.uint8)
        if len(columns) % 2 or raw.shape[-1] * 2 < len(columns):
            return None
        return ByteTable(raw[..., : len(columns) // 2], arrays[1], _float_scales, _INT4)


_INT4 = np.arange(16, dtype=np.float32) - 8  # code -> q, as compressed-tensors offsets it


class GroupedDequantNode(Node):
    """The weight a `Codec` stores, read as `dtype` (float32 products, cast once)."""

    def __init__(self, codec: Codec, dtype: Any) -> None:
        self.codec, self.dtype, self.shape = codec, np.dtype(dtype), codec.shape
        codec.out_dtype = self.dtype  # a codec may produce it directly (cast in its table)
        self.overflow = _OverflowWarning(codec.tensor, self.dtype)

    def inputs(self) -> tuple[Node, ...]:
        return self.codec.nodes()

    def _columns(self, selection: Selection) -> range:
        return _aligned(selection[-1], self.codec.align, self.shape[-1])

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return self.codec.parts(selection[:-2], selection[-2], self._columns(selection))

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        held = sum(m.held_while_reading(part) for m, part in self.input_selections(selection))
        decoded = math.prod(selection_shape(selection)[:-1]) * len(self._columns(selection))
        count = math.prod(selection_shape(selection))
        return held + 3 * decoded * 4 + (0 if into else count * self.dtype.itemsize)

    def describe(self) -> str:
        return f"dequantize {self.codec.label} -> {self.dtype.name}"

    def _arrays(self, selection: Selection) -> tuple[range, list[np.ndarray]]:
        columns = self._columns(selection)
        parts = self.codec.parts(selection[:-2], selection[-2], columns)
        return columns, [node.read(part) for node, part in parts]

    def read(self, selection: Selection) -> np.ndarray:
        shape = selection_shape(selection)
        if 0 in shape:
            return np.empty(shape, self.dtype)
        columns, arrays = self._arrays(selection)
        out = aligned_empty(shape, self.dtype)
        if self._by_table(arrays, selection, columns, out):
            return out
        return self._decoded(arrays, selection, columns)

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        if 0 in selection_shape(selection):
            return
        columns, arrays = self._arrays(selection)
        if out.dtype != self.dtype or not self._by_table(arrays, selection, columns, out):
            assign(out, self._decoded(arrays, selection, columns))

    def _by_table(
        self, arrays: list[np.ndarray], selection: Selection, columns: range, out: np.ndarray
    ) -> bool:
        """Fills `out` a byte a lookup (`bytetable`) where the codec and the block allow it
        (the whole aligned columns, scales of 8 or 16 bits, few enough of them, all finite
        and within the dtype); False, with nothing written, elsewhere."""
        wanted = selection[-1]
        if not (isinstance(wanted, range) and wanted.step == 1 and wanted == columns):
            return False
        found = self.codec.by_bytes(arrays, columns)
        if found is None or self.dtype.itemsize not in (2, 4):
            return False
        packed, stored = found.packed, found.scales
        if stored.shape[:-1] != packed.shape[:-1] or packed.shape[-1] % stored.shape[-1]:
            return False
        made = bytetable.build(
            stored, found.scale_of, found.codes, self.dtype, self.codec.largest, packed.size // 2
        )
        if made is None:
            return False
        table, table_rows = made
        cols = out.shape[-1]
        # whole 8-byte lanes of rows a tile (see `_buffers.assign`'s transposes)
        step = max(8, TILE_OUT_BYTES // (cols * self.dtype.itemsize) // 8 * 8)
        for lead in np.ndindex(*packed.shape[:-2]):
            target = out[lead]
            if target.flags.c_contiguous:
                bytetable.gather_into(target, packed[lead], table_rows[lead], table)
                continue
            for start in range(0, target.shape[0], step):  # decoded, then placed from cache
                stop = min(target.shape[0], start + step)
                tile = scratch_buffer("byte table tile", (stop - start) * cols * out.itemsize)
                tile = tile.view(self.dtype).reshape(stop - start, cols)
                rows = slice(start, stop)
                bytetable.gather_into(tile, packed[lead][rows], table_rows[lead][rows], table)
                assign(target[rows], tile)
        return True

    def _decoded(
        self, arrays: list[np.ndarray], selection: Selection, columns: range
    ) -> np.ndarray:
        """The block by the codec's `decode`: float32 products, checked, cast once."""
        values, scales = self.codec.decode(arrays, selection[-2], columns)
        if not np.isfinite(scales).all():
            self._refuse(scales, arrays, selection, columns)
        limit = float(ml_dtypes.finfo(self.dtype).max)
        if scales.size and float(np.abs(scales).max()) * self.codec.largest > limit:
            self._say_overflow(values, selection, columns)
        wanted = indices(selection[-1], np.intp) - columns.start
        if len(wanted) != values.shape[-1] or (len(wanted) and wanted[0] != 0):
            values = np.take(values, wanted, axis=-1)
        with np.errstate(over="ignore"):  # an overflow was said above
            return np.ascontiguousarray(values.astype(self.dtype, copy=False))

    def _say_overflow(self, values: np.ndarray, selection: Selection, columns: range) -> None:
        """Says once (a `SutureWarning`) that values overflowed the output dtype."""
        with np.errstate(over="ignore", invalid="ignore"):
            bad = ~np.isfinite(values.astype(self.dtype, copy=False))
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            where = (*at[:-1], columns.start + at[-1])
            index = tuple(
                positions(a)[i] if n < len(at) - 1 else i
                for n, (a, i) in enumerate(zip(selection, where, strict=True))
            )
            self.overflow.say(int(bad.sum()), index, f"group of {self.codec.group}", 1.0)

    def _refuse(
        self, scales: np.ndarray, arrays: list[np.ndarray], selection: Selection, columns: range
    ) -> None:
        stored = arrays[1]
        at = tuple(int(i) for i in np.argwhere(~np.isfinite(scales))[0])
        lead = tuple(positions(a)[i] for a, i in zip(selection[:-2], at[:-2], strict=True))
        row = 0 if getattr(self.codec, "per_tensor", False) else positions(selection[-2])[at[-2]]
        group = columns.start // self.codec.group + at[-1]
        raw = np.asarray(stored.reshape(-1)[0] if stored.size == 1 else stored[at])
        exponent = raw.dtype.name in ("uint8", "float8_e8m0fnu")  # UE8M0: say the byte
        shown = f"byte {int(raw.view(np.uint8))}" if exponent else repr(float(raw))
        if getattr(self.codec, "global_scale", None) is not None:
            shown += f", global scale {float(arrays[2].reshape(-1)[0])!r}"
        raise CorruptCheckpointError(
            f"Tensor {self.codec.tensor!r} ({self.codec.label}): the scale of group "
            f"{[*lead, int(row), int(group)]} ({self.codec.scale_name!r}, stored {shown}) "
            f"gives {float(scales[at])}; expected a finite scale. The checkpoint's scales are "
            f"damaged (or its global scale is 0): take the tensor from an intact copy."
        )
