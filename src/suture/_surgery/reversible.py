r"""Reversible rules: `reverse(recipe)` gives the rules that undo a recipe, in reverse order.

Every structural rule has an exact inverse: rename <-> rename, stack <-> unstack,
concat <-> split, transpose <-> the inverse transpose, permute <-> the inverse permutation,
reshape <-> reshape back, scale <-> the inverse scale, cast <-> a cast back. Patterns and
templates are turned around: ``rename(r"layer(\d+)/w", r"block\1/kernel")`` reverses to
``rename(r"block(\d+)/kernel", r"layer\1/w")``, which needs the pattern to be literal text
and groups only (each group used by the template).

Some inverses need what the recipe's input looked like (a cast's source dtype, a reshape's
source shape, the sizes of concatenated parts): pass the input as `like=` (a lazy or
abstract tree: nothing is read). Rules that lose information (drop, keep) have no inverse,
nor has a `map_values` without ``inverse=``; reversing them is an error naming the rule. So
is a cast that can destroy values (float32 -> int8 wraps 300.0 to 44, and casting back
gives 44), unless ``allow_lossy=True``; one that only rounds (float32 -> bfloat16) comes
back rounded.

Example:
    >>> import numpy as np
    >>> from suture import rules
    >>> recipe = [rules.rename(r"layer(\d+)", r"block\1"), rules.transpose(r"block\d+", (1, 0))]
    >>> tree = {"layer0": np.arange(6.0).reshape(2, 3)}
    >>> back = rules.apply_rules(rules.reverse(recipe), rules.apply_rules(recipe, tree))
    >>> np.asarray(back["layer0"]).tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .._dtypes import _real as _real_dtype
from .._dtypes import cast_changes, cast_loss, inexact
from .._errors import ArgumentError, LossyCastError, SutureWarning
from .._lazy.array import LazyArray, elementwise
from .._lazy.views import checking_casts
from .._paths import flatten
from .rules import (
    Cast,
    Concat,
    Drop,
    Edit,
    Keep,
    MapValues,
    Rename,
    Rule,
    RuleError,
    Split,
    Stack,
    Unstack,
    apply_rules,
    describe_rule,
    rule_array,
)

# New structural rules --------------------------------------------------------------------------


@dataclass(frozen=True, repr=False)
class _ArrayRule(Rule):
    """A rule that replaces each matching array by a function of it, keeping its path."""

    def edit(self, leaves: dict[str, Any]) -> Edit:
        result = Edit()
        for m in self.matches(leaves):
            if self.leaves_alone(leaves[m.path]):
                continue
            result.removed.add(m.path)
            result.written[m.path] = (self.change(rule_array(leaves[m.path], m.path, self)), m.path)
        return result

    def leaves_alone(self, leaf: Any) -> bool:
        """Whether a matched `leaf` stays as it is (none does, unless a rule says so)."""
        return False

    def change(self, array: LazyArray) -> LazyArray:
        raise NotImplementedError


@dataclass(frozen=True, repr=False)
class Transpose(_ArrayRule):
    pattern: str
    axes: tuple[int, ...] | None = None
    optional: bool = False

    def change(self, array: LazyArray) -> LazyArray:
        axes = self.axes if self.axes is not None else tuple(reversed(range(array.ndim)))
        if sorted(a % max(array.ndim, 1) for a in axes) != list(range(array.ndim)):
            raise RuleError(
                f"{self!r}: {array.path!r} has {array.ndim} axes; axes={axes} is not a permutation of them."
            )
        return array.transpose(axes)

    def __repr__(self) -> str:
        return describe_rule("transpose", self.pattern, axes=self.axes)


@dataclass(frozen=True, repr=False)
class Reshape(_ArrayRule):
    pattern: str
    shape: tuple[int, ...]
    optional: bool = False

    def change(self, array: LazyArray) -> LazyArray:
        if math.prod(self.shape) != array.size:
            raise RuleError(
                f"{self!r}: {array.path!r} has shape {array.shape} ({array.size} elements), which does not fit {self.shape}."
            )
        return array.reshape(self.shape)

    def __repr__(self) -> str:
        return describe_rule("reshape", self.pattern, self.shape)


@dataclass(frozen=True, repr=False)
class Permute(_ArrayRule):
    pattern: str
    order: tuple[int, ...]
    axis: int = -1
    optional: bool = False

    def change(self, array: LazyArray) -> LazyArray:
        if not -array.ndim <= self.axis < array.ndim:
            raise RuleError(
                f"{self!r}: {array.path!r} has shape {array.shape}, no axis {self.axis}."
            )
        axis = self.axis % array.ndim
        if sorted(self.order) != list(range(array.shape[axis])):
            raise RuleError(
                f"{self!r}: order must be a permutation of range({array.shape[axis]}), the length of "
                f"axis {self.axis} of {array.path!r}."
            )
        return array[(slice(None),) * axis + (np.asarray(self.order),)]

    def __repr__(self) -> str:
        return describe_rule("permute", self.pattern, axis=self.axis, order=f"<{len(self.order)}>")


@dataclass(frozen=True, repr=False)
class Scale(_ArrayRule):
    """Multiplies floating-point leaves by `factor`, in their own dtype (see `scale`)."""

    pattern: str
    factor: float
    optional: bool = False
    floating_only: bool = True

    def __post_init__(self) -> None:
        if not math.isfinite(self.factor):
            raise ArgumentError(
                f"scale({self.pattern!r}, {self.factor}): the factor must be a finite number; "
                f"{self.factor} would make every value inf or NaN."
            )

    def leaves_alone(self, leaf: Any) -> bool:
        """As `cast`: with `floating_only` (the default), integer and bool leaves the pattern
        matches (a step counter, token ids, BatchNorm's count) are left as they are."""
        return self.floating_only and hasattr(leaf, "dtype") and not inexact(np.dtype(leaf.dtype))

    def change(self, array: LazyArray) -> LazyArray:
        factor = self._factor_in(array)
        check = _OverflowCheck(self, array, checking_casts()) if abs(self.factor) > 1 else None

        def scaled(x: np.ndarray) -> np.ndarray:
            with np.errstate(over="ignore", invalid="ignore"):
                result = (x * factor).astype(x.dtype)
            if check is not None:
                check(x, result, factor)
            return result

        return elementwise(scaled, array, name=f"scale {self.factor:g}")

    def _factor_in(self, array: LazyArray) -> np.ndarray:
        """The factor in the leaf's dtype; a RuleError for an integer leaf, or a factor the
        dtype turns into another sign, zero, inf or NaN."""
        dtype = np.dtype(array.dtype)
        if not inexact(dtype):
            raise RuleError(
                f"{self!r}: leaf {array.path!r} is {dtype.name}; scale multiplies floating-point "
                f"leaves only (in an integer dtype a fractional factor is cut, 0.5 to 0, and "
                f"products beyond its range wrap around). Leave it out (floating_only=True, "
                f"the default, leaves integer leaves as they are), or cast it to a float "
                f"first: rules.cast({array.path!r}, 'float32', floating_only=False)."
            )
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            factor = np.asarray(self.factor, dtype)
        held = complex(factor).real
        if not math.isfinite(held) or (held == 0) != (self.factor == 0) or held * self.factor < 0:
            raise RuleError(
                f"{self!r}: leaf {array.path!r} is {dtype.name}, which holds the factor "
                f"{self.factor:g} as {held:g}. Cast the leaf to a float that holds it first "
                f"(rules.cast({array.path!r}, 'float32')), or scale by another factor."
            )
        return factor

    @property
    def exact(self) -> bool:
        """A scale by a power of two round-trips exactly; others within about 1 ulp."""
        return math.frexp(abs(self.factor))[0] == 0.5

    def __repr__(self) -> str:
        return describe_rule("scale", self.pattern, self.factor)


class _OverflowCheck:
    """Finds the values a scale took beyond the leaf dtype's largest (to inf, NaN, or clamped):
    a `LossyCastError` with strict casts (as the graph was built), else one `SutureWarning`."""

    def __init__(self, rule: Scale, array: LazyArray, strict: bool) -> None:
        self.rule, self.path, self.strict, self.warned = rule, array.path, strict, False
        self.largest = float(ml_dtypes.finfo(_real_dtype(array.dtype)).max)
        # Only values near the largest over the factor can overflow; the margin covers the
        # rounding of this bound in the leaf's dtype (float4 and float8 included).
        self.bound = self.largest / abs(rule.factor) / 4

    def __call__(self, x: np.ndarray, result: np.ndarray, factor: np.ndarray) -> None:
        near = np.abs(x) > self.bound
        if not near.any():
            return
        values, scaled = x[near], result[near]
        wide = np.complex128 if np.iscomplexobj(x) else np.float64
        with np.errstate(over="ignore", invalid="ignore"):
            exact = values.astype(wide) * factor.astype(wide)
            changed = cast_changes(exact, scaled) | (np.isfinite(values) & ~np.isfinite(scaled))
        if changed.any():
            at = int(np.argmax(changed))
            self._report(values[at], scaled[at], int(changed.sum()), x.dtype)

    def _report(self, value: Any, became: Any, count: int, dtype: np.dtype) -> None:
        what = (
            f"Leaf {self.path or '(unnamed)'!r}: {self.rule!r} takes {value} beyond "
            f"{dtype.name}'s largest value ±{self.largest:g}: it becomes {became} ({count} "
            f"value(s) of a block)."
        )
        fix = "Scale by a smaller factor, or cast the leaf to a wider float first"
        if self.strict:
            raise LossyCastError(f"{what} {fix}; without strict_casts=True it is only a warning.")
        if not self.warned:
            self.warned = True
            warnings.warn(
                f"{what} {fix}, or pass strict_casts=True to refuse it.", SutureWarning, 2
            )


def transpose(pattern: str, axes: Sequence[int] | None = None, *, optional: bool = False) -> Rule:
    """Transposes matching arrays (reverses their axes by default): ``transpose("lm_head")``."""
    return Transpose(pattern, None if axes is None else tuple(axes), optional)


def reshape(pattern: str, shape: Sequence[int], *, optional: bool = False) -> Rule:
    """Reshapes matching arrays, e.g. split heads: ``reshape(r".*/q", (512, 8, 64))``."""
    return Reshape(pattern, tuple(int(n) for n in shape), optional)


def permute(pattern: str, order: Sequence[int], axis: int = -1, *, optional: bool = False) -> Rule:
    """Reorders one axis of matching arrays by `order` (a permutation of its indices)."""
    return Permute(pattern, tuple(int(i) for i in order), axis, optional)


def scale(
    pattern: str, factor: float, *, floating_only: bool = True, optional: bool = False
) -> Rule:
    """Multiplies matching arrays by `factor`, in their own dtype.

    Floating-point (and complex) leaves only: integer and bool leaves the pattern matches are
    left as they are, as `cast` leaves them; with ``floating_only=False`` such a leaf is a
    `RuleError` naming it (in its own dtype 0.5 would be cut to 0 and products would wrap).
    A value the product takes beyond the dtype's largest (float16's 65504) is a
    `SutureWarning`, and a `LossyCastError` with ``strict_casts=True``.
    """
    return Scale(pattern, float(factor), optional, floating_only)


# Turning patterns and templates around ---------------------------------------------------------

_SPECIAL = set(".^$*+?{}[]|")


@dataclass(frozen=True)
class _Piece:
    text: str  # literal text, or the group's regex source
    group: int | None = None  # group number (1-based), None for literal text
    name: str | None = None


def _pattern_pieces(pattern: str, rule: Rule) -> list[_Piece]:
    """`pattern` as literal text and top-level groups; anything else cannot be turned around."""
    pieces: list[_Piece] = []
    literal, i, group = "", 0, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            literal, i = literal + pattern[i + 1], i + 2
        elif char == "(":
            end = _closing(pattern, i, rule)
            group += 1
            body = pattern[i + 1 : end]
            name = None
            if body.startswith("?P<"):
                name, body = body[3 : body.index(">")], body[body.index(">") + 1 :]
            elif body.startswith("?"):
                raise _irreversible(rule, f"its pattern has the construct ({body[:3]}...)")
            if literal:
                pieces.append(_Piece(literal))
                literal = ""
            pieces.append(_Piece(body, group, name))
            i = end + 1
        elif char in _SPECIAL or char == "\\":
            raise _irreversible(rule, f"its pattern has {char!r} outside a group")
        else:
            literal, i = literal + char, i + 1
    if literal:
        pieces.append(_Piece(literal))
    return pieces


def _closing(pattern: str, start: int, rule: Rule) -> int:
    depth, i, in_class = 0, start, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise _irreversible(rule, "its pattern has an unbalanced '('")


@dataclass(frozen=True)
class _Ref:
    group: int | str  # a group's number or name


def _template_refs(template: str) -> list[str | _Ref]:
    """A replacement template as literal strings and group references."""
    parts: list[str | _Ref] = []
    for token in re.split(r"(\\g<[^>]+>|\\\d+)", template):
        if not token:
            continue
        if token.startswith("\\g<"):
            ref = token[3:-1]
            parts.append(_Ref(int(ref) if ref.isdigit() else ref))
        elif re.fullmatch(r"\\\d+", token):
            parts.append(_Ref(int(token[1:])))
        else:
            parts.append(token.replace("\\\\", "\\"))
    return parts


def _turn_around(
    pattern: str, template: str, rule: Rule, index_group: str | None = None
) -> tuple[str, str]:
    """(new pattern, new template) that map what `template` wrote back to what `pattern` read."""
    pieces = _pattern_pieces(pattern, rule)
    groups = {p.group: p for p in pieces if p.group is not None}
    groups.update({p.name: p for p in pieces if p.name is not None})
    seen: set[int] = set()
    new_pattern = ""
    for part in _template_refs(template):
        if isinstance(part, str):
            new_pattern += re.escape(part).replace(r"\{i\}", "{i}")
            continue
        piece = groups.get(part.group)
        if piece is None:
            raise _irreversible(
                rule, f"its template refers to group {part.group!r}, which the pattern lacks"
            )
        if piece.group in seen:
            new_pattern += f"(?P=g{piece.group})"
        else:
            new_pattern += f"(?P<g{piece.group}>{piece.text})"
            seen.add(piece.group)  # type: ignore[arg-type]
    new_template = ""
    for piece in pieces:
        if piece.group is None:
            new_template += piece.text.replace("\\", "\\\\")
        elif index_group is not None and (
            piece.name == index_group or (index_group == "1" and piece.group == 1)
        ):
            new_template += "{i}"
        elif piece.group in seen:
            new_template += f"\\g<g{piece.group}>"
        else:
            raise _irreversible(
                rule,
                f"group {piece.name or piece.group} of its pattern is not used by its template, so "
                "what it matched is lost",
            )
    return new_pattern, new_template


def _irreversible(rule: Rule, why: str) -> RuleError:
    return RuleError(
        f"{rule!r} cannot be reversed: {why}. Write its inverse rule yourself and reverse the "
        f"rest, or keep the rule's pattern to literal text and (groups) used by its template."
    )


# reverse() -------------------------------------------------------------------------------------


def reverse(
    recipe: Rule | Sequence[Rule], like: Any = None, *, allow_lossy: bool = False
) -> list[Rule]:
    """The rules that undo `recipe` (in reverse order); see the module docstring.

    Args:
        recipe: a rule or a list of rules.
        like: the recipe's input (a tree, lazy tree or opened checkpoint; nothing is read),
            needed to reverse casts, reshapes and concatenations.
        allow_lossy: undo casts that can destroy values (float32 -> int8; see
            `suture.plan`'s lossy casts) anyway. Exact only when the forward run checked
            that every value fit (``strict_casts=True``); otherwise such a cast is refused.
            Precision-only casts (float32 -> bfloat16) are undone to the rounded values
            either way.

    Raises:
        RuleError: naming the first rule that has no inverse and why, or a lossy cast.
    """
    rules = [recipe] if isinstance(recipe, Rule) else list(recipe)
    before = _inputs_of_each_rule(rules, like)
    inverses: list[Rule] = []
    for rule, leaves in zip(reversed(rules), reversed(before), strict=True):
        if isinstance(rule, Cast) and not allow_lossy:
            _refuse_lossy(rule, _need(leaves, rule, "the dtypes it casts from"))
        inverses.extend(_inverse(rule, leaves))
    return inverses


def _refuse_lossy(rule: Cast, leaves: dict[str, Any]) -> None:
    """A cast that can destroy values cannot be undone exactly: a RuleError saying why."""
    for path, (value, anchor) in rule.edit(leaves).written.items():
        source = np.dtype(leaves[anchor].dtype)
        loses = cast_loss(source, value.dtype)
        if loses:
            raise RuleError(
                f"{rule!r} cannot be undone exactly: {path!r} was {source.name}, and the cast "
                f"to {value.dtype.name} is lossy ({loses}), so casting back gives the changed "
                f"values, not the originals. Reverse it only if the forward run checked its "
                f"values (strict_casts=True, which the output records) or you know they fit: "
                f"pass allow_lossy=True. Otherwise reverse from the original checkpoint."
            )


def _inputs_of_each_rule(rules: list[Rule], like: Any) -> list[dict[str, Any] | None]:
    if like is None:
        return [None] * len(rules)
    tree = getattr(like, "tree", like)
    inputs = []
    for rule in rules:
        inputs.append(flatten(tree))
        tree = apply_rules([rule], tree)
    return inputs


def _inverse(rule: Rule, leaves: dict[str, Any] | None) -> list[Rule]:
    if isinstance(rule, Drop | Keep):
        raise RuleError(
            f"{rule!r} has no inverse: what it removes is gone. Reverse the recipe without it."
        )
    if isinstance(rule, MapValues):
        inverse = getattr(rule, "inverse", None)
        if inverse is None:
            raise RuleError(
                f"{rule!r} has no inverse: give map_values(..., inverse=fn) to reverse it."
            )
        return [MapValues(rule.pattern, inverse, rule.optional)]
    if isinstance(rule, Rename):
        pattern, template = _turn_around(rule.pattern, rule.to, rule)
        return [Rename(pattern, template, rule.optional)]
    if isinstance(rule, Stack):
        if rule.start or rule.fill is not None:
            raise _irreversible(rule, "start= and fill= add or renumber members")
        index = "i" if "(?P<i>" in rule.pattern else "1"
        pattern, template = _turn_around(rule.pattern, rule.into, rule, index_group=index)
        return [Unstack(pattern, template, rule.axis, rule.optional)]
    if isinstance(rule, Unstack):
        stacked = _escape_template(rule.pattern, rule)
        pattern = re.escape(rule.into).replace(re.escape("{i}"), r"(?P<i>\d+)")
        return [Stack(pattern, stacked, rule.axis, optional=rule.optional)]
    if isinstance(rule, Split):
        patterns = [_turn_around(rule.pattern, into, rule)[0] for into in rule.into]
        template = _turn_around(rule.pattern, rule.into[0], rule)[1]
        return [Concat(tuple(patterns), template, rule.axis, rule.optional)]
    if isinstance(rule, Concat):
        return _inverse_concat(rule, _need(leaves, rule, "the sizes of the concatenated parts"))
    if isinstance(rule, Cast):
        return _inverse_cast(rule, _need(leaves, rule, "the dtypes it casts from"))
    if isinstance(rule, Transpose):
        if rule.axes is None:
            return [rule]
        return [
            Transpose(rule.pattern, tuple(int(a) for a in np.argsort(rule.axes)), rule.optional)
        ]
    if isinstance(rule, Permute):
        return [
            Permute(
                rule.pattern,
                tuple(int(a) for a in np.argsort(rule.order)),
                rule.axis,
                rule.optional,
            )
        ]
    if isinstance(rule, Scale):
        if rule.factor == 0 or not math.isfinite(1.0 / rule.factor):
            raise RuleError(
                f"{rule!r} has no inverse: 1/{rule.factor:g} is not a finite number (what a "
                f"scale by 0 makes 0 is gone). Reverse the recipe without it."
            )
        return [Scale(rule.pattern, 1.0 / rule.factor, rule.optional, rule.floating_only)]
    if isinstance(rule, Reshape):
        found = _need(leaves, rule, "the shapes it reshapes from")
        return [
            Reshape(re.escape(m.path), tuple(rule_array(found[m.path], m.path, rule).shape))
            for m in rule.matches(found)
        ]
    raise RuleError(f"{rule!r} has no known inverse. Write its inverse rule yourself.")


def _need(leaves: dict[str, Any] | None, rule: Rule, what: str) -> dict[str, Any]:
    if leaves is None:
        raise RuleError(
            f"Reversing {rule!r} needs {what}: pass the recipe's input as like= "
            f"(--like SOURCE on the command line); nothing of it is read."
        )
    return leaves


def _inverse_cast(rule: Cast, leaves: dict[str, Any]) -> list[Rule]:
    written = rule.edit(leaves).written
    return [
        Cast(re.escape(path), np.dtype(leaves[anchor].dtype), floating_only=False)
        for path, (_, anchor) in written.items()
    ]


def _inverse_concat(rule: Concat, leaves: dict[str, Any]) -> list[Rule]:
    inverses: list[Rule] = []
    for target, (value, _) in rule.edit(leaves).written.items():
        parts = [
            m
            for pattern in rule.patterns
            for m in Rename(pattern, "").matches(leaves)
            if m.expand(rule.into) == target
        ]
        axis = rule.axis % value.ndim
        sizes = tuple(rule_array(leaves[m.path], m.path, rule).shape[axis] for m in parts)
        inverses.append(Split(re.escape(target), tuple(m.path for m in parts), rule.axis, sizes))
    return inverses


def _escape_template(pattern: str, rule: Rule) -> str:
    """An Unstack's source pattern used as the template of its inverse (literal text only)."""
    pieces = _pattern_pieces(pattern, rule)
    if any(piece.group is not None for piece in pieces):
        raise _irreversible(rule, "its pattern has groups, so the stacked name is not one path")
    return "".join(piece.text for piece in pieces)
