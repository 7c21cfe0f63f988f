"""Computed nodes: functions whose input axes follow output axes, and broadcasts.

A `ComputeNode` is how products (``a @ b``, einsum), elementwise functions, reductions and
traced ``jnp`` primitives stay lazy and blockable: it knows, for each input axis, which
output axis it runs along, so a selection of the output becomes a selection of each input.
A `MapNode` is a user function (`suture.map`): over whole arrays, or elementwise, when it
passes the selection through.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._dtypes import cast_changes, cast_loss
from .._errors import LossyCastError, ShapeMismatchError
from .graph import Node, selected_bytes
from .selection import Selection, is_full, outer_index, selection_shape


class ComputeNode(Node):
    """``fn(*inputs)`` where each input axis either follows an output axis or is read whole.

    ``axis_maps[i][d]`` is the output axis that axis ``d`` of input ``i`` runs along (its
    elements are the output's elements on that axis), or None when the function needs that
    axis whole (a contracted or reduced axis). Reading a selection of the output reads the
    same selection of every followed axis: ``(a @ b)[rows]`` reads ``a[rows]`` and all of
    ``b``; an elementwise function reads just the selected elements. `fn` must accept inputs
    of any length along followed axes (einsum, reductions, elementwise functions do).
    Output axes that no input follows are computed whole and then selected.

    Example:
        >>> from suture._lazy.graph import MemorySource
        >>> a = MemorySource(np.arange(6.0).reshape(3, 2))
        >>> b = MemorySource(np.ones((2, 4)))
        >>> product = ComputeNode(np.matmul, [a, b], [(0, None), (None, 1)], (3, 4),
        ...                       np.dtype("float64"), "matmul")
        >>> product.read((range(1, 2), range(4))).tolist()
        [[5.0, 5.0, 5.0, 5.0]]
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        inputs: Sequence[Node],
        axis_maps: Sequence[Sequence[int | None]],
        shape: tuple[int, ...],
        dtype: np.dtype,
        name: str,
    ) -> None:
        self.fn, self.members, self.name = fn, tuple(inputs), name
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.axis_maps = tuple(tuple(axes) for axes in axis_maps)
        self._carried = {
            out
            for member, axes in zip(self.members, self.axis_maps, strict=True)
            for length, out in zip(member.shape, axes, strict=True)
            if out is not None and length == self.shape[out]
        }

    @property
    def splits_rows(self) -> bool:
        """Whether a block of output rows needs only the matching rows of some input."""
        return 0 in self._carried

    @property
    def computes_whole(self) -> bool:
        return not self.splits_rows

    def working_bytes(self, output_bytes: int) -> int:
        """Bytes held while computing an output of `output_bytes`: its inputs and result."""
        whole = math.prod(self.shape) * self.dtype.itemsize
        fraction = output_bytes / whole if whole else 1.0
        held = output_bytes
        for member, axes in zip(self.members, self.axis_maps, strict=True):
            member_bytes = math.prod(member.shape) * member.dtype.itemsize
            follows_rows = 0 in axes and self.splits_rows
            held += int(member_bytes * fraction) if follows_rows else member_bytes
        return held

    @property
    def reads_whole(self) -> bool:
        """Whether every read takes its inputs whole (no axis follows the output)."""
        return not self._carried

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        """Each input, with what it gives for `selection` of the output.

        Example:
            >>> from suture._lazy.graph import MemorySource
            >>> a, b = MemorySource(np.ones((3, 2))), MemorySource(np.ones((2, 4)))
            >>> product = ComputeNode(np.matmul, [a, b], [(0, None), (None, 1)], (3, 4),
            ...                       np.dtype("float64"), "matmul")
            >>> [part for _, part in product.input_selections((range(1, 2), range(4)))]
            [(range(1, 2), range(0, 2)), (range(0, 2), range(0, 4))]
        """
        chosen: list[tuple[Node, Selection]] = []
        for member, axes in zip(self.members, self.axis_maps, strict=True):
            per_axis: list[Any] = []
            for length, out in zip(member.shape, axes, strict=True):
                if out is None:
                    per_axis.append(range(length))
                elif length == self.shape[out]:
                    per_axis.append(selection[out])
                else:  # a length-1 axis the function broadcasts
                    per_axis.append(range(length))
            chosen.append((member, tuple(per_axis)))
        return chosen

    def describe(self) -> str:
        whole = self.reads_whole and any(member.shape for member in self.members)
        return f"{self.name} (reads inputs whole)" if whole else self.name

    def read(self, selection: Selection) -> np.ndarray:
        values = [member.read(chosen) for member, chosen in self.input_selections(selection)]
        result = np.asarray(self.fn(*values))
        expected = tuple(
            len(selection[axis]) if axis in self._carried else length
            for axis, length in enumerate(self.shape)
        )
        if result.shape != expected:
            raise ShapeMismatchError(
                f"{self.name} returned shape {result.shape} for a read that expects {expected}."
            )
        result = result.astype(self.dtype, copy=False)
        remaining = tuple(
            range(len(selection[axis])) if axis in self._carried else selection[axis]
            for axis in range(len(self.shape))
        )
        return result if is_full(remaining, result.shape) else outer_index(result, remaining)

    def inputs(self) -> tuple[Node, ...]:
        return self.members


class BroadcastNode(Node):
    """`base` broadcast to `shape`; base axis ``d`` becomes output axis ``axes[d]``.

    Only the selected elements of `base` are read; a length-1 axis is read once.
    """

    def __init__(self, base: Node, shape: tuple[int, ...], axes: Sequence[int]) -> None:
        self.base, self.shape, self.dtype = base, tuple(shape), base.dtype
        self.axes = tuple(axes)

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        chosen = tuple(
            selection[out] if length == self.shape[out] else range(length)
            for length, out in zip(self.base.shape, self.axes, strict=True)
        )
        return [(self.base, chosen)]

    def describe(self) -> str:
        return "broadcast"

    def read(self, selection: Selection) -> np.ndarray:
        ((_, chosen),) = self.input_selections(selection)
        values = self.base.read(chosen)
        expanded = [1] * len(self.shape)
        for length, out in zip(values.shape, self.axes, strict=True):
            expanded[out] = length
        return np.array(np.broadcast_to(values.reshape(expanded), selection_shape(selection)))

    def inputs(self) -> tuple[Node, ...]:
        return (self.base,)


class MapNode(Node):
    """``fn(*inputs)`` computed when read.

    An `elementwise` function (output element ``i`` depends only on input elements ``i``,
    all shapes equal) reads only the selected elements of its inputs; any other function
    reads its inputs whole.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        inputs: Sequence[Node],
        shape: tuple[int, ...],
        dtype: np.dtype,
        elementwise: bool,
        name: str,
        path: str | None = None,
    ) -> None:
        self.fn, self.members, self.path = fn, tuple(inputs), path
        self.shape, self.dtype, self.elementwise, self.name = shape, dtype, elementwise, name

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        if self.elementwise:
            return [(member, selection) for member in self.members]
        return super().input_selections(selection)

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        inputs = sum(m.held_while_reading(part) for m, part in self.input_selections(selection))
        selected = selected_bytes(self, selection)
        if self.elementwise:
            # the function's temporaries, its result and a cast of it, all the size of the
            # selection; counted at the selection the map sees: a stack of maps computes
            # one at a time
            return inputs + self._temporaries(selected) + 2 * selected
        whole = math.prod(self.shape) * self.dtype.itemsize
        return inputs + selected + self._temporaries(whole)  # computed whole, then selected

    def _temporaries(self, output_bytes: int) -> int:
        """Working memory of the function producing `output_bytes`: a temporary per input,
        and one more."""
        return (len(self.members) + 1) * output_bytes

    def describe(self) -> str:
        return f"map {self.name}"

    @property
    def computes_whole(self) -> bool:
        return not self.elementwise

    @property
    def stack_axis(self) -> int | None:
        return self.members[0].stack_axis if self.elementwise and len(self.members) == 1 else None

    def read(self, selection: Selection) -> np.ndarray:
        values = self.fn(*(member.read(part) for member, part in self.input_selections(selection)))
        if self.elementwise:
            return self._checked(values, selection_shape(selection))
        values = self._checked(values, self.shape)
        return values if is_full(selection, self.shape) else outer_index(values, selection)

    def _checked(self, values: Any, expected_shape: tuple[int, ...]) -> np.ndarray:
        array = np.asarray(values)
        if array.shape != expected_shape:
            raise ShapeMismatchError(
                f"suture.map({self.name}) returned shape {array.shape}, expected "
                f"{expected_shape}. Pass the right shape= to suture.map, or fix the function."
            )
        if array.dtype != self.dtype:
            if not np.can_cast(array.dtype, self.dtype, casting="same_kind"):
                raise ShapeMismatchError(
                    f"suture.map({self.name}) returned dtype {array.dtype}, expected "
                    f"{self.dtype}. Pass dtype={array.dtype.name!r} to suture.map, or cast "
                    f"inside the function."
                )
            array = self._cast(array)
        return array

    def _cast(self, array: np.ndarray) -> np.ndarray:
        """`array` in the declared dtype; a cast that changes a value beyond a float's
        rounding (3000 to int8, 1e39 to float32) is refused, as strict casts refuse it."""
        loss = cast_loss(array.dtype, self.dtype)
        with np.errstate(over="ignore", invalid="ignore"):
            cast = array.astype(self.dtype)
        if loss is None:
            return cast
        changed = cast_changes(array, cast)
        if changed.any():
            at = tuple(int(i) for i in np.argwhere(changed)[0])
            raise LossyCastError(
                f"suture.map({self.name}) of leaf {self.path or '(unnamed)'!r} returns "
                f"{array.dtype.name} values, declared dtype={self.dtype.name!r}: "
                f"{int(changed.sum())} value(s) of a block do not fit ({loss}), the first "
                f"{array[at]} becomes {cast[at]} (element {at} of the block). Declare "
                f"dtype={array.dtype.name!r} (or one that holds the values), or clip or "
                f"rescale inside the function."
            )
        return cast

    def inputs(self) -> tuple[Node, ...]:
        return self.members
