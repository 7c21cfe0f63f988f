"""A number a table reads that a config may give only as a per-layer list: the layer cycle.

``full_attention_period`` is the length of the cycle of ``layer_types`` that ends with its one
``full_attention`` layer (Gemma 4 E2B: 4 sliding + 1 full, so 5), worked out when the config
does not say it (a config that has it keeps its own). A ``layer_types`` that is not such a
cycle, repeated whole, is refused, naming where it departs. (Per-layer sizes, transformers
5.24's ``per_layer_config``, are read per kind by `_layer_config`.)

Example:
    >>> kinds = ["sliding_attention"] * 4 + ["full_attention"]
    >>> derived({"layer_types": kinds * 2}, {"full_attention_period"}, "r")
    {'full_attention_period': 5}
"""

from __future__ import annotations

from typing import Any

from .._errors import ConfigMismatchError

FULL = "full_attention"


def derived(
    names: dict[str, Any], wanted: set[str] | frozenset[str], recipe: str
) -> dict[str, Any]:
    """``full_attention_period`` from ``layer_types`` when `wanted` and the config lacks it."""
    kinds = names.get("layer_types")
    period_wanted = "full_attention_period" in wanted
    if period_wanted and names.get("full_attention_period") is None and isinstance(kinds, list):
        return {"full_attention_period": _period(kinds, recipe)}
    return {}


def _period(kinds: list[Any], recipe: str) -> int:
    if FULL not in kinds:
        raise ConfigMismatchError(
            f"config.json field 'layer_types' has no {FULL!r} layer; recipe {recipe!r} supports "
            f"a cycle of sliding layers ending in one {FULL!r} layer, repeated."
        )
    period = kinds.index(FULL) + 1
    cycle = [*kinds[: period - 1], FULL]
    for layer, kind in enumerate(kinds):
        if kind != cycle[layer % period] or (layer % period < period - 1 and kind == FULL):
            raise ConfigMismatchError(
                f"config.json field 'layer_types' makes layer {layer} {kind!r}; recipe "
                f"{recipe!r} supports only the cycle its first {period} layers set "
                f"({cycle}), repeated, so it expects {cycle[layer % period]!r} there."
            )
    if len(kinds) % period:
        raise ConfigMismatchError(
            f"config.json field 'layer_types' lists {len(kinds)} layers, not a whole number of "
            f"cycles of {period} (its last layer is not a {FULL!r} one); recipe {recipe!r} "
            f"supports whole cycles only."
        )
    return period
