"""A recipe's experts: how many, how the Hugging Face checkpoint stores them, checked.

transformers writes a MoE layer's experts one tensor per expert
(``mlp.experts.0.gate_proj.weight``) or fused into one tensor per layer
(``mlp.experts.gate_up_proj``); `find_expert_layout` looks at the first expert leaf's first
layer to say which, and `check_experts` checks a leaf's expert axis against the config's
count.

Example:
    >>> from suture.families import get_recipe
    >>> expert_count(get_recipe("mixtral:maxtext"), {"num_local_experts": 8})
    8
"""

from __future__ import annotations

from typing import Any

from .._errors import ConfigMismatchError, did_you_mean
from .._lazy.array import LazyArray
from ._config_check import fields_shown as _fields_shown
from ._experts import FUSED, PER_EXPERT, check_count, stacked_axes
from ._expr import evaluate
from ._leaf import Leaf
from ._ops import RecipeFormatError


def expert_count(recipe: Any, names: dict[str, Any]) -> int:
    """How many experts a MoE layer of `recipe` has, by the config (`names`)."""
    if recipe.experts is None:
        raise RecipeFormatError(f"Recipe {recipe.name!r} uses {{expert}} but sets no 'experts'.")
    return int(evaluate(recipe.experts, names))


def find_expert_layout(recipe: Any, hf: dict[str, Any], names: dict[str, Any]) -> str | None:
    """How the HF tensors `hf` store experts: ``"per-expert"``, ``"fused"``, or None."""
    leaf = next(
        (leaf for leaf in recipe._active(names) if leaf.experts and leaf.group is not None),
        None,
    )
    if leaf is None:
        return None
    group = leaf.group
    if not recipe.layer_counts(names)[group]:  # type: ignore[index]
        return PER_EXPERT
    first = int(evaluate(recipe.groups[group].hf_index, {**names, "i": 0}))  # type: ignore[index]
    per_expert = leaf.hf_name(PER_EXPERT, first, 0)
    if per_expert in hf or leaf.fused is None:
        return PER_EXPERT
    fused = leaf.hf_name(FUSED, first)
    if fused in hf:
        return FUSED
    raise ConfigMismatchError(
        f"Recipe {recipe.name!r} finds the experts of layer {first} neither as "
        f"{per_expert!r} (one tensor per expert) nor as {fused!r} (transformers' fused "
        f"layout).{did_you_mean(per_expert, hf)} Is this a {recipe.family} checkpoint?"
    )


def check_experts(recipe: Any, leaf: Leaf, array: LazyArray, names: dict, named: str) -> None:
    """One layer's `array` of `leaf` holds the config's count of experts on its axis."""
    axis = leaf.expert_axis
    if leaf.group is not None:
        axis, _ = stacked_axes(leaf.expert_axis, leaf.layer_axis)
    check_count(
        array, axis, expert_count(recipe, names), "experts", named, experts_said(recipe, names)
    )


def experts_said(recipe: Any, names: dict[str, Any]) -> str:
    """``config.json gives num_local_experts=2``: where the count of experts comes from."""
    return f"config.json gives {_fields_shown(recipe.experts, names)}"
