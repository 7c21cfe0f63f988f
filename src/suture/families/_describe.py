"""What a recipe does, as text: its rows for plans and `suture recipes`, its layer kinds.

Example:
    >>> from suture.families import get_recipe
    >>> layer_kinds(get_recipe("gpt-oss:maxtext"))
    ["layer_types is ['sliding_attention', 'full_attention'] repeated"]
"""

from __future__ import annotations

from typing import Any

from ._experts import stacked_axes
from ._leaf import SCAN_AXIS, Leaf
from ._shared_sources import shared_note, shared_sources


def layer_kinds(recipe: Any) -> list[str]:
    """The per-layer kinds `recipe`'s target fixes in code, as `suture recipes NAME` shows them."""
    patterns = [f"{field} is {list(pattern)} repeated" for field, pattern in recipe.layer_patterns]
    sets = [f"{field} lists the layers where {rule}" for field, rule in recipe.layer_sets]
    rules = [
        f"{field}: " + ", ".join(f"{kind!r} where {rule}" for kind, rule in kinds)
        for field, kinds in recipe.layer_rules
    ]
    return patterns + sets + rules


def operations_table(recipe: Any, config: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(target leaf, HF tensor, operations) rows of `recipe` for the model of `config`."""
    names = recipe.config_names(config)
    shared = shared_sources(recipe._active(names))
    return [
        (
            leaf.maxtext,
            " + ".join(leaf.sources()) if leaf.made is None else "-",
            ", ".join(
                [
                    *([leaf.made.describe()] if leaf.made is not None else []),
                    *([leaf.stored.describe(names)] if leaf.stored is not None else []),
                    *_stacking(leaf, recipe.scanned),
                    *([leaf.interleave.describe()] if leaf.interleave else []),
                    *(op.describe(names) for op in leaf.operations),
                    *(["stacked on axis 0"] if leaf.stacked and not leaf.interleave else []),
                    *shared_note(leaf, shared),
                ]
            )
            or "-",
        )
        for leaf in recipe._active(names)
    ]


def _stacking(leaf: Leaf, scanned: bool) -> list[str]:
    steps = []
    if leaf.experts:
        axis = leaf.expert_axis if scanned else stacked_axes(leaf.expert_axis, leaf.layer_axis)[0]
        steps.append(f"experts on axis {axis}")
    if leaf.fused is not None:
        fused = leaf.fused
        where = (
            ""
            if fused.axis is None
            else f" part {fused.part} of {fused.parts} on axis {fused.axis}, {fused.mode}"
        )
        if fused.sizes and fused.axis is not None:
            where = f" part {fused.part} of parts ({', '.join(fused.sizes)}) on axis {fused.axis}"
        steps.append(f"{'from' if leaf.always_fused else 'or'} fused {fused.hf}{where}")
    if scanned and leaf.group is not None and leaf.layer_axis != SCAN_AXIS:
        steps.append(f"layers on axis {leaf.layer_axis}")
    if leaf.collection:
        steps.append(f"in collection {leaf.collection}")
    return steps
