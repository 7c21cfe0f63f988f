"""The rules that edit a tree's paths (rename, drop, stack, cast ...) and `apply_rules`.

The public face is `suture.rules`; reversible rules live in `reversible.py`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._dtypes import to_dtype
from .._errors import RuleError as RuleError
from .._errors import ShapeMismatchError, SurgeryError, did_you_mean
from .._lazy.array import LazyArray, as_lazy
from .._lazy.combine import concatenate as concatenate_arrays
from .._lazy.combine import stack as stack_arrays
from .._lazy.trace import call_function
from .._paths import ancestor_paths, flatten, match_path_or_ancestor, unflatten
from .._patterns import PatternError, compile_pattern


@dataclass(frozen=True)
class Edit:
    """What one rule does: remove `removed`, write `written` (path -> (value, anchor))."""

    removed: set[str] = field(default_factory=set)
    written: dict[str, tuple[Any, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Match:
    path: str
    match: re.Match[str]
    remainder: str  # the part of the path below the matched subtree, or ""

    def expand(self, template: str) -> str:
        expanded = self.match.expand(template)
        joined = f"{expanded}/{self.remainder}" if self.remainder else expanded
        # an empty part (rename("model", "") lifts the subtree) leaves no stray separator
        return "/".join(part for part in joined.split("/") if part)


class Rule:
    """Base of all rules: a pattern, a description, and `edit(leaves) -> Edit`."""

    pattern: str
    optional: bool

    def edit(self, leaves: dict[str, Any]) -> Edit:
        raise NotImplementedError

    def matches(self, leaves: dict[str, Any]) -> list[Match]:
        compiled = _compile(self.pattern, self)
        try:
            found = [m for m in (_match(compiled, path) for path in leaves) if m is not None]
        except PatternError as error:
            raise RuleError(f"{self!r}: {error}") from error
        if not found and not self.optional:
            hint = did_you_mean(self.pattern, ancestor_paths(leaves))
            raise RuleError(
                f"{self!r} matches no path.{hint} The pattern must match a whole path or "
                f"subtree, e.g. {next(iter(leaves), 'params/layer0/kernel')!r}. Fix it, or pass "
                f"optional=True if the tree may lack it."
            )
        return found


def _compile(pattern: str, rule: Rule) -> re.Pattern[str]:
    try:
        return compile_pattern(pattern, repr(rule))
    except PatternError as error:
        raise RuleError(str(error)) from error


def _match(pattern: re.Pattern[str], path: str) -> Match | None:
    """The longest whole-path or subtree match of `pattern` on `path`."""
    found = match_path_or_ancestor(pattern, path)
    return Match(path, *found) if found else None


def _axis(rule: Rule, axis: Any, array: LazyArray, path: str, new_axis: bool = False) -> int:
    """`axis` as a non-negative axis of `array` (of its result, for a new axis), or a RuleError."""
    ndim = array.ndim + (1 if new_axis else 0)
    if (
        isinstance(axis, bool)
        or not isinstance(axis, (int, np.integer))
        or not -ndim <= axis < ndim
    ):
        valid = f"{-ndim} to {ndim - 1}" if ndim else "none: it has no axes"
        raise RuleError(
            f"{rule!r}: {path!r} has shape {array.shape}, which has no axis {axis!r} (valid: "
            f"{valid}). Give an axis the array has."
        )
    return int(axis) % ndim


def describe_rule(name: str, *args: Any, **kwargs: Any) -> str:
    """How a rule prints: ``stack('layer.*', into='layers')``."""
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items() if v is not None]
    return f"{name}({', '.join(shown)})"


def rule_array(leaf: Any, path: str, rule: Rule) -> LazyArray:
    """`leaf` as a LazyArray, or a RuleError naming `rule` when it is not an array."""
    if isinstance(leaf, LazyArray) or (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
        return as_lazy(leaf, path=path)
    raise RuleError(
        f"{rule!r} needs an array at {path!r}, but it holds {type(leaf).__name__} {leaf!r:.40}."
    )


@dataclass(frozen=True, repr=False)
class Rename(Rule):
    pattern: str
    to: str
    optional: bool = False

    def edit(self, leaves: dict[str, Any]) -> Edit:
        result = Edit()
        for m in self.matches(leaves):
            target = m.expand(self.to)
            if not target:
                raise RuleError(
                    f"{self!r} renames the leaf {m.path!r} to an empty path. Rename it to a "
                    f"name, or rename its parent subtree to '' to lift its children."
                )
            if target in result.written:
                raise RuleError(
                    f"{self!r} maps both {result.written[target][1]!r} and {m.path!r} to {target!r}."
                )
            result.removed.add(m.path)
            result.written[target] = (leaves[m.path], m.path)
        return result

    def __repr__(self) -> str:
        return describe_rule("rename", self.pattern, self.to)


@dataclass(frozen=True, repr=False)
class Drop(Rule):
    pattern: str
    optional: bool = False

    def edit(self, leaves: dict[str, Any]) -> Edit:
        return Edit(removed={m.path for m in self.matches(leaves)})

    def __repr__(self) -> str:
        return describe_rule("drop", self.pattern)


@dataclass(frozen=True, repr=False)
class Keep(Rule):
    pattern: str
    optional: bool = False

    def edit(self, leaves: dict[str, Any]) -> Edit:
        kept = {m.path for m in self.matches(leaves)}
        return Edit(removed={path for path in leaves if path not in kept})

    def __repr__(self) -> str:
        return describe_rule("keep", self.pattern)


@dataclass(frozen=True, repr=False)
class Stack(Rule):
    pattern: str
    into: str
    axis: int = 0
    fill: Any = None
    start: int = 0
    optional: bool = False

    def edit(self, leaves: dict[str, Any]) -> Edit:
        groups: dict[str, dict[int, Match]] = {}
        for m in self.matches(leaves):
            index = self._index(m)
            group = groups.setdefault(m.expand(self.into), {})
            if index in group:
                raise RuleError(
                    f"{self!r}: {group[index].path!r} and {m.path!r} both have index {index}."
                )
            group[index] = m
        result = Edit()
        for target, members in groups.items():
            arrays = self._members(target, members, leaves)
            result.removed.update(m.path for m in members.values())
            anchor = members[min(members)].path
            result.written[target] = (stack_arrays(arrays, axis=self.axis), anchor)
        return result

    def _index(self, m: Match) -> int:
        groups = m.match.groupdict()
        raw = groups["i"] if "i" in groups else (m.match.group(1) if m.match.re.groups else None)
        if raw is None or not str(raw).isdigit():
            raise RuleError(
                f"{self!r}: the index of {m.path!r} must be digits captured by the group named "
                f"'i' (or the first group), e.g. r'layer(?P<i>\\d+)'; found {raw!r}."
            )
        return int(raw)

    def _members(self, target: str, members: dict[int, Match], leaves: dict) -> list[LazyArray]:
        present = {index: rule_array(leaves[m.path], m.path, self) for index, m in members.items()}
        low = [index for index in present if index < self.start]
        if low:
            raise RuleError(f"{self!r}: index {low[0]} of {target!r} is below start={self.start}.")
        missing = [index for index in range(self.start, max(present) + 1) if index not in present]
        if missing and self.fill is None:
            raise RuleError(
                f"{self!r}: {target!r} has no member for index {', '.join(map(str, missing[:8]))}"
                f" (found {sorted(present)}). Give fill= (a number or fn(shape, dtype)) to fill "
                f"them, or start= if the indices do not start at {self.start}."
            )
        first = next(iter(present.values()))
        _axis(self, self.axis, first, target, new_axis=True)
        for index in missing:
            present[index] = _filled(self.fill, first.shape, first.dtype, f"{target}[{index}]")
        shapes = {array.shape for array in present.values()}
        if len(shapes) > 1:
            raise ShapeMismatchError(
                f"{self!r}: the members of {target!r} have different shapes: "
                + ", ".join(f"{members[i].path}: {present[i].shape}" for i in sorted(members))
                + ". Only equally shaped leaves can be stacked."
            )
        return [present[index] for index in sorted(present)]

    def __repr__(self) -> str:
        return describe_rule("stack", self.pattern, into=self.into, axis=self.axis or None)


def _filled(fill: Any, shape: tuple[int, ...], dtype: np.dtype, path: str) -> LazyArray:
    if callable(fill):
        return as_lazy(fill(shape, dtype), path=path)
    return LazyArray.from_array(np.broadcast_to(np.asarray(fill, dtype), shape), path=path)


@dataclass(frozen=True, repr=False)
class Unstack(Rule):
    pattern: str
    into: str
    axis: int = 0
    optional: bool = False

    def edit(self, leaves: dict[str, Any]) -> Edit:
        if "{i}" not in self.into:
            raise RuleError(
                f"{self!r}: into= must hold '{{i}}' where the index goes, e.g. 'layer{{i}}'."
            )
        result = Edit()
        for m in self.matches(leaves):
            array = rule_array(leaves[m.path], m.path, self)
            axis = _axis(self, self.axis, array, m.path)
            result.removed.add(m.path)
            for index in range(array.shape[axis]):
                target = m.expand(self.into).replace("{i}", str(index))
                result.written[target] = (array[(slice(None),) * axis + (index,)], m.path)
        return result

    def __repr__(self) -> str:
        return describe_rule("unstack", self.pattern, into=self.into, axis=self.axis or None)


@dataclass(frozen=True, repr=False)
class Cast(Rule):
    pattern: str
    dtype: Any
    floating_only: bool = True
    optional: bool = False

    def edit(self, leaves: dict[str, Any]) -> Edit:
        dtype = to_dtype(self.dtype)
        result = Edit()
        for m in self.matches(leaves):
            leaf = leaves[m.path]
            if not isinstance(leaf, LazyArray) and not hasattr(leaf, "dtype"):
                continue
            if self.floating_only and not _is_floating(np.dtype(leaf.dtype)):
                continue
            result.written[m.path] = (as_lazy(leaf, path=m.path).astype(dtype), m.path)
            result.removed.add(m.path)
        return result

    def __repr__(self) -> str:
        return describe_rule("cast", self.pattern, str(to_dtype(self.dtype)))


def _is_floating(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or "float" in dtype.name


@dataclass(frozen=True, repr=False)
class Concat(Rule):
    patterns: tuple[str, ...]
    into: str
    axis: int = 0
    optional: bool = False

    @property
    def pattern(self) -> str:  # type: ignore[override]
        return " | ".join(self.patterns)

    def edit(self, leaves: dict[str, Any]) -> Edit:
        groups: dict[str, list[Match | None]] = {}
        for position, pattern in enumerate(self.patterns):
            for m in _Part(pattern, self.optional, self).matches(leaves):
                groups.setdefault(m.expand(self.into), [None] * len(self.patterns))[position] = m
        result = Edit()
        for target, parts in groups.items():
            absent = [self.patterns[i] for i, m in enumerate(parts) if m is None]
            if absent:
                raise RuleError(f"{self!r}: {target!r} has no part matching {absent[0]!r}.")
            arrays = [rule_array(leaves[m.path], m.path, self) for m in parts if m is not None]
            _axis(self, self.axis, arrays[0], parts[0].path)  # type: ignore[union-attr]
            result.removed.update(m.path for m in parts if m is not None)
            result.written[target] = (concatenate_arrays(arrays, axis=self.axis), parts[0].path)  # type: ignore[union-attr]
        return result

    def __repr__(self) -> str:
        return describe_rule("concat", list(self.patterns), into=self.into, axis=self.axis or None)


@dataclass(frozen=True, repr=False)
class _Part(Rule):
    pattern: str
    optional: bool
    owner: Rule

    def __repr__(self) -> str:
        return f"{self.owner!r} (part {self.pattern!r})"


@dataclass(frozen=True, repr=False)
class Split(Rule):
    pattern: str
    into: tuple[str, ...]
    axis: int = 0
    sizes: tuple[int, ...] | None = None
    optional: bool = False

    def edit(self, leaves: dict[str, Any]) -> Edit:
        result = Edit()
        for m in self.matches(leaves):
            array = rule_array(leaves[m.path], m.path, self)
            axis = _axis(self, self.axis, array, m.path)
            sizes = self._sizes(array.shape[axis], m.path)
            offset = 0
            for template, size in zip(self.into, sizes, strict=True):
                piece = array[(slice(None),) * axis + (slice(offset, offset + size),)]
                result.written[m.expand(template)] = (piece, m.path)
                offset += size
            result.removed.add(m.path)
        return result

    def _sizes(self, length: int, path: str) -> tuple[int, ...]:
        if self.sizes is not None:
            if any(
                isinstance(size, bool) or not isinstance(size, int) or size < 0
                for size in self.sizes
            ):
                raise RuleError(
                    f"{self!r}: sizes {self.sizes} must be non-negative whole numbers, one per "
                    f"output."
                )
            if len(self.sizes) != len(self.into) or sum(self.sizes) != length:
                raise RuleError(
                    f"{self!r}: sizes {self.sizes} must have one entry per output and sum to "
                    f"{length}, the length of axis {self.axis} of {path!r}."
                )
            return self.sizes
        if length % len(self.into):
            raise RuleError(
                f"{self!r}: axis {self.axis} of {path!r} has length {length}, which does not "
                f"split into {len(self.into)} equal parts. Give sizes=."
            )
        return (length // len(self.into),) * len(self.into)

    def __repr__(self) -> str:
        return describe_rule("split", self.pattern, into=list(self.into), axis=self.axis or None)


@dataclass(frozen=True, repr=False)
class MapValues(Rule):
    pattern: str
    fn: Callable[[Any], Any]
    optional: bool = False
    inverse: Callable[[Any], Any] | None = None  # what `reverse` applies to undo it

    def edit(self, leaves: dict[str, Any]) -> Edit:
        result = Edit()
        for m in self.matches(leaves):
            leaf = leaves[m.path]
            value = call_function(self.fn, leaf) if isinstance(leaf, LazyArray) else self.fn(leaf)
            result.removed.add(m.path)
            result.written[m.path] = (value, m.path)
        return result

    def __repr__(self) -> str:
        return describe_rule("map_values", self.pattern, getattr(self.fn, "__name__", "fn"))


# The public constructors -------------------------------------------------------------------


def rename(pattern: str, to: str, *, optional: bool = False) -> Rule:
    r"""Renames matching leaves or subtrees: ``rename(r"linear(\d)", r"layer\1")``."""
    return Rename(pattern, to, optional)


def drop(pattern: str, *, optional: bool = False) -> Rule:
    """Removes matching leaves or subtrees: ``drop("opt_state")``."""
    return Drop(pattern, optional)


def keep(pattern: str, *, optional: bool = False) -> Rule:
    """Keeps only matching leaves or subtrees: ``keep("params")``."""
    return Keep(pattern, optional)


def stack(
    pattern: str,
    into: str,
    axis: int = 0,
    *,
    fill: Any = None,
    start: int = 0,
    optional: bool = False,
) -> Rule:
    r"""Stacks numbered leaves along a new axis: ``stack(r"layer(?P<i>\d+)", into="layers")``.

    The index is the group named ``i``, else the first group; `into` may use the other
    groups. Indices run from `start`; a missing index is an error unless `fill` (a number,
    or ``fn(shape, dtype)``) fills it.
    """
    return Stack(pattern, into, axis, fill, start, optional)


def unstack(pattern: str, into: str, axis: int = 0, *, optional: bool = False) -> Rule:
    r"""Splits an axis into numbered leaves: ``unstack("layers", into="layer{i}")``."""
    return Unstack(pattern, into, axis, optional)


def cast(pattern: str, dtype: Any, *, floating_only: bool = True, optional: bool = False) -> Rule:
    """Casts matching arrays (floating-point ones, unless ``floating_only=False``)."""
    return Cast(pattern, dtype, floating_only, optional)


def concat(patterns: Sequence[str], into: str, axis: int = 0, *, optional: bool = False) -> Rule:
    r"""Joins one leaf per pattern along `axis`: fused QKV from query, key and value.

    Leaves whose patterns expand `into` to the same path are joined, in pattern order.
    """
    return Concat(tuple(patterns), into, axis, optional)


def split(
    pattern: str,
    into: Sequence[str],
    axis: int = 0,
    *,
    sizes: Sequence[int] | None = None,
    optional: bool = False,
) -> Rule:
    """Splits matching arrays along `axis` into `into` (equal parts unless `sizes`)."""
    return Split(pattern, tuple(into), axis, None if sizes is None else tuple(sizes), optional)


def map_values(
    pattern: str,
    fn: Callable[[Any], Any],
    *,
    optional: bool = False,
    inverse: Callable[[Any], Any] | None = None,
) -> Rule:
    """Replaces matching leaves by ``fn(leaf)``, lazily for arrays; `inverse` undoes it."""
    return MapValues(pattern, fn, optional, inverse)


def apply_rules(rules: Sequence[Rule], tree: Any, problems: list[str] | None = None) -> Any:
    """Applies `rules` in order to `tree` and returns the new nested tree (lazy, reads nothing).

    Args:
        rules: the rules.
        tree: a nested tree (lazy or in memory).
        problems: when given, problems are appended to it and the offending rule is
            skipped, so that a plan can report them all; otherwise the first one raises.

    Raises:
        RuleError: a rule that matches nothing, or rules that write the same path.
    """
    leaves = flatten(tree)
    written_by: dict[str, Rule] = {}
    for rule in rules:
        if not isinstance(rule, Rule):
            raise RuleError(
                f"Rules must be suture.rules objects; got {type(rule).__name__} {rule!r:.60}."
            )
        try:
            edit = rule.edit(leaves)
            leaves = _applied(rule, edit, leaves, written_by)
        except SurgeryError as error:
            if problems is None:
                raise
            problems.append(str(error))
    return unflatten(leaves)


def _applied(
    rule: Rule, edit: Edit, leaves: dict[str, Any], written_by: dict[str, Rule]
) -> dict[str, Any]:
    for target in edit.written:
        if target in leaves and target not in edit.removed:
            if target in written_by:
                raise RuleError(
                    f"Rules {written_by[target]!r} and {rule!r} both produce {target!r}. Change one of them."
                )
            raise RuleError(
                f"{rule!r} would overwrite {target!r}, which the tree already holds. Drop or "
                f"rename {target!r} first."
            )
    by_anchor: dict[str, list[str]] = {}
    for target, (_, anchor) in edit.written.items():
        by_anchor.setdefault(anchor, []).append(target)
    result: dict[str, Any] = {}
    for path, leaf in leaves.items():
        for target in by_anchor.get(path, []):
            result[target] = edit.written[target][0]
            written_by[target] = rule
        if path not in edit.removed:
            result[path] = leaf
    return result
