"""`suture.plan`: what a surgery will do, computed without reading any array.

For every output leaf: where it comes from, the operations on the way, its shape and dtype,
and the bytes it reads. Then the source leaves nothing uses (never read), the leaves
created by `init`, and every problem found.

Example:
    >>> import numpy as np, suture
    >>> from suture import rules
    >>> source = {"params": {"w": np.ones((4, 4), np.float32)}, "opt": {"mu": np.ones(4)}}
    >>> plan = suture.plan([rules.drop("opt"), rules.cast("params", "bfloat16")], source)
    >>> plan.outputs[0].path, plan.outputs[0].operations, plan.bytes_to_read
    ('params/w', ['cast bfloat16'], 64)
    >>> plan.dropped
    ['opt/mu']
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .._dtypes import cast_loss
from .._format import format_table, human_bytes
from .._jaxtypes import is_shape_dtype_struct
from .._lazy.array import LazyArray
from .._lazy.graph import Node, SourceNode
from .._lazy.joins import ConcatNode, StackNode
from .._lazy.reads import estimate_reads
from .._lazy.selection import full
from .._lazy.views import CastNode, CheckedCastNode
from .._paths import flatten
from .build import build


@dataclass
class OutputLeaf:
    """One leaf of the result."""

    path: str
    shape: list[int] | None
    dtype: str | None
    sources: list[str]
    operations: list[str]
    bytes_to_read: int
    initialized: bool = False
    value: str | None = None


@dataclass
class LossyCast:
    """A cast on the way to an output that can destroy values, and what it can destroy."""

    path: str
    source_dtype: str
    dtype: str
    loses: str
    checked: bool  # made with strict casts: a value that does not fit stops the write


@dataclass
class Plan:
    """What a surgery does; printable (`str(plan)`) and serializable (`to_json`)."""

    outputs: list[OutputLeaf] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    initialized: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)  # why a function was not run lazily
    constants: list[str] = field(default_factory=list)
    bytes_read_by_functions: int = 0
    lossy_casts: list[LossyCast] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def bytes_to_read(self) -> int:
        return sum(output.bytes_to_read for output in self.outputs) + self.bytes_read_by_functions

    @property
    def bytes_to_write(self) -> int:
        return sum(
            math.prod(output.shape) * _itemsize(output.dtype)
            for output in self.outputs
            if output.shape is not None
        )

    def to_dict(self) -> dict[str, Any]:
        report = asdict(self)
        report.update(
            ok=self.ok, bytes_to_read=self.bytes_to_read, bytes_to_write=self.bytes_to_write
        )
        return report

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def problems_text(self) -> str:
        """The problems alone, numbered; ``No problems.`` when there are none."""
        if not self.problems:
            return "No problems."
        lines = [f"{len(self.problems)} problem(s):"]
        lines.extend(f"  {i}. {problem}" for i, problem in enumerate(self.problems, 1))
        return "\n".join(lines)

    def __str__(self) -> str:
        """The problems first (a pattern matching nothing, a bad dtype: not under 200 rows),
        then the table of outputs, then the notes."""
        rows = [["output", "shape", "dtype", "from", "operations", "reads"]]
        for output in self.outputs:
            origin = (
                "init" if output.initialized else ", ".join(output.sources) or (output.value or "")
            )
            rows.append(
                [
                    output.path,
                    "" if output.shape is None else str(tuple(output.shape)),
                    output.dtype or "",
                    _shorten(origin, 48),
                    " <- ".join(output.operations),
                    human_bytes(output.bytes_to_read) if output.bytes_to_read else "",
                ]
            )
        lines = [self.problems_text(), ""] if self.problems else []
        lines += format_table(rows, rule_under_header=True)
        lines.append(
            f"\n{len(self.outputs)} output{'' if len(self.outputs) == 1 else 's'}; reads {human_bytes(self.bytes_to_read)}, "
            f"writes {human_bytes(self.bytes_to_write)}."
        )
        if self.dropped:
            lines.append(
                f"Dropped (never read): {len(self.dropped)} leaves: {_listed(self.dropped)}"
            )
        if self.bytes_read_by_functions:
            lines.append(
                f"The transform function reads {human_bytes(self.bytes_read_by_functions)} "
                f"when it is called (see the note)."
            )
        if self.initialized:
            lines.append(f"Created by init: {_listed(self.initialized)}")
        if self.constants:
            lines.append(
                f"New, {CONSTANT} (no source; loaded as returned): {_listed(self.constants)}. "
                f"To initialize them instead, name them in init=."
            )
        lines.extend(lossy_lines(self.lossy_casts))
        lines.extend(f"Note: {note}" for note in self.notes)
        lines.extend(f"Function call: {shown_fallback(fallback)}" for fallback in self.fallbacks)
        lines.append(
            f"{len(self.problems)} problem(s), listed above." if self.problems else "No problems."
        )
        return "\n".join(lines)


def shown_fallback(fallback: str) -> str:
    """A function's fallback as the plan shows it: tracing with jax, the way a function
    of ``jnp`` calls is meant to run, is said as what happened, not as a failure.

    Example:
        >>> shown_fallback("f: running lazily failed (ValueError: x); traced with jax.")
        'f: computed by tracing with jax (on shapes and dtypes; nothing is read).'
    """
    name, _, rest = fallback.partition(": ")
    if rest.endswith("; traced with jax.") and "tracing with jax failed" not in rest:
        return f"{name}: computed by tracing with jax (on shapes and dtypes; nothing is read)."
    return fallback


def lossy_casts(tree: Any) -> list[LossyCast]:
    """The lossy casts on the way to each LazyArray leaf of `tree` (as `Plan.lossy_casts`)."""
    return [
        cast
        for path, leaf in flatten(tree).items()
        if isinstance(leaf, LazyArray)
        for cast in _lossy_casts(path, leaf.node)
    ]


def lossy_lines(casts: list[LossyCast]) -> list[str]:
    """One line per kind of lossy cast, with the leaves it touches."""
    groups: dict[tuple[str, str, str, bool], list[str]] = {}
    for cast in casts:
        key = (cast.source_dtype, cast.dtype, cast.loses, cast.checked)
        groups.setdefault(key, []).append(cast.path)
    lines = []
    for (source, dtype, loses, checked), paths in groups.items():
        after = (
            "checked as it is written (strict casts): a value that does not fit stops the write."
            if checked
            else "not checked: pass strict_casts=True to stop at the first value that does not fit."
        )
        lines.append(
            f"Lossy cast {source} -> {dtype} at {len(paths)} "
            f"{'leaf' if len(paths) == 1 else 'leaves'} ({_listed(paths)}): "
            f"{loses}; {after}"
        )
    return lines


def _itemsize(dtype: str | None) -> int:
    """Bytes per element of a plan row's dtype (0 for strings, None and unknown sizes)."""
    try:
        return np.dtype(dtype).itemsize if dtype not in (None, "str", "None") else 0
    except TypeError:
        return 0


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _listed(paths: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" ... ({len(paths) - limit} more)" if len(paths) > limit else "")


def plan(
    transform: Any,
    *sources: Any,
    target: Any = None,
    init: Any = None,
    partial: bool = False,
    seed: Any = 0,
    strict_casts: bool = False,
) -> Plan:
    """What `suture.transform` (and `load_and_transform`) would do, without reading arrays.

    Arguments as in `suture.transform`. Problems do not raise: they are listed in the plan.
    Casts that can destroy values (`lossy_casts`: float -> int, int64 -> int32, float32 ->
    float16 ...) are listed too, and whether they are checked (`strict_casts`); a
    precision-only cast (float32 -> bfloat16) is not.
    """
    built = build(transform, sources, target, init, partial, seed, strict_casts)
    result = Plan(
        initialized=list(built.initialized),
        problems=list(built.problems),
        notes=list(built.notes),
        fallbacks=list(built.fallbacks),
    )
    used: set[int] = set(built.eager_reads)
    result.bytes_read_by_functions = sum(
        count for source, count in built.eager_reads.values() if _stored(source)
    )
    if built.tree is not None:
        for path, leaf in flatten(built.tree).items():
            result.outputs.append(_describe_leaf(path, leaf, path in built.initialized, used))
            if isinstance(leaf, LazyArray):
                result.lossy_casts.extend(_lossy_casts(path, leaf.node))
        result.constants = [output.path for output in result.outputs if output.value == CONSTANT]
    for ckpt in built.sources:
        for path, leaf in ckpt.arrays().items():
            if not any(id(source) in used for source in leaf.sources()):
                result.dropped.append(
                    path if len(built.sources) == 1 else f"{ckpt.location}:{path}"
                )
    return result


def _describe_leaf(path: str, leaf: Any, initialized: bool, used: set[int]) -> OutputLeaf:
    if not isinstance(leaf, LazyArray):
        shape, dtype, value = _described_value(leaf)
        return OutputLeaf(path, shape, dtype, [], [], 0, initialized, value=value)
    reads = estimate_reads(leaf.node, full(leaf.shape))
    used.update(reads)
    sources = [f"{source.path}" for source, _ in reads.values() if source.path]
    return OutputLeaf(
        path,
        list(leaf.shape),
        leaf.dtype.name,
        [] if initialized else sources,
        _operations(leaf.node),
        0 if initialized else sum(count for source, count in reads.values() if _stored(source)),
        initialized,
    )


CONSTANT = "constant from the function"


def _described_value(leaf: Any) -> tuple[list[int] | None, str, str]:
    """Shape, dtype and a one-line description of a leaf that is not a LazyArray."""
    wanted = getattr(leaf, "wanted", None)  # a target leaf that init was to create
    if wanted is not None:
        shape = None if wanted.shape is None else list(wanted.shape)
        dtype = "as stored" if wanted.dtype is None else wanted.dtype.name
        return shape, dtype, "to be created: needs init"
    if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
        if is_shape_dtype_struct(leaf):
            return list(leaf.shape), np.dtype(leaf.dtype).name, "to be created: needs init"
        return list(leaf.shape), np.dtype(leaf.dtype).name, CONSTANT
    if isinstance(leaf, (bool, int, float, complex, np.generic)):
        return [], np.asarray(leaf).dtype.name, _shorten(repr(leaf), 40)
    one_line = " ".join(repr(leaf).split())
    return [], "None" if leaf is None else type(leaf).__name__, _shorten(one_line, 40)


def _stored(source: SourceNode) -> bool:
    """Whether `source` is a leaf of a source (not a constant made by a function)."""
    return source.path is not None or source.origin is not None


def _lossy_casts(path: str, node: Node) -> list[LossyCast]:
    """The casts in `node`'s graph that `cast_loss` flags (plain, checked, or of members)."""
    found: dict[tuple[str, str], LossyCast] = {}
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        pending.extend(current.inputs())
        if isinstance(current, CastNode):
            sources = [current.base]
        elif isinstance(current, (StackNode, ConcatNode)):
            sources = list(current.members)
        else:
            continue
        for source in sources:
            loses = cast_loss(source.dtype, current.dtype)
            key = (source.dtype.name, current.dtype.name)
            if loses and key not in found:
                checked = isinstance(current, CheckedCastNode)
                found[key] = LossyCast(path, *key, loses, checked)
    return list(found.values())


def _operations(node: Node) -> list[str]:
    """The operations from the output down to its sources, outermost first."""
    described: list[str] = []
    while not isinstance(node, SourceNode):
        described.append(node.describe())
        computed = [member for member in node.inputs() if not isinstance(member, SourceNode)]
        if len(computed) != 1:  # sources only, or several computed branches
            break
        node = computed[0]  # e.g. w + 0.5 * (a @ b): add <- mul <- matmul
    return described
