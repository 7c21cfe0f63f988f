"""Views of one input: index, cast, transpose and reshape nodes.

Each passes a read's selection to its input (composed, permuted, or kept for the leading
axes a reshape keeps), so a view of a view is still one read of the source.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from .._buffers import aligned_empty, assign
from .._dtypes import cast_changes, cast_loss
from .._errors import LossyCastError
from .graph import Node, selected_bytes
from .selection import (
    Selection,
    compose,
    full,
    indices,
    is_full,
    outer_index,
    positions,
    selection_shape,
)


class IndexNode(Node):
    """``base[index]``: a selection of `base`, minus integer-indexed axes, plus new axes."""

    def __init__(
        self,
        base: Node,
        selection: Selection,
        dropped_axes: tuple[int, ...],
        new_axes: tuple[int, ...],
        shape: tuple[int, ...],
    ) -> None:
        self.base, self.selection = base, selection
        self.dropped_axes, self.new_axes = dropped_axes, new_axes
        self.shape, self.dtype = shape, base.dtype
        kept_axes = [axis for axis in range(len(base.shape)) if axis not in dropped_axes]
        # For each result axis: the base axis it comes from, or None for a new axis.
        self._origin_axes: list[int | None] = []
        kept = iter(kept_axes)
        for position in range(len(shape)):
            self._origin_axes.append(None if position in new_axes else next(kept))

    def base_selection(self, selection: Selection) -> Selection:
        """What `selection` of this view reads of `base`."""
        base_selection = list(self.selection)
        for position, base_axis in enumerate(self._origin_axes):
            if base_axis is not None:
                base_selection[base_axis] = compose(self.selection[base_axis], selection[position])
        return tuple(base_selection)

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return [(self.base, self.base_selection(selection))]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        if self.new_axes:  # built as a temporary (np.take may copy it again)
            held = self.base.held_while_reading(self.base_selection(selection))
            return held + selected_bytes(self, selection)
        return self.base.held_while_reading(self.base_selection(selection), into=into)

    def describe(self) -> str:
        return "slice"

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        if self.new_axes:
            super().read_into(selection, out)
            return
        # the dropped (integer-indexed) axes as length-1 axes of a view of `out`: no temporary
        self.base.read_into(self.base_selection(selection), np.expand_dims(out, self.dropped_axes))

    def read(self, selection: Selection) -> np.ndarray:
        base_selection = list(self.base_selection(selection))
        values = self.base.read(tuple(base_selection))
        kept_shape = [
            len(base_selection[axis])
            for axis in range(len(self.base.shape))
            if axis not in self.dropped_axes
        ]
        values = values.reshape(kept_shape)
        for position in self.new_axes:
            values = np.expand_dims(values, position)
            wanted = selection[position]
            if not (isinstance(wanted, range) and wanted == range(1)):  # x[None][[0, 0]]
                picked = indices(wanted)
                values = np.take(values, picked, axis=position)
        return values

    def inputs(self) -> tuple[Node, ...]:
        return (self.base,)


class CastNode(Node):
    """`base` converted to `dtype` as it is read."""

    def __init__(self, base: Node, dtype: np.dtype) -> None:
        self.base, self.shape, self.dtype = base, base.shape, dtype

    def read(self, selection: Selection) -> np.ndarray:
        result = aligned_empty(selection_shape(selection), self.dtype)
        self.base.read_into(selection, result)  # the base casts as it fills: no temporary
        return result

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return [(self.base, selection)]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        held = self.base.held_while_reading(selection, into=True)
        return held + (0 if into else selected_bytes(self, selection))

    def describe(self) -> str:
        return f"cast {self.dtype.name}"

    @property
    def stack_axis(self) -> int | None:
        return self.base.stack_axis

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        if out.dtype == self.dtype:
            self.base.read_into(selection, out)
        else:  # cast to this node's dtype first: casting straight to out's could round once less
            assign(out, self.read(selection))

    def inputs(self) -> tuple[Node, ...]:
        return (self.base,)


_checking = contextvars.ContextVar("suture_strict_casts", default=False)


@contextlib.contextmanager
def strict_casts(on: bool = True) -> Iterator[None]:
    """Casts that `LazyArray.astype` makes meanwhile check their values (`CheckedCastNode`).

    Only casts that `cast_loss` flags are checked: precision-only narrowing (float32 ->
    bfloat16) stays a plain cast. The flag is read when the graph is built, not when it is
    read, so a lazy tree built inside keeps its checks wherever it is saved.
    """
    token = _checking.set(on)
    try:
        yield
    finally:
        _checking.reset(token)


def checking_casts() -> bool:
    """Whether casts made now are checked (inside `strict_casts`)."""
    return _checking.get()


class CheckedCastNode(CastNode):
    """A cast that can destroy values, checked as it is read: a value the cast changes
    beyond rounding (300.0 to int8) is a `LossyCastError` naming the leaf and the element.

    Reads `base` in its own dtype first (one temporary block), then casts.
    """

    def __init__(self, base: Node, dtype: np.dtype, path: str | None = None) -> None:
        super().__init__(base, dtype)
        self.path = path
        self.loss = cast_loss(base.dtype, dtype)

    def read(self, selection: Selection) -> np.ndarray:
        values = self.base.read(selection)
        result = aligned_empty(values.shape, self.dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            np.copyto(result, values, casting="unsafe")
        changed = cast_changes(values, result)
        if changed.any():
            at = tuple(int(i) for i in np.argwhere(changed)[0])
            index = tuple(positions(axis)[i] for axis, i in zip(selection, at, strict=True))
            raise LossyCastError(
                f"Leaf {self.path or '(unnamed)'!r}: casting {self.base.dtype.name} to "
                f"{self.dtype.name} changes element {index} from {values[at]} to "
                f"{result[at]} ({int(changed.sum())} value(s) of this block do not fit: "
                f"{self.loss}). Clip or rescale the values first, or cast to a dtype that "
                f"holds them; without strict_casts=True the cast changes them silently."
            )
        return result

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        assign(out, self.read(selection))

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        held = self.base.held_while_reading(selection) + selected_bytes(self, selection)
        return held + math.prod(selection_shape(selection)) * (1 + self.base.dtype.itemsize)

    def describe(self) -> str:
        return f"cast {self.dtype.name} (checked)"


class TransposeNode(Node):
    """`base` with its axes permuted: result axis ``j`` is base axis ``axes[j]``."""

    def __init__(self, base: Node, axes: tuple[int, ...]) -> None:
        self.base, self.axes = base, axes
        self.shape = tuple(base.shape[axis] for axis in axes)
        self.dtype = base.dtype

    def _base_selection(self, selection: Selection) -> Selection:
        base_selection: list[Any] = [None] * len(self.axes)
        for position, base_axis in enumerate(self.axes):
            base_selection[base_axis] = selection[position]
        return tuple(base_selection)

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return [(self.base, self._base_selection(selection))]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        return self.base.held_while_reading(self._base_selection(selection), into=into)

    def describe(self) -> str:
        return "transpose"

    def read(self, selection: Selection) -> np.ndarray:
        return self.base.read(self._base_selection(selection)).transpose(self.axes)

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        target = out.transpose(np.argsort(self.axes))
        self.base.read_into(self._base_selection(selection), target)

    def inputs(self) -> tuple[Node, ...]:
        return (self.base,)


class ReshapeNode(Node):
    """`base` reshaped (C order). Leading axes that the reshape keeps are read selectively."""

    def __init__(self, base: Node, shape: tuple[int, ...]) -> None:
        self.base, self.shape, self.dtype = base, shape, base.dtype
        kept = 0
        while kept < min(len(shape), len(base.shape)) - 1 and shape[kept] == base.shape[kept]:
            kept += 1
        self.kept_leading_axes = kept

    def _base_selection(self, selection: Selection) -> Selection:
        """The kept leading axes as selected, the rest whole."""
        kept = self.kept_leading_axes
        return tuple(selection[:kept]) + full(self.base.shape[kept:])

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return [(self.base, self._base_selection(selection))]

    def describe(self) -> str:
        return "reshape"

    def read(self, selection: Selection) -> np.ndarray:
        kept = self.kept_leading_axes
        values = self.base.read(self._base_selection(selection))
        values = values.reshape(selection_shape(selection[:kept]) + self.shape[kept:])
        trailing = tuple(range(length) for length in selection_shape(selection[:kept]))
        return outer_index(values, trailing + tuple(selection[kept:]))

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        kept = self.kept_leading_axes
        base_selection = self._base_selection(selection)
        if not is_full(selection[kept:], self.shape[kept:]):
            super().read_into(selection, out)
            return
        # the same memory in the base's shape, so the base fills `out` itself; where `out`'s
        # strides do not allow that, reshape copies (new memory) and `out` is filled as usual
        target = out.reshape(selection_shape(base_selection))
        if not np.may_share_memory(target, out):
            super().read_into(selection, out)
            return
        self.base.read_into(base_selection, target)

    def inputs(self) -> tuple[Node, ...]:
        return (self.base,)
