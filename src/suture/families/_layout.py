"""Where a per-layer leaf's layers go in a scanned MaxText tree: periods, blocks, nested stacks.

MaxText scans layers in one of three ways, and a table says which:

- every layer on the scan axis (no ``layer_period``);
- a period of P layers (``layer_period: P``, Gemma 3, OLMo 3): position k of the period is
  ``layers/layers_k``, stacking HF layers k, k+P, ... (a stride); the layers after the last
  whole period stay unscanned in ``layers_remainder/layers_r``;
- blocks of one period each (``layer_blocks``, Qwen3-Next's ``Qwen3NextScannableBlock``): the
  positions of a period go to named places of the block, under ``decoder/layers/`` or where
  ``layer_blocks_under`` says (Gemma 4's ``decoder/scanned_blocks``). A place of several positions
  (``local_layers: [0, 1, 2]``) is a nested stack, (blocks, positions) on two axes from the
  layer axis on; a place of one position (``global_layer: 3``) has the block axis only. The
  layers after the last whole period form a shorter block, ``layers_remainder/<place>``, whose
  places stack their positions on the layer axis alone (as MaxText's model builds it).
  ``layer_blocks_from: N`` leaves the first N layers unscanned, ``decoder/layers_i`` as an
  unscanned tree has them, and counts the blocks' positions from layer N on (DeepSeek-V4's
  hash-routed first layers, then its ``scanned_blocks`` of two).

A `Slot` is one target path and the HF layers it holds, with the lengths of its stacked axes
(`grid`): () for one layer, (n,) for a stack, (blocks, positions) for a nested one. HF layers
are listed in row-major order of the grid, so the inverse takes them apart index by index.

Example:
    >>> layout = LayerLayout("4", (("local_layers", (0, 1, 2)), ("global_layer", 3)))
    >>> [(s.path, s.indices, s.grid) for s in layout.slots("decoder/layers/x", [3, 7], 8, {})]
    [('decoder/layers/global_layer/x', (3, 7), (2,))]
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigMismatchError
from .._lazy.array import LazyArray
from .._lazy.combine import stack as stack_arrays
from ._experts import member
from ._expr import evaluate

SCANNED = "decoder/layers/"
_INDEX = re.compile(r"0|[1-9][0-9]*")  # a layer number as MaxText writes it
REMAINDER = "decoder/layers_remainder/"


@dataclass(frozen=True)
class Slot:
    path: str  # target path below the root
    indices: tuple[int, ...]  # its HF layers, in row-major order of `grid`
    grid: tuple[int, ...]  # lengths of the stacked axes from the layer axis on


@dataclass(frozen=True)
class LayerLayout:
    """A scanned layout with a period: `blocks` names each place of the period's positions
    (a tuple of positions: nested; one position: the block axis only), or None for
    ``layers/layers_k``."""

    period: Any  # expression
    blocks: tuple[tuple[str, tuple[int, ...] | int], ...] | None = None
    under: str = SCANNED  # where the blocks' places are (Gemma 4: decoder/scanned_blocks/)
    start: Any = None  # expression: the first layers, left unscanned (DeepSeek-V4's hash layers)

    def length(self, names: dict[str, Any]) -> int:
        return int(evaluate(self.period, names))

    def first(self, names: dict[str, Any]) -> int:
        """How many first layers stay unscanned, ``decoder/layers_i``."""
        return 0 if self.start is None else int(evaluate(self.start, names))

    def slots(
        self, path: str, indices: Sequence[int], layers: int, names: dict[str, Any]
    ) -> list[Slot]:
        """The slots of a leaf at `path` (``decoder/layers/...``) holding HF layers `indices`
        of a model of `layers` layers; a place none of them fills is left out, so a group of
        some of the layers (Llama 4's MoE layers) fills only its own positions."""
        first = self.first(names)
        kept = [Slot(_unscanned(path, i), (i,), ()) for i in indices if i < first]
        scanned = [i - first for i in indices if i >= first]
        moved = self._scanned(path, scanned, layers - first, names) if scanned else []
        return kept + [Slot(s.path, tuple(i + first for i in s.indices), s.grid) for s in moved]

    def _scanned(
        self, path: str, indices: Sequence[int], layers: int, names: dict[str, Any]
    ) -> list[Slot]:
        """`slots` of the scanned layers, numbered from the first scanned one."""
        period = self.length(names)
        full = layers - layers % period
        if self.blocks is None:
            slots = []
            for k in range(period):
                members = tuple(i for i in indices if i < full and i % period == k)
                if members:
                    slots.append(
                        Slot(_moved(path, f"{SCANNED}layers_{k}/"), members, (len(members),))
                    )
            return slots + [
                Slot(_moved(path, f"{REMAINDER}layers_{i - full}/"), (i,), ())
                for i in indices
                if i >= full
            ]
        slots = []
        for place, positions in self.blocks:
            nested = isinstance(positions, tuple)
            wanted = positions if nested else (positions,)
            scanned = [i for i in indices if i < full and i % period in wanted]
            if scanned:
                order = sorted(scanned, key=lambda i: (i // period, wanted.index(i % period)))
                blocks = full // period
                grid = (blocks, len(wanted)) if nested else (blocks,)
                expected = [b * period + p for b in range(blocks) for p in wanted]
                if order != expected:
                    raise ConfigMismatchError(
                        f"Leaf {path!r}: the layers {order} fill only part of place "
                        f"{place!r} (positions {list(wanted)} of every block of {period}). The "
                        f"table's layer groups do not fit its layer_blocks."
                    )
                slots.append(Slot(_moved(path, f"{self.under}{place}/"), tuple(order), grid))
            rest = tuple(i for i in indices if i >= full and i % period in wanted)
            if rest:
                grid = (len(rest),) if nested else ()
                slots.append(Slot(_moved(path, f"{REMAINDER}{place}/"), rest, grid))
        return slots

    def held(
        self, path: str, flat: dict[str, Any], prefix: str, axis: int, names: dict[str, Any]
    ) -> int:
        """How many layers the target tree `flat` holds for the leaf at `path`, in every place."""
        first = sum(prefix + _unscanned(path, i) in flat for i in range(self.first(names)))
        return first + self._held(path, flat, prefix, axis, names)

    def _held(
        self, path: str, flat: dict[str, Any], prefix: str, axis: int, names: dict[str, Any]
    ) -> int:
        if self.blocks is None:
            held = sum(
                _length(flat.get(prefix + _moved(path, f"{SCANNED}layers_{k}/")), axis, 1)
                for k in range(self.length(names))
            )
            start, tail = prefix + REMAINDER + "layers_", "/" + path.removeprefix(SCANNED)
            return held + sum(
                1
                for p in flat
                if p.startswith(start)
                and p.endswith(tail)
                and _INDEX.fullmatch(p[len(start) : len(p) - len(tail)])
            )
        held = 0
        for place, positions in self.blocks:
            depth = 2 if isinstance(positions, tuple) else 1
            for root, depth_there in ((self.under, depth), (REMAINDER, depth - 1)):
                held += _length(
                    flat.get(prefix + _moved(path, f"{root}{place}/")), axis, depth_there
                )
        return held

    def describe(self) -> str:
        if self.blocks is None:
            return f"layer period {self.period}"
        places = ", ".join(
            f"{place} {list(p) if isinstance(p, tuple) else p}" for place, p in self.blocks
        )
        after = f" after the first {self.start} layers, unscanned" if self.start else ""
        return f"blocks of {self.period} layers{after}: {places}"


def _length(array: Any, axis: int, depth: int) -> int:
    """Layers an array holds on `depth` axes from `axis` (0 for none: no array there)."""
    if array is None:
        return 0
    shape = tuple(array.shape)
    return math.prod(shape[axis : axis + depth]) if len(shape) >= axis + depth else 0


def _moved(path: str, to: str) -> str:
    return path.replace(SCANNED, to, 1)


def _unscanned(path: str, index: int) -> str:
    """``decoder/layers/x`` -> ``decoder/layers_3/x``: a first layer, as unscanned."""
    return path.replace(SCANNED, f"decoder/layers_{index}/", 1)


def stack_grid(members: Sequence[LazyArray], grid: tuple[int, ...], axis: int) -> LazyArray:
    """`members` (row-major in `grid`) stacked on `len(grid)` axes from `axis` on: the inner
    axis first, so each outer stack pushes it one further."""
    if not grid:
        (only,) = members
        return only
    inner = math.prod(grid[1:])
    rows = [
        stack_grid(members[b * inner : (b + 1) * inner], grid[1:], axis) for b in range(grid[0])
    ]
    return stack_arrays(rows, axis=axis)


def grid_members(array: LazyArray, grid: tuple[int, ...], axis: int) -> list[LazyArray]:
    """The members of a stack made by `stack_grid`, in row-major order, lazily."""
    out = []
    for flat_index in range(math.prod(grid)):
        at, rest = {}, flat_index
        for depth in reversed(range(len(grid))):
            rest, at[axis + depth] = divmod(rest, grid[depth])
        out.append(member(array, at))
    return out


def grid_fits(array: Any, grid: tuple[int, ...], axis: int) -> bool:
    shape = tuple(array.shape)
    return len(shape) >= axis + len(grid) and shape[axis : axis + len(grid)] == grid


def parse_blocks(spec: Any) -> tuple[tuple[str, tuple[int, ...] | int], ...] | None:
    """A table's ``layer_blocks`` (checked by the schema): place -> positions, in order."""
    if not spec:
        return None
    return tuple(
        (place, tuple(positions) if isinstance(positions, list) else positions)
        for place, positions in spec.items()
    )
