"""Several Hugging Face tensors into one target leaf, interleaved head by head, and back.

A table leaf with ``hf: [A, B, ...]`` and ``interleave:`` cuts each source along `axis` into
its parts (``parts``: one list of lengths per source; ``null``, or no ``parts`` at all, for
"the rest", shared evenly among the sources that say so), cuts every part into `groups` equal
runs (one per head), and writes group 0's run of every part, in order, then group 1's, and so
on. The table's ``ops`` then run on the joined tensor. Back, the ops run backwards, the tensor
is cut into its groups and the runs are put back in their sources: the exact inverse, a pure
rearrangement of the values.

MaxText's Qwen3.5 ``in_proj_qkvz`` is one: HF's ``in_proj_qkv`` (parts q, k, v) and
``in_proj_z`` (the rest), grouped by key head.

Example:
    >>> from suture._lazy.array import as_lazy
    >>> spec = parse_interleave({"groups": 2, "parts": [[2, 2], None]}, 2, "t")
    >>> joined = spec.join([as_lazy(list(range(4))), as_lazy(list(range(10, 14)))], {})
    >>> joined.read().tolist()
    [0, 2, 10, 11, 1, 3, 12, 13]
    >>> [part.read().tolist() for part in spec.split(joined, {}, ("qk", "z"))]
    [[0, 1, 2, 3], [10, 11, 12, 13]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._errors import ConfigMismatchError, RecipeFormatError
from .._lazy.array import LazyArray
from .._lazy.combine import concatenate
from ._expr import whole

KEYS = ("groups", "parts", "axis")
MAX_AXIS = 32


@dataclass(frozen=True)
class Interleave:
    groups: Any  # expression: how many groups (heads) each part is cut into
    parts: tuple[tuple[Any, ...] | None, ...]  # per source: its parts' lengths, None: the rest
    axis: int = 0  # the axis of the HF tensors that is cut

    def expressions(self) -> list[Any]:
        return [self.groups, *(size for sizes in self.parts if sizes for size in sizes)]

    def describe(self) -> str:
        return f"interleaved by {self.groups} groups on axis {self.axis}"

    def _groups(self, names: dict[str, Any]) -> int:
        return whole(self.groups, names, "the count of groups an interleave cuts into")

    def _lengths(self, total: int, names: dict[str, Any], where: str) -> list[list[int]]:
        """Each source's parts' lengths (per group, run lengths), the rest shared out, given
        the length `total` of one group's run in the joined tensor."""
        given = [
            None if sizes is None else [whole(s, names, "the length of a part") for s in sizes]
            for sizes in self.parts
        ]
        groups = self._groups(names)
        runs: list[list[int] | None] = []
        for sizes in given:
            if sizes is not None and any(size % groups for size in sizes):
                raise ConfigMismatchError(
                    f"{where}: the parts {sizes} ({', '.join(map(str, self._sizes_text()))}) do "
                    f"not divide into {groups} groups ({self.groups}). The config does not fit "
                    f"this tensor: check its head counts."
                )
            runs.append(None if sizes is None else [size // groups for size in sizes])
        rest = total - sum(sum(r) for r in runs if r is not None)
        open_count = sum(r is None for r in runs)
        if rest < 0 or (open_count and rest % open_count) or (not open_count and rest):
            raise ConfigMismatchError(
                f"{where}: one group's run is {total} long, and the parts "
                f"({', '.join(map(str, self._sizes_text()))}) of the config take "
                f"{total - rest}{' with nothing left over' if not open_count else ''}. The "
                f"config does not fit this tensor: check its head counts and head sizes."
            )
        share = rest // open_count if open_count else 0
        return [r if r is not None else [share] for r in runs]

    def _sizes_text(self) -> list[str]:
        return [
            "the rest" if sizes is None else " + ".join(map(str, sizes)) for sizes in self.parts
        ]

    def join(self, arrays: list[LazyArray], names: dict[str, Any]) -> LazyArray:
        """The sources `arrays` (in the table's order) interleaved into one tensor."""
        groups = self._groups(names)
        first = arrays[0]
        for array in arrays:
            self._check_rank(array)
            others = array.shape[: self.axis] + array.shape[self.axis + 1 :]
            if others != first.shape[: self.axis] + first.shape[self.axis + 1 :]:
                raise ConfigMismatchError(
                    f"Tensors {first.path!r} {first.shape} and {array.path!r} {array.shape} "
                    f"are interleaved on axis {self.axis}, and their other axes differ."
                )
            if array.shape[self.axis] % groups:
                raise ConfigMismatchError(
                    f"Tensor {array.path!r}: axis {self.axis} has length "
                    f"{array.shape[self.axis]}, which does not divide into {groups} groups "
                    f"({self.groups}). The checkpoint does not fit its config.json."
                )
        total = sum(array.shape[self.axis] for array in arrays) // groups
        where = f"Tensors {', '.join(repr(a.path) for a in arrays)}"
        lengths = self._lengths(total, names, where)
        pieces = []
        for array, runs in zip(arrays, lengths, strict=True):
            if sum(runs) * groups != array.shape[self.axis]:
                raise ConfigMismatchError(
                    f"Tensor {array.path!r}: axis {self.axis} has length "
                    f"{array.shape[self.axis]}, and the config makes its parts "
                    f"{[run * groups for run in runs]} (interleave parts "
                    f"{', '.join(self._sizes_text())}). The checkpoint does not fit its "
                    f"config.json: check its head counts and head sizes."
                )
            start = 0  # each part cut out first, then into its groups
            for run in runs:
                part = array[self._cut(start, start + run * groups, self.axis)]
                pieces.append(self._grouped(part, groups))
                start += run * groups
        joined = concatenate(pieces, axis=self.axis + 1)
        shape = joined.shape
        return joined.reshape(shape[: self.axis] + (groups * total,) + shape[self.axis + 2 :])

    def split(
        self, array: LazyArray, names: dict[str, Any], sources: tuple[str, ...]
    ) -> list[LazyArray]:
        """The sources back from their interleaved `array`: `join`'s exact inverse."""
        groups = self._groups(names)
        self._check_rank(array)
        length = array.shape[self.axis]
        if length % groups:
            raise ConfigMismatchError(
                f"Leaf {array.path!r}: axis {self.axis} has length {length}, which does not "
                f"divide into {groups} groups ({self.groups}) to give back "
                f"{', '.join(sources)}. The config does not fit this tensor."
            )
        lengths = self._lengths(length // groups, names, f"Leaf {array.path!r}")
        grouped = self._grouped(array, groups)
        out, start = [], 0
        for runs in lengths:
            parts = []
            for run in runs:
                part = grouped[self._cut(start, start + run, self.axis + 1)]
                shape = part.shape
                parts.append(
                    part.reshape(shape[: self.axis] + (groups * run,) + shape[self.axis + 2 :])
                )
                start += run
            out.append(parts[0] if len(parts) == 1 else concatenate(parts, axis=self.axis))
        return out

    def _grouped(self, array: LazyArray, groups: int) -> LazyArray:
        shape = array.shape
        axis = self.axis
        return array.reshape(shape[:axis] + (groups, shape[axis] // groups) + shape[axis + 1 :])

    @staticmethod
    def _cut(start: int, stop: int, axis: int) -> tuple[slice, ...]:
        return (slice(None),) * axis + (slice(start, stop),)

    def _check_rank(self, array: LazyArray) -> None:
        if self.axis >= array.ndim:
            raise ConfigMismatchError(
                f"Tensor {array.path!r} (shape {array.shape}) has no axis {self.axis} to "
                f"interleave: check the table's interleave axis."
            )


def parse_interleave(spec: dict[str, Any], sources: int, where: str) -> Interleave:
    """An `Interleave` of `sources` tensors from a (schema-checked) table entry."""
    parts = spec.get("parts")
    if parts is None:
        parts = [None] * sources
    if len(parts) != sources:
        raise RecipeFormatError(f"{where}: interleave has {len(parts)} parts for {sources} hf.")
    return Interleave(
        spec["groups"],
        tuple(None if sizes is None else tuple(sizes) for sizes in parts),
        int(spec.get("axis", 0)),
    )


def check_interleave(table: Any, spec: Any, entry: str, leaf: dict) -> dict[str, Any]:
    """`spec`, the interleave of table entry `leaf`, checked against the table format
    (`_schema`'s `table` collects the problems); its expressions as the table's `Expression`."""
    spec = table.mapping(spec, entry, KEYS)
    out = dict(spec)
    hf = leaf.get("hf")
    if not isinstance(hf, list) or len(hf) < 2:
        table.problem(entry, "goes with hf: [NAME, NAME, ...], the tensors it interleaves")
    elif "fused" in leaf or any("{expert}" in str(name) for name in hf):
        table.problem(entry, "joins whole tensors: not with 'fused' or {expert}")
    if "groups" not in spec:
        table.problem(entry, "needs groups: EXPRESSION (how many heads each part is cut into)")
    out["groups"] = table.expression(spec.get("groups", 1), f"{entry}.groups")
    axis = spec.get("axis", 0)
    if type(axis) is not int or not 0 <= axis <= MAX_AXIS:
        table.problem(f"{entry}.axis", f"must be an axis, 0 to {MAX_AXIS}; got {axis!r}")
    if spec.get("parts") is not None:
        parts = table.listing(spec["parts"], f"{entry}.parts", empty=False)
        if isinstance(hf, list) and parts and len(parts) != len(hf):
            table.problem(
                f"{entry}.parts", f"needs one entry per hf tensor ({len(hf)}); got {len(parts)}"
            )
        out["parts"] = [
            None
            if sizes is None
            else [
                table.expression(size, f"{entry}.parts[{i}][{j}]")
                for j, size in enumerate(table.listing(sizes, f"{entry}.parts[{i}]", empty=False))
            ]
            for i, sizes in enumerate(parts)
        ]
    return out
