"""Joins of several inputs: stack, concatenate, and pad (an input fitted to a shape).

A read touches only the members its selection reaches: ``stack(xs)[3]`` reads ``xs[3]``;
a slice of a concatenation reads the parts of the members it covers; a pad reads only
the part of its input inside the bounds.

A stack whose members come from a remote store (a bucket, an HTTP server) reads up to
`REMOTE_MEMBER_READS` members at once, each into its place: one after another, each
member's round trips and transfer would add up (a block of eight layers of a safetensors
folder on a bucket took eight ranged reads in a row). Its memory counts each member being
read at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .._buffers import aligned_empty, assign
from .graph import Node, selected_bytes
from .selection import (
    AxisSelection,
    Selection,
    as_range,
    indices,
    positions,
    selection_shape,
    to_slice,
)

REMOTE_MEMBER_READS = 8  # members of a stack read at once from a remote store


class StackNode(Node):
    """`members` stacked along a new `axis`."""

    def __init__(self, members: Sequence[Node], axis: int, dtype: np.dtype) -> None:
        self.members, self.axis, self.dtype = tuple(members), axis, dtype
        member_shape = members[0].shape
        self.shape = member_shape[:axis] + (len(members),) + member_shape[axis:]
        self._remote: bool | None = None

    @property
    def reads_at_once(self) -> int:
        """Members read at once: several when a member reads from a remote store, else one."""
        if self._remote is None:
            self._remote = any(_reads_remote(member) for member in self.members)
        return REMOTE_MEMBER_READS if self._remote else 1

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        member_selection = selection[: self.axis] + selection[self.axis + 1 :]
        touched = sorted(set(positions(selection[self.axis])))
        return [(self.members[member], member_selection) for member in touched]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        # each member is read into its place; `reads_at_once` of them at a time
        each = sorted(
            (m.held_while_reading(part, into=True) for m, part in self.input_selections(selection)),
            reverse=True,
        )
        held = sum(each[: self.reads_at_once])
        return held + (0 if into else selected_bytes(self, selection))

    def describe(self) -> str:
        return f"stack {len(self.members)} on axis {self.axis}{_promoted(self)}"

    @property
    def stack_axis(self) -> int | None:
        return self.axis

    def read(self, selection: Selection) -> np.ndarray:
        result = aligned_empty(selection_shape(selection), self.dtype)
        self.read_into(selection, result)
        return result

    def read_into(self, selection: Selection, out: np.ndarray) -> None:
        if out.dtype != self.dtype and any(m.dtype != self.dtype for m in self.members):
            assign(out, self.read(selection))  # promote first, as `read` does
            return
        member_selection = selection[: self.axis] + selection[self.axis + 1 :]
        # one read per selected position (a repeated member is read again, into its place)
        parts = list(enumerate(positions(selection[self.axis])))

        def read_member(part: tuple[int, int]) -> None:
            position, member = part
            target = (slice(None),) * self.axis + (position,)
            self.members[member].read_into(member_selection, out[target])

        at_once = min(self.reads_at_once, len(parts))
        if at_once <= 1:
            for part in parts:
                read_member(part)
            return
        # threads of this read alone (no shared pool: a stack of stacks cannot starve one)
        with ThreadPoolExecutor(max_workers=at_once) as pool:
            for _ in pool.map(read_member, parts):
                pass

    def inputs(self) -> tuple[Node, ...]:
        return self.members


class ConcatNode(Node):
    """`members` joined along an existing `axis`."""

    def __init__(self, members: Sequence[Node], axis: int, dtype: np.dtype) -> None:
        self.members, self.axis, self.dtype = tuple(members), axis, dtype
        lengths = [member.shape[axis] for member in members]
        self._offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        first = members[0].shape
        self.shape = first[:axis] + (int(self._offsets[-1]),) + first[axis + 1 :]

    def _parts(self, selection: Selection) -> list[tuple[Node, Selection, AxisSelection]]:
        """``(member, its selection, positions of the result along the axis)`` for each
        member the selection touches, in member order: one read per member."""
        wanted = indices(selection[self.axis])
        if len(wanted) == 0:
            return []
        owners = np.searchsorted(self._offsets[1:], wanted, side="right")
        order = np.argsort(owners, kind="stable")
        touched, starts = np.unique(owners[order], return_index=True)
        parts: list[tuple[Node, Selection, AxisSelection]] = []
        for owner, where in zip(touched.tolist(), np.split(order, starts[1:]), strict=True):
            local = as_range(wanted[where] - self._offsets[owner])
            member_selection = selection[: self.axis] + (local,) + selection[self.axis + 1 :]
            parts.append((self.members[owner], member_selection, as_range(where)))
        return parts

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        return [(member, part) for member, part, _ in self._parts(selection)]

    def held_while_reading(self, selection: Selection, into: bool = False) -> int:
        held = max(  # members are read one after another into the result (see `read`)
            (
                member.held_while_reading(part, into=isinstance(where, range))
                for member, part, where in self._parts(selection)
            ),
            default=0,
        )
        return held + selected_bytes(self, selection)

    def describe(self) -> str:
        return f"concat {len(self.members)} on axis {self.axis}{_promoted(self)}"

    def read(self, selection: Selection) -> np.ndarray:
        result = np.empty(selection_shape(selection), self.dtype)
        for member, part, where in self._parts(selection):
            if isinstance(where, range):  # a view of the result: the member fills it
                member.read_into(part, result[(slice(None),) * self.axis + (to_slice(where),)])
            else:
                result[(slice(None),) * self.axis + (where,)] = member.read(part)
        return result

    def inputs(self) -> tuple[Node, ...]:
        return self.members


class PadNode(Node):
    """`base` zero-padded at the end of each axis up to `shape`; only its in-bounds part is read."""

    def __init__(self, base: Node, shape: tuple[int, ...]) -> None:
        self.base, self.shape, self.dtype = base, shape, base.dtype

    def _inside(self, selection: Selection) -> tuple[Selection, Selection] | None:
        """Where the selection is within `base` (the result's positions per axis, and the
        base's selection), or None when it is all padding. A range stays a range, worked out
        arithmetically: a pad to 10**13 rows lists none of them."""
        inside_positions, base_selection = [], []
        for axis_selection, base_length in zip(selection, self.base.shape, strict=True):
            if isinstance(axis_selection, range):
                kept = _below(axis_selection, base_length)
                inside, base = range(kept.start, kept.stop), axis_selection[kept]
            else:
                indices = np.asarray(axis_selection, dtype=np.int64)
                where = np.flatnonzero(indices < base_length)
                inside, base = as_range(where), as_range(indices[where])
            if len(inside) == 0:
                return None
            inside_positions.append(inside)
            base_selection.append(base)
        return tuple(inside_positions), tuple(base_selection)

    def input_selections(self, selection: Selection) -> list[tuple[Node, Selection]]:
        inside = self._inside(selection)
        return [] if inside is None else [(self.base, inside[1])]

    def describe(self) -> str:
        return "pad"

    def read(self, selection: Selection) -> np.ndarray:
        result = np.zeros(selection_shape(selection), self.dtype)
        inside = self._inside(selection)
        if inside is not None:
            places, base = inside
            if all(isinstance(place, range) for place in places):
                result[tuple(to_slice(place) for place in places)] = self.base.read(base)
            else:
                where = np.ix_(*(indices(place) for place in places))
                result[where] = self.base.read(base)
        return result

    def inputs(self) -> tuple[Node, ...]:
        return (self.base,)


def _below(axis: range, length: int) -> slice:
    """The slice of `axis`'s positions whose index is below `length`, without listing them
    (a range of indices is increasing or decreasing, so they are one run)."""
    count = len(axis)
    if count == 0:
        return slice(0, 0)
    if axis.step > 0:
        first_out = 0 if axis.start >= length else -(-(length - axis.start) // axis.step)
        return slice(0, min(count, first_out))
    first_in = 0 if axis.start < length else -(-(axis.start - length + 1) // -axis.step)
    return slice(min(count, first_in), count)


def _reads_remote(node: Node) -> bool:
    """Whether reading `node` reads a remote source (a bucket, an HTTP server)."""
    pending = [node]
    while pending:
        current = pending.pop()
        if getattr(current, "remote", False):
            return True
        pending.extend(current.inputs())
    return False


def _promoted(node: StackNode | ConcatNode) -> str:
    """`` as <dtype>`` when joining converts some member, else nothing."""
    same = all(member.dtype == node.dtype for member in node.members)
    return "" if same else f" as {node.dtype.name}"
