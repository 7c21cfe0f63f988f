"""A model's config.json read for a recipe: defaults filled in, every field checked first.

Every field a recipe reads is checked for its kind before any arithmetic (a count is a whole
number of at least 1, a flag true or false, anything else a finite number), then the table's
``require`` values and ``checks``, its per-layer kinds, and its layer counts; a wrong value
is a `ConfigMismatchError` naming the field, not a failure deep in a conversion.

Example:
    >>> check_kind("r", "num_hidden_layers", 0, "")
    Traceback (most recent call last):
    ...
    suture._errors.ConfigMismatchError: config.json field 'num_hidden_layers' is 0; recipe 'r' needs a whole number of at least 1. Fix the config.json (or pass the model's own with --config).
"""

from __future__ import annotations

import math
from typing import Any

from .._errors import ConfigMismatchError
from ._config_lists import derived
from ._expr import evaluate, names_in
from ._layer_config import per_kind_fields
from ._layer_kinds import check_pattern, check_rules, check_set
from ._table_errors import unknown_field

# The config.json fields recipes read, by kind: Hugging Face's names, the same in every family.
# Any other field a recipe's expressions read must be a finite number.
COUNT_FIELDS = frozenset(
    {
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_size",
        "vocab_size",
        "padded_vocab_size",
        "num_local_experts",
        "num_experts",
        "n_routed_experts",
        "interleave_moe_layer_step",
        # Qwen3-Omni's tower table reads its two sub-configs under name prefixes
        "vision_depth",
        "vision_hidden_size",
        "vision_num_heads",
        "audio_d_model",
        "audio_encoder_layers",
        "audio_encoder_attention_heads",
    }
)
FLAG_FIELDS = frozenset(
    {
        "tie_word_embeddings",
        "attention_bias",
        "mlp_bias",
        "use_sliding_window",
        "norm_topk_prob",
        "attention_k_eq_v",
        "enable_moe_block",
        "use_double_wide_mlp",
        "standardize",  # Gemma 4 vision: std_scale and std_bias stored
    }
)
# layer lists: Qwen3-MoE's mlp_only_layers is a list of layer numbers ([] for none) or false;
# Qwen3-VL's deepstack_visual_indexes, the vision layers feeding its deepstack mergers
LIST_FIELDS = frozenset(
    {"mlp_only_layers", "deepstack_visual_indexes", "vision_deepstack_visual_indexes"}
)
MAX_COUNT = 1 << 62  # past any tensor's length (TensorStore's index limit)


def config_names(recipe: Any, config: dict[str, Any]) -> dict[str, Any]:
    """The config's fields with `recipe`'s defaults filled in, checked against it.

    A multimodal model's config holds the language model's in a sub-config
    (``text_config``), which is the one a recipe with a ``language_model`` entry reads.
    """
    if not isinstance(config, dict):
        raise ConfigMismatchError(
            f"Recipe {recipe.name!r} needs the model's config.json, a JSON object; got "
            f"{type(config).__name__}."
        )
    names = recipe.language_model.text_config(config) if recipe.language_model else dict(config)
    names.update(per_kind_fields(recipe.name, names, recipe.per_layer))
    names.update(derived(names, recipe.fields, recipe.name))  # from per-layer lists
    for field in recipe.require:  # first: another family's model is named as such
        if field not in recipe.defaults:
            _check_required(recipe, field, names)
    for field in sorted(recipe.fields):
        if names.get(field) is None and field not in recipe.defaults:
            if field in recipe.require:
                continue  # said below, with the values the recipe fits
            if _only_for_defaults_not_needed(recipe, field, names):
                continue
            if recipe.table_file and field not in names:  # a typo in the table, perhaps
                known = [*names, *recipe.defaults]
                raise unknown_field(recipe.name, recipe.table_file, recipe.leaves, field, known)
            raise ConfigMismatchError(
                f"config.json has no {field!r}{' (it is null)' if field in names else ''}; "
                f"recipe {recipe.name!r} needs it. Pass the model's own config.json "
                f"(--config)."
            )
        if names.get(field) is not None and field not in recipe.require:
            check_kind(recipe.name, field, names[field], "")
    for field, default in recipe.defaults.items():
        if names.get(field) is None:
            names[field] = evaluate(default, names)
            check_kind(recipe.name, field, names[field], f" (its default, {default})")
    for field in recipe.require:
        _check_required(recipe, field, names)
    for check in recipe.checks:
        if not evaluate(check["test"], names):
            field = check["field"]
            raise ConfigMismatchError(
                f"config.json field {field!r} is {names.get(field)!r}: {check['message']} "
                f"(recipe {recipe.name!r}, which follows {recipe.follows})."
            )
    layers = names.get("num_hidden_layers")
    for field, pattern in recipe.layer_patterns:
        check_pattern(recipe.name, field, names.get(field), pattern, layers)
    for field, expression in recipe.layer_sets:
        check_set(recipe.name, field, names.get(field), expression, names)
    for field, rules in recipe.layer_rules:
        check_rules(recipe.name, field, names.get(field), rules, names)
    return names


def _check_required(recipe: Any, field: str, names: dict[str, Any]) -> None:
    allowed = recipe.require[field]
    if names.get(field) not in allowed:
        raise ConfigMismatchError(
            f"config.json field {field!r} is {names.get(field)!r:.80}; recipe "
            f"{recipe.name!r} fits {', '.join(map(repr, allowed))}. Pick the recipe of this "
            f"model's family (`suture recipes` lists them)."
        )


def _only_for_defaults_not_needed(recipe: Any, field: str, names: dict[str, Any]) -> bool:
    """Whether `field` is read only by defaults whose own fields the config has."""
    users = (recipe.default_inputs or {}).get(field)
    return bool(users) and all(names.get(user) is not None for user in users)


def check_kind(recipe: str, field: str, value: Any, how: str) -> None:
    """Refuses a `value` of config field `field` that is not of its kind (count, flag ...)."""
    if field in FLAG_FIELDS:
        wanted = "true or false"
        fits = isinstance(value, bool)
    elif field in LIST_FIELDS:
        wanted = "a list of layer numbers, or false"
        fits = value is False or (
            isinstance(value, list)
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        )
    elif field in COUNT_FIELDS:
        wanted = "a whole number of at least 1"
        fits = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        if fits and value > MAX_COUNT:
            wanted, fits = f"a whole number up to 2**{MAX_COUNT.bit_length() - 1}", False
    else:
        wanted = "a finite number"
        number = isinstance(value, int | float) and not isinstance(value, bool)
        # abs() first: math.isfinite() of a 400-digit int raises OverflowError
        fits = number and abs(value) <= MAX_COUNT and math.isfinite(value)
    if not fits:
        raise ConfigMismatchError(
            f"config.json field {field!r} is {shown(value)}{how}; recipe {recipe!r} "
            f"needs {wanted}. Fix the config.json (or pass the model's own with --config)."
        )


def layer_counts(recipe: Any, names: dict[str, Any]) -> dict[str, int]:
    """How many target layers each of `recipe`'s layer groups has, from the checked config."""
    counts = {}
    for group, spec in recipe.groups.items():
        count = evaluate(spec.count, names)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigMismatchError(
                f"Recipe {recipe.name!r}: the layer count {spec.count} is {count!r} with this "
                f"config ({fields_shown(spec.count, names)}); it must be a whole number."
            )
        counts[group] = count
    return counts


def shown(value: Any) -> str:
    """A config value for a message, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def fields_shown(expression: Any, names: dict[str, Any]) -> str:
    """``num_hidden_layers=2, head_dim=8``: the config fields `expression` reads."""
    return ", ".join(f"{field}={shown(names.get(field))}" for field in sorted(names_in(expression)))
