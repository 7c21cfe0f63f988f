"""Which kind each layer is, as the config says and as the target model assumes.

Hybrid models name each layer's kind in their config: Gemma 3's ``layer_types`` (5
sliding-window layers, then 1 global), gpt-oss's (sliding, full, ...), Llama 4's
``no_rope_layers`` and ``moe_layers``. MaxText's models do not read these lists: they fix the
pattern in code. A checkpoint whose config departs from it still has tensors of the right
shapes, so the conversion would succeed and the model would then attend (or route) with
another layer's kind: wrong values, silently. A recipe names the pattern its target assumes
and the config is checked against it, layer by layer.

Two forms, as recipe files write them:

- ``layer_patterns: {FIELD: [v0, v1, ...]}``: layer ``i`` must be ``pattern[i % len]``
  (a list of one kind per layer: ``layer_types``, ``no_rope_layers``);
- ``layer_sets: {FIELD: EXPRESSION of i}``: the field lists exactly the layer numbers where
  the expression holds (``moe_layers``);
- ``layer_rules: {FIELD: {KIND: EXPRESSION of i}}``: the field lists one kind per layer, and
  layer ``i`` is the kind whose expression holds (DeepSeek-V4's ``compress_ratios``: two
  sliding-window layers, then CSA on even layers and HCA on odd ones); entries past
  ``num_hidden_layers`` (a multi-token-prediction layer's) are not layers of the model.

A field the config does not have is fine: transformers then builds it from the same
pattern the recipe names.

Example:
    >>> check_pattern("gemma3:maxtext", "layer_types", ["sliding", "full"], ("sliding", "full"), 2)
    >>> check_pattern("gemma3:maxtext", "layer_types", ["full", "full"], ("sliding", "full"), 2)
    Traceback (most recent call last):
    ...
    suture._errors.ConfigMismatchError: config.json field 'layer_types' makes layer 0 'full'; ...
"""

from __future__ import annotations

from typing import Any

from .._errors import ConfigMismatchError
from ._expr import evaluate


def check_pattern(
    recipe: str, field: str, value: Any, pattern: tuple[Any, ...], layers: int, why: str = ""
) -> None:
    """Refuses a per-layer list `value` that departs from the repeating `pattern`."""
    if value is None:
        return
    if not isinstance(value, list) or len(value) != layers:
        raise ConfigMismatchError(
            f"config.json field {field!r} is {_short(value)}; recipe {recipe!r} expects a list "
            f"of {layers} entries (one per layer, num_hidden_layers). Fix the config.json (or "
            f"pass the model's own with --config)."
        )
    for layer, kind in enumerate(value):
        expected = pattern[layer % len(pattern)]
        if kind != expected:
            raise ConfigMismatchError(
                f"config.json field {field!r} makes layer {layer} {kind!r}; recipe {recipe!r} "
                f"expects {expected!r} there (the pattern {list(pattern)} repeated{why}). The "
                f"target model fixes this pattern in code, so these weights would run with "
                f"another layer's kind there; this model cannot be converted to it as it is."
            )


def check_set(recipe: str, field: str, value: Any, expression: str, names: dict[str, Any]) -> None:
    """Refuses a list of layer numbers `value` other than the layers where `expression` holds."""
    if value is None:
        return
    layers = names["num_hidden_layers"]
    expected = [i for i in range(layers) if evaluate(expression, {**names, "i": i})]
    if value != expected:
        raise ConfigMismatchError(
            f"config.json field {field!r} is {_short(value)}; recipe {recipe!r} expects "
            f"{_short(expected)} (the layers where {expression}). The target model places "
            f"these layers by that rule in code, so these weights would run in other layers' "
            f"places; this model cannot be converted to it as it is."
        )


def check_rules(
    recipe: str, field: str, value: Any, rules: tuple[tuple[Any, str], ...], names: dict[str, Any]
) -> None:
    """Refuses a per-layer list `value` whose layer ``i`` is not the kind whose rule holds."""
    if value is None:
        return
    layers = names["num_hidden_layers"]
    if not isinstance(value, list) or len(value) < layers:
        raise ConfigMismatchError(
            f"config.json field {field!r} is {_short(value)}; recipe {recipe!r} expects a list "
            f"of at least {layers} entries (one per layer, num_hidden_layers). Fix the "
            f"config.json (or pass the model's own with --config)."
        )
    for layer, kind in enumerate(value[:layers]):
        expected = [k for k, rule in rules if evaluate(rule, {**names, "i": layer})]
        if expected != [kind]:
            said = "; ".join(f"{k!r} where {rule}" for k, rule in rules)
            raise ConfigMismatchError(
                f"config.json field {field!r} makes layer {layer} {kind!r}; recipe {recipe!r} "
                f"expects {expected[0] if expected else 'no kind'!r} there ({said}). The "
                f"target model fixes these kinds in code, so these weights would run with "
                f"another layer's kind there; this model cannot be converted to it as it is."
            )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
