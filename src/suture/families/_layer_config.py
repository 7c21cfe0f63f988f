"""Per-layer config overrides, read as one field per layer kind.

transformers 5 writes some hybrid models' per-layer sizes as a mapping from layer number to
the fields that differ there: Gemma 4's ``per_layer_config`` gives its full-attention layers
their own ``head_dim`` and ``num_key_value_heads`` (the published configs say
``global_head_dim`` and ``num_global_key_value_heads`` instead). Recipe expressions take
numbers only, so a table names the mapping and the per-layer list of kinds that goes with it
(``config: {per_layer: {per_layer_config: layer_types}}``), and each override becomes a field
``KIND_FIELD`` (``full_attention_head_dim``) that its expressions and defaults read. The
layers of one kind must agree, since MaxText stacks them into one array.

Example:
    >>> per_kind_fields(
    ...     "gemma4:maxtext",
    ...     {"layer_types": ["sliding_attention", "full_attention"],
    ...      "per_layer_config": {"1": {"head_dim": 32}}},
    ...     (("per_layer_config", "layer_types"),),
    ... )
    {'full_attention_head_dim': 32}
"""

from __future__ import annotations

import re
from typing import Any

from .._errors import ConfigMismatchError

_NUMBER = re.compile(r"[0-9]{1,9}")  # transformers pads them: "05" for 12 layers
_NAME = re.compile(r"[A-Za-z_]\w*")


def per_kind_fields(
    recipe: str, names: dict[str, Any], per_layer: tuple[tuple[str, str], ...]
) -> dict[str, Any]:
    """``{KIND_FIELD: value}`` from each ``(mapping field, kinds field)`` of `per_layer`
    the config has; a field the config itself has is not overridden."""
    out: dict[str, Any] = {}
    for field, kinds_field in per_layer:
        overrides = names.get(field)
        if overrides is None:
            continue
        kinds = names.get(kinds_field)
        if not isinstance(overrides, dict):
            _refuse(recipe, field, overrides, "a mapping of layer numbers to {field: value}")
        if not isinstance(kinds, list) or not all(isinstance(k, str) for k in kinds):
            raise ConfigMismatchError(
                f"config.json field {field!r} gives per-layer values, and recipe {recipe!r} "
                f"reads them by the kind of each layer, which {kinds_field!r} names; it is "
                f"{_short(kinds)}. Pass the model's own config.json (--config)."
            )
        found: dict[str, tuple[Any, int]] = {}
        for key, fields in overrides.items():
            layer = _layer(recipe, field, key, len(kinds))
            if not isinstance(fields, dict):
                _refuse(recipe, f"{field}.{key}", fields, "a mapping of config fields to values")
            for name, value in fields.items():
                if not isinstance(name, str) or not _NAME.fullmatch(name):
                    _refuse(recipe, f"{field}.{key}", name, "config field names")
                merged = f"{kinds[layer]}_{name}"
                if merged in found and found[merged][0] != value:
                    other = found[merged][1]
                    raise ConfigMismatchError(
                        f"config.json field {field!r} gives layer {other} {name}={found[merged][0]!r} "
                        f"and layer {layer} {name}={value!r}, both {kinds[layer]!r} layers; "
                        f"recipe {recipe!r} stacks the layers of one kind into one array and "
                        f"needs them alike. This model cannot be converted to it as it is."
                    )
                found.setdefault(merged, (value, layer))
        out.update({merged: value for merged, (value, _) in found.items() if merged not in names})
    return out


def _layer(recipe: str, field: str, key: Any, layers: int) -> int:
    text = str(key)
    if not _NUMBER.fullmatch(text) or int(text) >= layers:
        raise ConfigMismatchError(
            f"config.json field {field!r} names layer {key!r}; recipe {recipe!r} expects layer "
            f"numbers 0 to {layers - 1} (one per entry of the per-layer list of kinds). Fix "
            f"the config.json (or pass the model's own with --config)."
        )
    return int(text)


def _refuse(recipe: str, field: str, value: Any, wanted: str) -> None:
    raise ConfigMismatchError(
        f"config.json field {field!r} is {_short(value)}; recipe {recipe!r} needs {wanted}. "
        f"Fix the config.json (or pass the model's own with --config)."
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
