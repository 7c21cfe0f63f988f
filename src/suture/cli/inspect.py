"""What `suture inspect` shows: a checkpoint's leaves as a tree, a flat list, or JSON.

Example:
    >>> import numpy as np, suture
    >>> ckpt = suture.open({"params": {"w": np.zeros((2, 3), np.float32)}, "step": 7})
    >>> print(render_flat(describe(ckpt)))
    params/w  float32  (2, 3)  24 B
    step      7
    1 array, 6 parameters, 24 B; 1 other leaf
"""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from .._errors import SurgeryError
from .._exec.progress import progress_bar, wants_progress
from .._exec.runner import Progress
from .._format import format_table, human_bytes, human_count
from .._lazy.array import LazyArray
from .._patterns import compile_pattern
from .._patterns import search as bounded_search
from .._quant.scheme import scheme_of
from .._quant.views import logical_views
from ..sources.checkpoint import Checkpoint
from .stats import combined, leaf_stats


@dataclass(frozen=True)
class LeafInfo:
    """One leaf: an array (shape, dtype, nbytes) or a value."""

    path: str
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    nbytes: int = 0
    value: Any = None

    @property
    def is_array(self) -> bool:
        return self.shape is not None

    def to_json(self) -> dict[str, Any]:
        if self.is_array:
            return {
                "path": self.path,
                "shape": list(self.shape or ()),
                "dtype": self.dtype,
                "nbytes": self.nbytes,
            }
        return {"path": self.path, "value": _json_value(self.value)}


@dataclass
class Description:
    """The leaves of a checkpoint after filtering, with totals."""

    location: str
    format: str
    step: int | None
    leaves: list[LeafInfo] = field(default_factory=list)

    @property
    def arrays(self) -> list[LeafInfo]:
        return [leaf for leaf in self.leaves if leaf.is_array]

    @property
    def total_bytes(self) -> int:
        return sum(leaf.nbytes for leaf in self.arrays)

    @property
    def total_parameters(self) -> int:
        return sum(_size(leaf.shape or ()) for leaf in self.arrays)

    def to_json(self) -> dict[str, Any]:
        return {
            "location": self.location,
            "format": self.format,
            "step": self.step,
            "num_arrays": len(self.arrays),
            "num_parameters": self.total_parameters,
            "total_bytes": self.total_bytes,
            "leaves": [leaf.to_json() for leaf in self.leaves],
        }

    def to_json_text(self, stats: dict[str, Any] | None = None) -> str:
        """`to_json` as text with one leaf per line: readable, and fast for 10^5 leaves."""
        report = self.to_json()
        leaves = report.pop("leaves")
        for leaf in leaves:
            if stats and leaf["path"] in stats:
                leaf["stats"] = stats[leaf["path"]].to_json()
        head = json.dumps(report)[:-1]
        if not leaves:
            return head + ', "leaves": []}'
        lines = ",\n  ".join(json.dumps(leaf) for leaf in leaves)
        return f'{head}, "leaves": [\n  {lines}\n]}}'


def _size(shape: tuple[int, ...]) -> int:
    size = 1
    for length in shape:
        size *= length
    return size


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, dict)) and not value:
        return type(value)()
    return repr(value)


def quantization_note(config: Any, path: str) -> str:
    """What `suture inspect` says about a quantized Hugging Face folder.

    Example:
        >>> print(quantization_note({"quant_method": "mxfp4"}, "m"))
        Quantized: MXFP4 (E2M1 values, an E8M0 scale per 32); tensors shown as stored. Dequantize: `suture convert m OUT --dequantize`, or suture.open('m', dequantize=True).
    """
    try:
        how = scheme_of(config, repr(path)).describe()
    except SurgeryError as error:
        return f"Quantized (config.json quantization_config); tensors shown as stored. {error}"
    return (
        f"Quantized: {how}; tensors shown as stored. Dequantize: `suture convert {path} OUT "
        f"--dequantize`, or suture.open({path!r}, dequantize=True)."
    )


def describe(ckpt: Checkpoint, pattern: str | None = None, logical: bool = False) -> Description:
    """The leaves of `ckpt` whose path matches `pattern` (``re.search``), without reading data.

    With `logical`, a packed quantized weight (FP4, INT4 in int32, NVFP4, MXFP4) shows its
    logical shape and its format in place of its stored bytes' shape and dtype.

    Raises:
        SurgeryError: when `pattern` is not a valid regular expression.
    """
    matcher = _compile(pattern)
    description = Description(ckpt.location, ckpt.format, ckpt.step)
    flat = ckpt.flat()
    views = _packed_views(ckpt, flat) if logical else {}
    for path, leaf in flat.items():
        if matcher and not bounded_search(matcher, path):
            continue
        if isinstance(leaf, LazyArray) and id(leaf) in views:
            shape, label = views[id(leaf)]
            info = LeafInfo(path, shape, label, leaf.nbytes)
        elif isinstance(leaf, LazyArray):
            info = LeafInfo(path, leaf.shape, _dtype_name(leaf.dtype), leaf.nbytes)
        else:
            info = LeafInfo(path, value=leaf)
        description.leaves.append(info)
    return description


def _packed_views(ckpt: Checkpoint, flat: dict[str, Any]) -> dict[int, tuple[tuple, str]]:
    """``{id(leaf): (logical shape, format)}`` of the packed weights of a quantized folder."""
    config = ckpt.layout.get("quantization_config")
    if config is None or ckpt.layout.get("dequantized"):
        return {}
    by_name = {
        path.replace("/", "."): leaf for path, leaf in flat.items() if isinstance(leaf, LazyArray)
    }
    views = logical_views(by_name, config, repr(ckpt.location))
    return {id(by_name[name]): view for name, view in views.items()}


@functools.lru_cache(maxsize=64)
def _dtype_name(dtype: Any) -> str:
    return dtype.name  # numpy works the name out in Python each time: cache it


def _compile(pattern: str | None) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    return compile_pattern(pattern, "--filter")


def _value_text(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _array_columns(leaf: LeafInfo) -> list[str]:
    return [leaf.dtype or "", str(tuple(leaf.shape or ())), human_bytes(leaf.nbytes)]


def summary_line(description: Description) -> str:
    arrays = len(description.arrays)
    others = len(description.leaves) - arrays
    text = (
        f"{arrays} array{'s' if arrays != 1 else ''}, "
        f"{human_count(description.total_parameters)} parameters, "
        f"{human_bytes(description.total_bytes)}"
    )
    if others:
        text += f"; {others} other lea{'ves' if others != 1 else 'f'}"
    return text


def render_flat(description: Description) -> str:
    """One line per leaf: path, dtype, shape, size (or the value), then a total line."""
    rows = [
        [leaf.path, *_array_columns(leaf)]
        if leaf.is_array
        else [leaf.path, _value_text(leaf.value)]
        for leaf in description.leaves
    ]
    return "\n".join([*format_table(rows), summary_line(description)])


def render_tree(description: Description, depth: int | None = None) -> str:
    """An indented tree; subtrees deeper than `depth` fold into one line with their totals."""
    root = _TreeNode("")
    for leaf in description.leaves:
        root.add(leaf.path.split("/") if leaf.path else [""], leaf)
    rows: list[list[str]] = []
    root.render(rows, level=0, depth=depth)
    return "\n".join([*format_table(rows), summary_line(description)])


class _TreeNode:
    def __init__(self, name: str) -> None:
        self.name = name
        self.children: dict[str, _TreeNode] = {}
        self.leaf: LeafInfo | None = None

    def add(self, keys: list[str], leaf: LeafInfo) -> None:
        if not keys:
            self.leaf = leaf
            return
        child = self.children.setdefault(keys[0], _TreeNode(keys[0]))
        child.add(keys[1:], leaf)

    def leaves(self) -> list[LeafInfo]:
        found = [self.leaf] if self.leaf else []
        for child in self.children.values():
            found.extend(child.leaves())
        return found

    def render(self, rows: list[list[str]], level: int, depth: int | None) -> None:
        for child in self.children.values():
            indent = "  " * level
            if child.leaf is not None and not child.children:
                leaf = child.leaf
                columns = _array_columns(leaf) if leaf.is_array else [_value_text(leaf.value)]
                rows.append([indent + child.name, *columns])
                continue
            arrays = [leaf for leaf in child.leaves() if leaf.is_array]
            total = human_bytes(sum(leaf.nbytes for leaf in arrays))
            count = f"{len(arrays)} array{'s' if len(arrays) != 1 else ''}"
            if depth is not None and level + 1 >= depth:
                rows.append([indent + child.name + "/", "", count, total])
                continue
            rows.append([indent + child.name + "/", "", "", total])
            child.render(rows, level + 1, depth)


def render_stats(description: Description, stats: dict[str, Any], depth: int | None = None) -> str:
    """One line per array leaf with its statistics, then the total line; leaves deeper than
    `depth` fold into one line per subtree, with the statistics of all its values."""
    rows = [["path", "dtype", "shape", "min", "max", "mean", "std", "NaNs"]]
    groups: dict[str, list[LeafInfo]] = {}
    for leaf in description.arrays:
        if leaf.path not in stats:
            continue
        parts = leaf.path.split("/")
        key = leaf.path if depth is None or len(parts) <= depth else "/".join(parts[:depth]) + "/"
        groups.setdefault(key, []).append(leaf)
    for key, leaves in groups.items():
        found = combined([stats[leaf.path] for leaf in leaves])
        numbers = [found.minimum, found.maximum, found.mean, found.std]
        if key.endswith("/"):
            dtypes = sorted({leaf.dtype or "" for leaf in leaves})
            kind = dtypes[0] if len(dtypes) == 1 else "mixed"
            shape = f"{len(leaves)} array{'s' if len(leaves) != 1 else ''}"
        else:
            kind, shape = leaves[0].dtype or "", str(tuple(leaves[0].shape or ()))
        rows.append(
            [key, kind, shape] + [f"{value:.6g}" for value in numbers] + [str(found.nan_count)]
        )
    return "\n".join([*format_table(rows), summary_line(description)])


def collect_stats(
    ckpt: Checkpoint, description: Description, progress: bool | None = None
) -> dict[str, Any]:
    """Statistics of every array in `description`, streamed, with a progress bar on a terminal."""
    arrays = ckpt.arrays()
    paths = [leaf.path for leaf in description.arrays]
    counts = Progress(
        total_bytes=sum(arrays[p].nbytes for p in paths),
        total_leaves=len(paths),
        started=time.perf_counter(),
    )
    results = {}
    with progress_bar(
        "Computing statistics", counts.total_bytes, wants_progress(progress)
    ) as on_progress:
        for path in paths:
            results[path] = leaf_stats(arrays[path])
            counts.written_bytes += arrays[path].nbytes
            counts.written_leaves += 1
            if on_progress is not None:
                on_progress(counts)
    return results
