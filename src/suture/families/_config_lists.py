"""Numbers a table reads that a config may give only as per-layer lists.

Tables do arithmetic on numbers; newer transformers configs describe some of them layer by
layer instead. A table reads these names, and they are worked out here when the config lacks
them (a config that has them keeps its own):

- ``full_attention_period``: the length of the cycle of ``layer_types`` that ends with its one
  ``full_attention`` layer (Gemma 4 E2B: 4 sliding + 1 full, so 5). A ``layer_types`` that is
  not such a cycle, repeated whole, is refused, naming where it departs.
- ``global_head_dim``, ``num_global_key_value_heads``: the full-attention layers' ``head_dim``
  and ``num_key_value_heads`` from ``per_layer_config`` (transformers 5.24 writes
  ``{"04": {"head_dim": 512}, ...}`` where published Gemma 4 configs have ``global_head_dim``).
  Every full-attention layer's entry must agree.

Example:
    >>> kinds = ["sliding_attention"] * 4 + ["full_attention"]
    >>> derived({"layer_types": kinds * 2, "per_layer_config": {"04": {"head_dim": 32}}},
    ...         {"full_attention_period", "global_head_dim"}, "r")
    {'full_attention_period': 5, 'global_head_dim': 32}
"""

from __future__ import annotations

from typing import Any

from .._errors import ConfigMismatchError

FULL = "full_attention"
PER_LAYER = {"global_head_dim": "head_dim", "num_global_key_value_heads": "num_key_value_heads"}


def derived(
    names: dict[str, Any], wanted: set[str] | frozenset[str], recipe: str
) -> dict[str, Any]:
    """The fields of `wanted` this module knows that `names` lacks (or has as null), worked out
    from its per-layer lists; those the lists do not give are left out."""
    out: dict[str, Any] = {}
    kinds = names.get("layer_types")
    period_wanted = "full_attention_period" in wanted
    if period_wanted and names.get("full_attention_period") is None and isinstance(kinds, list):
        out["full_attention_period"] = _period(kinds, recipe)
    per_layer = names.get("per_layer_config")
    for field, key in PER_LAYER.items():
        if field in wanted and names.get(field) is None and isinstance(per_layer, dict):
            value = _full_layers_value(per_layer, kinds, key, field, recipe)
            if value is not None:
                out[field] = value
    return out


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


def _full_layers_value(
    per_layer: dict[str, Any], kinds: Any, key: str, field: str, recipe: str
) -> Any:
    """The value of `key` every full-attention layer's entry of `per_layer` gives, or None."""
    full = {i for i, kind in enumerate(kinds) if kind == FULL} if isinstance(kinds, list) else None
    values = {}
    for layer, entry in per_layer.items():
        number = int(layer) if str(layer).isdigit() else None
        if isinstance(entry, dict) and key in entry and (full is None or number in full):
            values[layer] = entry[key]
    if len(set(map(repr, values.values()))) > 1:
        raise ConfigMismatchError(
            f"config.json field 'per_layer_config' gives the full-attention layers different "
            f"{key!r} values ({values}); recipe {recipe!r} supports one {field!r} for them all."
        )
    return next(iter(values.values()), None)
