"""`suture diff`: how two checkpoints differ, by structure and (optionally) by value.

Example:
    >>> import numpy as np, suture
    >>> a = {"w": np.zeros(3), "b": np.ones(2), "old": np.ones(1)}
    >>> b = {"w": np.zeros((3, 1)), "b": np.ones(2), "new": 1}
    >>> d = diff(a, b, values=True)
    >>> d.only_a, d.only_b, [change.path for change in d.changed], d.equal
    (['old'], ['new'], ['w'], False)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .._exec.progress import leaf_progress, wants_progress
from .._lazy.array import LazyArray
from .._lazy.graph import open_all
from ..sources.open import open as open_checkpoint
from .stats import LeafDifference, leaf_difference

# Four leaves compared at once, in blocks of 16 MiB: their float64 differences stay
# within a few hundred MiB.
_THREADS = 4
_BLOCK_BYTES = 16 << 20


@dataclass
class Change:
    """A leaf in both checkpoints whose description or value differs."""

    path: str
    what: str  # "shape", "dtype", "kind" or "value"
    a: str
    b: str


@dataclass
class Diff:
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    changed: list[Change] = field(default_factory=list)
    values: dict[str, LeafDifference] = field(default_factory=dict)
    compared_values: bool = False
    exact: bool = True  # values compared with no tolerance (no atol, rtol nor ulp)

    @property
    def equal(self) -> bool:
        return not (
            self.only_a
            or self.only_b
            or self.changed
            or any(not d.equal for d in self.values.values())
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "equal": self.equal,
                "only_a": self.only_a,
                "only_b": self.only_b,
                "changed": [vars(change) for change in self.changed],
                "values": {
                    path: {
                        "max_abs": d.max_abs,
                        "max_rel": d.max_rel,
                        "differing": d.differing,
                        "equal": d.equal,
                    }
                    for path, d in self.values.items()
                },
            },
            indent=1,
        )

    def __str__(self) -> str:
        lines = [f"- {path}  (only in A)" for path in self.only_a]
        lines += [f"+ {path}  (only in B)" for path in self.only_b]
        lines += [f"~ {c.path}  {c.what}: {c.a} -> {c.b}" for c in self.changed]
        lines += [
            f"~ {path}  values: {d.differing} elements differ, max |a-b| = {d.max_abs:.6g}, "
            f"max relative = {d.max_rel:.6g}"
            for path, d in self.values.items()
            if not d.equal
        ]
        if self.equal:
            lines.append(
                "Equal."
                + (
                    ""
                    if self.compared_values
                    else " (structure only: add --values to compare values)"
                )
            )
        else:
            count = (
                len(self.only_a)
                + len(self.only_b)
                + len(
                    {c.path for c in self.changed}
                    | {p for p, d in self.values.items() if not d.equal}
                )
            )
            lines.append(f"{count} difference(s).")
            if self.exact and any(not d.equal for d in self.values.values()):
                lines.append(
                    "Values were compared exactly: --rtol/--atol allow a tolerance, and --ulp N "
                    "allows N units in the last place (--ulp 1 for a round trip within 1 ulp)."
                )
        return "\n".join(lines)


def _describe(leaf: Any) -> tuple[str, str, str]:
    if isinstance(leaf, LazyArray):
        return "array", str(leaf.shape), leaf.dtype.name
    return "value", "", repr(leaf)


def diff(
    a: Any,
    b: Any,
    *,
    values: bool = False,
    atol: float = 0.0,
    rtol: float = 0.0,
    on_leaf: Callable[[str], None] | None = None,
    progress: bool | None = None,
    ulp: int = 0,
) -> Diff:
    """Compares two checkpoints (paths, opened checkpoints or trees); reads values only if asked.

    With `values`, leaves are compared a few at a time, block by block; `on_leaf` is called
    (from the reading threads) as each is done, and `progress` shows a bar on stderr (None:
    when stderr is a terminal).
    """
    flat_a, flat_b = open_checkpoint(a).flat(), open_checkpoint(b).flat()
    result = Diff(compared_values=values, exact=not (atol or rtol or ulp))
    pairs: dict[str, tuple[LazyArray, LazyArray]] = {}
    result.only_a = [path for path in flat_a if path not in flat_b]
    result.only_b = [path for path in flat_b if path not in flat_a]
    for path, left in flat_a.items():
        if path not in flat_b:
            continue
        right = flat_b[path]
        kind_a, shape_a, detail_a = _describe(left)
        kind_b, shape_b, detail_b = _describe(right)
        if kind_a != kind_b:
            result.changed.append(
                Change(
                    path, "kind", f"{kind_a} {shape_a}{detail_a}", f"{kind_b} {shape_b}{detail_b}"
                )
            )
            continue
        if kind_a == "value":
            if detail_a != detail_b:
                result.changed.append(Change(path, "value", detail_a, detail_b))
            continue
        if shape_a != shape_b:
            result.changed.append(Change(path, "shape", shape_a, shape_b))
            continue
        if detail_a != detail_b:
            result.changed.append(Change(path, "dtype", detail_a, detail_b))
        if values:
            pairs[path] = (left, right)
    if pairs:
        result.values = _compare_all(pairs, atol, rtol, on_leaf, wants_progress(progress), ulp)
    return result


def _compare_all(
    pairs: dict[str, tuple[LazyArray, LazyArray]],
    atol: float,
    rtol: float,
    on_leaf: Callable[[str], None] | None,
    show_progress: bool,
    ulp: int = 0,
) -> dict[str, LeafDifference]:
    """Compares the pairs on a few threads (reads wait on storage; numpy releases the GIL)."""
    open_all([source for pair in pairs.values() for leaf in pair for source in leaf.sources()])
    total = sum(left.nbytes + right.nbytes for left, right in pairs.values())
    with leaf_progress("Comparing", total, len(pairs), show_progress) as done:

        def compare(path: str) -> LeafDifference:
            left, right = pairs[path]
            difference = leaf_difference(left, right, atol, rtol, block_bytes=_BLOCK_BYTES, ulp=ulp)
            done(left.nbytes + right.nbytes)
            if on_leaf is not None:
                on_leaf(path)
            return difference

        with ThreadPoolExecutor(max_workers=_THREADS) as pool:
            return dict(zip(pairs, pool.map(compare, pairs), strict=True))
