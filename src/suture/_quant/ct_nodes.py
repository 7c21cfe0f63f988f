"""Lazy nodes that quantize a 2-D weight by rows into compressed-tensors' tensors.

Every scale of W4A16, W8A16, FP8_DYNAMIC and NVFP4A16 belongs to one output row, so a read
of a block of rows of ``weight_packed`` (or ``weight``) reads those rows of the source and
nothing else; the scales found on the way are kept (a few bytes a row) for the
``weight_scale`` tensor. NVFP4's global scale needs the largest magnitude of the whole
weight (and of the projections fused with it): `GlobalScaleNode` reads them once, in
strips, before the first block.

Example:
    >>> import numpy as np, ml_dtypes
    >>> from suture._lazy.graph import MemorySource
    >>> from suture._quant.ct_scheme import ct_scheme
    >>> w = MemorySource(np.ones((4, 32), ml_dtypes.bfloat16))
    >>> parts = ct_parts(w, ct_scheme("W4A16", 32), "x.weight", None)
    >>> sorted(parts)
    ['weight_packed', 'weight_scale', 'weight_shape']
    >>> [hex(word) for word in parts["weight_packed"].read((range(1), range(4))).view(np.uint32)[0]]
    ['0xffffffff', '0xffffffff', '0xffffffff', '0xffffffff']
"""

from __future__ import annotations

import math
import re
import threading

import numpy as np

from .._errors import LossyCastError
from .._lazy.graph import MemorySource, Node
from .._lazy.selection import Selection, full, indices, outer_index, positions, selection_shape
from .ct_math import (
    FP8,
    largest_magnitude,
    nvfp4_global_scale,
    pack_fp4,
    pack_int32,
    quantize_fp8_channel,
    quantize_int,
    quantize_nvfp4,
)
from .ct_scheme import CTScheme

STRIP_BYTES = 32 << 20  # source bytes read at a time for a global scale


class GlobalScaleNode(Node):
    """NVFP4's float32 global scale (shape (1,)) shared by `sources` (fused projections):
    the smallest of their own global scales, as llm-compressor shares them."""

    def __init__(self, sources: list[Node], names: list[str]) -> None:
        self.sources, self.names = sources, names
        self.shape, self.dtype = (1,), np.dtype(np.float32)
        self._value: np.float32 | None = None
        self._lock = threading.Lock()

    def inputs(self) -> tuple[Node, ...]:
        return tuple(self.sources)

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return [(source, full(source.shape)) for source in self.sources]

    def _strip_rows(self, source: Node) -> int:
        row_bytes = max(1, math.prod(source.shape[1:]) * source.dtype.itemsize)
        return max(1, STRIP_BYTES // row_bytes)

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        strips = (
            min(source.shape[0], self._strip_rows(source)) * math.prod(source.shape[1:])
            for source in self.sources
        )
        return max(strips, default=0) * 12 + 4

    def describe(self) -> str:
        return f"nvfp4 global scale of {', '.join(self.names)}"

    def value(self) -> np.float32:
        with self._lock:
            if self._value is None:
                scales = [self._scale_of(source) for source in self.sources]
                self._value = min(scales)
            return self._value

    def _scale_of(self, source: Node) -> np.float32:
        step, largest = self._strip_rows(source), 0.0
        rest = tuple(range(length) for length in source.shape[1:])
        for start in range(0, source.shape[0], step):
            rows = range(start, min(source.shape[0], start + step))
            largest = max(largest, largest_magnitude(source.read((rows, *rest))))
        return nvfp4_global_scale(largest, source.dtype)

    def read(self, selection: Selection) -> np.ndarray:
        return outer_index(np.array([self.value()], np.float32), selection)


class _RowQuantizer:
    """One 2-D weight quantized a block of rows at a time; keeps the scales it finds."""

    def __init__(
        self, source: Node, scheme: CTScheme, name: str, global_scale: GlobalScaleNode | None
    ) -> None:
        self.source, self.scheme, self.name, self.global_scale = source, scheme, name, global_scale
        rows, cols = source.shape
        scale_cols = 1 if scheme.group is None else cols // scheme.group
        scale_dtype = FP8 if scheme.kind == "nvfp4" else source.dtype
        self.scales = np.zeros((rows, scale_cols), scale_dtype)
        self.done = np.zeros(rows, bool)

    def quantize(self, rows: range | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The stored values (packed) and the scales of source `rows`."""
        weight = self.source.read((rows, range(self.source.shape[1])))
        self._check_finite(weight, rows)
        scheme = self.scheme
        if scheme.kind == "int":
            values, scales = quantize_int(weight, scheme.bits, scheme.group)
            stored = pack_int32(values, scheme.bits)
        elif scheme.kind == "fp8":
            stored, scales = quantize_fp8_channel(weight)
        else:
            assert self.global_scale is not None
            values, scales = quantize_nvfp4(weight, self.global_scale.value())
            stored = pack_fp4(values)
        picked = indices(rows)
        self.scales[picked] = scales
        self.done[picked] = True
        return stored, scales

    def _check_finite(self, weight: np.ndarray, rows: range | np.ndarray) -> None:
        """Refuses inf and NaN: every format here would write garbage for them (an int
        cast of NaN, a NaN scale for the whole group), as compressed-tensors does."""
        finite = np.isfinite(weight)
        if finite.all():
            return
        at = tuple(int(i) for i in np.argwhere(~finite)[0])
        row = positions(rows)[at[0]]
        raise LossyCastError(
            f"Tensor {self.name!r}: element ({row}, {at[1]}) is {weight[at]} "
            f"({int((~finite).sum())} inf or NaN value(s) in rows {positions(rows)[0]} to "
            f"{positions(rows)[-1]}): {self.scheme.name} has no code for it, and its group's "
            f"scale would be NaN or inf. Fix the source's values (take the checkpoint from "
            f"before they went wrong), or keep the tensor unquantized (keep_unquantized / "
            f"--keep-unquantized '^{re.escape(self.name)}$')."
        )

    def stored_shape(self) -> tuple[tuple[int, int], np.dtype]:
        rows, cols = self.source.shape
        if self.scheme.kind == "int":
            return (rows, -(-cols * self.scheme.bits // 32)), np.dtype(np.int32)
        if self.scheme.kind == "fp8":
            return (rows, cols), FP8
        return (rows, cols // 2), np.dtype(np.uint8)


class CTPartNode(Node):
    """``weight_packed`` (or FP8 ``weight``) or ``weight_scale`` of a `_RowQuantizer`."""

    def __init__(self, quantizer: _RowQuantizer, part: str) -> None:
        self.quantizer, self.part = quantizer, part
        if part == "scale":
            self.shape, self.dtype = quantizer.scales.shape, quantizer.scales.dtype
        else:
            self.shape, self.dtype = quantizer.stored_shape()

    def inputs(self) -> tuple[Node, ...]:
        extra = () if self.quantizer.global_scale is None else (self.quantizer.global_scale,)
        return (self.quantizer.source, *extra)

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        source = self.quantizer.source
        parts: list[tuple[Node, Selection]] = [(source, (selection[0], range(source.shape[1])))]
        if self.quantizer.global_scale is not None:
            parts.append((self.quantizer.global_scale, (range(1),)))
        return parts

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        held = sum(m.held_while_reading(part) for m, part in self.input_selections(selection))
        count = len(selection[0]) * self.quantizer.source.shape[1]
        result = 0 if into else math.prod(selection_shape(selection)) * self.dtype.itemsize
        return held + 4 * count * 4 + result

    def describe(self) -> str:
        scheme = self.quantizer.scheme
        what = "scales" if self.part == "scale" else "values"
        return f"quantize {scheme.name} ({scheme.format}) {what}"

    def read(self, selection: Selection) -> np.ndarray:
        rows = selection[0]
        picked = indices(rows)
        if self.part == "scale" and self.quantizer.done[picked].all():
            result = self.quantizer.scales[picked]
        else:
            stored, scales = self.quantizer.quantize(rows)
            result = scales if self.part == "scale" else stored
        return outer_index(result, (range(len(picked)), selection[1]))


def ct_parts(
    source: Node, scheme: CTScheme, name: str, global_scale: GlobalScaleNode | None
) -> dict[str, Node]:
    """The tensors that replace a 2-D ``weight`` `source` (named `name`), by suffix:
    ``weight_packed``, ``weight_scale``, ``weight_shape`` (W4A16, W8A16), ``weight``,
    ``weight_scale`` (FP8_DYNAMIC), ``weight_packed``, ``weight_scale``,
    ``weight_global_scale`` (NVFP4A16, `global_scale` its shared node)."""
    quantizer = _RowQuantizer(source, scheme, name, global_scale)
    values, scales = CTPartNode(quantizer, "values"), CTPartNode(quantizer, "scale")
    if scheme.kind == "fp8":
        return {"weight": values, "weight_scale": scales}
    if scheme.kind == "nvfp4":
        assert global_scale is not None
        return {
            "weight_packed": values,
            "weight_scale": scales,
            "weight_global_scale": global_scale,
        }
    shape = MemorySource(np.array(source.shape, np.int64))
    return {"weight_packed": values, "weight_scale": scales, "weight_shape": shape}
