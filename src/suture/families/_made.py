"""Leaves a table makes with no Hugging Face source: constant arrays the target model holds and
the HF checkpoint does not (a scale of ones, a bias of zeros).

A table writes such a leaf with ``make:`` in place of ``hf:``::

    - maxtext: decoder/extra_norm/scale
      make: {fill: 1.0, shape: [hidden_size], dtype: float32}

To the target, the recipe writes the constant; back to HF there is nothing to write it to, so
it is dropped, after checking that the target tree holds it with the shape the config gives
(a leaf of another shape means the config does not belong to the checkpoint). A per-layer one
names its layer group with ``layers: GROUP`` (``layer`` for every layer) and is made once per
layer, stacked as the group's other leaves are.

Example:
    >>> made = parse_made({"fill": 0, "shape": ["hidden_size"], "dtype": "float32"}, "t.yaml")
    >>> made.array({"hidden_size": 3}).read().tolist()
    [0.0, 0.0, 0.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .._dtypes import to_dtype
from .._errors import ConfigMismatchError, RecipeFormatError
from .._lazy.array import LazyArray, as_lazy
from ._expr import whole

KEYS = ("fill", "shape", "dtype", "layers")
DTYPES = ("bfloat16", "float16", "float32", "float64")


@dataclass(frozen=True)
class Made:
    """A constant leaf: `fill` everywhere, of `shape` (expressions of the config), `dtype`."""

    fill: float
    shape: tuple[Any, ...]
    dtype: str = "float32"
    layers: str | None = None  # the layer group of a per-layer leaf

    def shape_for(self, names: dict[str, Any]) -> tuple[int, ...]:
        return tuple(whole(size, names, "a made leaf's size") for size in self.shape)

    def array(self, names: dict[str, Any]) -> LazyArray:
        """The constant, lazily: one element broadcast, so it takes no memory until written."""
        one = np.asarray(self.fill, dtype=to_dtype(self.dtype))
        return as_lazy(np.broadcast_to(one, self.shape_for(names)), path=f"fill {self.fill:g}")

    def check(self, array: LazyArray, path: str, names: dict[str, Any], recipe: str) -> None:
        """Refuses a target leaf `array` at `path` that is not of the shape the config gives."""
        wanted = self.shape_for(names)
        if tuple(array.shape) != wanted:
            raise ConfigMismatchError(
                f"Leaf {path!r} has shape {tuple(array.shape)}; recipe {recipe!r} makes it "
                f"{wanted} with this config (shape {list(map(str, self.shape))}). Pass the "
                f"config.json of this checkpoint (--config)."
            )

    def describe(self) -> str:
        return (
            f"made: {self.fill:g} x [{', '.join(map(str, self.shape))}] {self.dtype}, dropped back"
        )

    def expressions(self) -> tuple[Any, ...]:
        return self.shape


def parse_made(spec: dict[str, Any], where: str) -> Made:
    """A ``make:`` entry (already checked by the schema) as a `Made`."""
    if not isinstance(spec, dict) or "fill" not in spec or "shape" not in spec:
        raise RecipeFormatError(f"{where}: 'make' needs {{fill: NUMBER, shape: [sizes]}}.")
    return Made(
        float(spec["fill"]),
        tuple(spec["shape"]),
        str(spec.get("dtype", "float32")),
        spec.get("layers"),
    )


def schema_problems(spec: Any) -> list[str]:
    """What is wrong with a ``make:`` entry, for the table's schema (`_schema`)."""
    if not isinstance(spec, dict):
        return ["must be {fill: NUMBER, shape: [sizes], dtype: float32, layers: GROUP}"]
    problems = [
        f"unknown key {key!r}; known keys: {', '.join(KEYS)}" for key in spec if key not in KEYS
    ]
    fill = spec.get("fill")
    if isinstance(fill, bool) or not isinstance(fill, int | float) or not np.isfinite(fill):
        problems.append(f"fill must be a finite number; got {fill!r:.40}")
    if not isinstance(spec.get("shape"), list):
        problems.append("shape must be a list of sizes (expressions of the config)")
    if spec.get("dtype", "float32") not in DTYPES:
        problems.append(f"dtype must be one of {', '.join(DTYPES)}; got {spec['dtype']!r:.40}")
    if "layers" in spec and not isinstance(spec["layers"], str):
        problems.append("layers must name a layer group")
    return problems
