"""The built-in family tables, and a table turned into a `FamilyRecipe`.

The tables are the ``*.yaml`` files of this package, each naming its families and its target
(MaxText unless ``target: tunix``); a name is ``FAMILY:LAYOUT``. `_parse` checks a table
against the schema once (`_schema`) and builds the recipe of one layout: its leaves
(`_leaf`), layer groups and layout, the config fields its expressions read.

Example:
    >>> "llama3.1:maxtext-unscanned" in recipe_names(), is_recipe_name("llama3.1:maxtext")
    (True, True)
"""

from __future__ import annotations

import functools
from typing import Any

from .._errors import RecipeError
from ._expr import names_in
from ._index import TableHead, read_table, table_heads
from ._layout import SCANNED, LayerLayout, parse_blocks
from ._leaf import SCAN_AXIS, LayerGroup, parse_leaf
from ._multimodal import parse_language_model
from ._names import is_family_name, resolve_name, unknown_name
from ._recipe import FamilyRecipe
from ._schema import checked_table

LAYOUTS = {"maxtext": True, "maxtext-unscanned": False}
# The model code a table targets (its YAML's `target:`), and that target's layouts. A Tunix
# table writes its per-layer paths with the layer in them (``layers/{layer}/attn/q_proj/w``),
# as ``nnx.state`` of Tunix's models has them; its tree has no root and no step.
TARGETS = {"maxtext": LAYOUTS, "tunix": {"tunix": False}, "flax": {"flax": True}}
FLAX_SCAN_AXIS = 0  # nnx.scan's and nn.scan's default: a user's Flax table (target: flax)
# A tower table (`_whole`): a family's language model as FAMILY:maxtext, plus its vision tower.
# One whose `layouts:` are MaxText's (Qwen3-VL, a whole model with no text-only recipe of its
# own) is named by them: FAMILY:maxtext and FAMILY:maxtext-unscanned, the text in that layout.
TARGETS["maxtext-multimodal"] = {"maxtext-multimodal": True}
WHOLE = "maxtext-multimodal"


# The built-in recipes -------------------------------------------------------------------------


@functools.cache
def _families(target: str = "maxtext") -> dict[str, str]:
    """The tables' files of `target` (a YAML's ``target:``, MaxText when it has none), by
    family, from the tables' heads: a table is parsed whole only when used (`_table`)."""
    return {
        family: head.file
        for head in table_heads().values()
        if head.target == target or (target == "maxtext" and _whole_by_layout(head))
        for family in head.names
    }


def _table(target: str, family: str) -> dict[str, Any]:
    return read_table(_families(target)[family])


def _offered(target: str, file: str) -> tuple[str, ...]:
    """The layouts of `target` that the table `file` offers (its ``layouts:``, or all)."""
    layouts = table_heads()[file].layouts
    return tuple(TARGETS[target]) if layouts is None else layouts


def _whole_by_layout(head: TableHead) -> bool:
    """A tower table named by MaxText's layouts (``qwen3-vl:maxtext``), not by its own."""
    return head.target == WHOLE and any(layout in LAYOUTS for layout in head.layouts or ())


def _text(expression: Any) -> str:
    """An expression as text, keeping an `Expression` (which knows where it is) as it is."""
    return expression if isinstance(expression, str) else str(expression)


def recipe_names() -> list[str]:
    """Every built-in recipe name, e.g. ``llama3.1:maxtext`` or ``qwen3:tunix``."""
    return [
        f"{family}:{layout}"
        for target, layouts in TARGETS.items()
        for family, file in _families(target).items()
        for layout in layouts
        if layout in _offered(target, file)
    ]


def is_recipe_name(name: str) -> bool:
    if is_family_name(name):  # a family alone, in any case (`resolve_name`)
        return True
    return (
        isinstance(name, str)
        and ":" in name
        and any(name.split(":", 1)[0].lower() in _families(target) for target in TARGETS)
    )


def get_recipe(name: str) -> FamilyRecipe:
    """The built-in recipe `name` (``FAMILY:maxtext``, ``FAMILY:maxtext-unscanned``,
    ``FAMILY:maxtext-multimodal`` or ``FAMILY:tunix``, in any case; a family alone when one
    target takes it)."""
    name = resolve_name(name)
    family, _, layout = name.partition(":")
    target = next((t for t, layouts in TARGETS.items() if layout in layouts), None)
    if target is None or family not in _families(target):
        raise unknown_name(name)
    offered = _offered(target, _families(target)[family])
    if layout not in offered:
        raise RecipeError(
            f"No built-in recipe {name!r}: {family} has the layout(s) "
            f"{', '.join(f'{family}:{o}' for o in offered)} only (as its target's model has it)."
        )
    data = _table(target, family)
    if data.get("target") == WHOLE:
        from ._whole import whole_recipe

        return whole_recipe(family, data, _parse, layout)
    return _parse(family, data, TARGETS[target][layout])


def _parse(family: str, data: dict[str, Any], scanned: bool) -> FamilyRecipe:
    where = data["source_file"]
    data = checked_table(data, where)  # the whole table against the schema, once
    group_specs = data.get("layer_groups") or {
        "layer": {"count": "num_hidden_layers", "hf_index": "i"}
    }
    groups = {
        name: LayerGroup(
            _text(spec["count"]), _text(spec["hf_index"]), spec.get("unscanned") == "hf_index"
        )
        for name, spec in group_specs.items()
    }
    target = data.get("target", "maxtext")
    scan_axis = data.get("layer_axis", FLAX_SCAN_AXIS if target == "flax" else SCAN_AXIS)
    leaves = [
        parse_leaf(item, number, data, target, groups, where, scan_axis)
        for number, item in enumerate(data["leaves"])
    ]
    config = data.get("config", {})
    defaults = dict(config.get("defaults") or {})
    checks = tuple(config.get("checks") or ())
    experts_count = _text(data["experts"]) if "experts" in data else None
    period = str(data["layer_period"]) if "layer_period" in data else None
    layout = None
    if period is not None:
        under = data.get("layer_blocks_under")
        layout = LayerLayout(
            period,
            parse_blocks(data.get("layer_blocks")),
            f"{under}/" if under else SCANNED,
            _text(data["layer_blocks_from"]) if "layer_blocks_from" in data else None,
        )
    expressions: list[Any] = [check["test"] for check in checks]
    expressions += [text for group in groups.values() for text in (group.count, group.hf_index)]
    expressions += [e for e in (experts_count, period) if e is not None]
    expressions += [layout.start] if layout is not None and layout.start is not None else []
    layer_sets = tuple((data.get("layer_sets") or {}).items())
    expressions += [expression for _, expression in layer_sets]
    layer_rules = tuple(
        (field, tuple((kind, _text(rule)) for kind, rule in kinds.items()))
        for field, kinds in (data.get("layer_rules") or {}).items()
    )
    expressions += [rule for _, kinds in layer_rules for _, rule in kinds]
    for leaf in leaves:
        expressions += [leaf.when or 0, *(e for op in leaf.operations for e in op.expressions())]
        expressions += list(leaf.made.expressions() if leaf.made is not None else ())
        expressions += leaf.interleave.expressions() if leaf.interleave else []
        expressions += list(leaf.fused.sizes) if leaf.fused is not None else []
        expressions += leaf.stored.expressions() if leaf.stored else []
    read = set()
    for expression in expressions:
        read |= names_in(expression)
    default_inputs: dict[str, set[str]] = {}
    for field, default in defaults.items():
        for name in names_in(default):
            default_inputs.setdefault(name, set()).add(field)
    fields = set(defaults) | set(config.get("require") or {}) | read | set(default_inputs)
    return FamilyRecipe(
        family=family,
        scanned=scanned,
        follows=data["follows"],
        description=data["description"],
        require={k: list(v) for k, v in (config.get("require") or {}).items()},
        defaults=defaults,
        checks=checks,
        groups=groups,
        leaves=tuple(leaves),
        ignore=tuple(data.get("ignore") or ()),
        leave_out=tuple(data.get("leave_out") or ()),
        fields=frozenset(fields - {"i"}),
        target=target,
        experts=experts_count,
        layout=layout,
        language_model=parse_language_model(data.get("language_model"), where),
        layer_patterns=tuple(
            (field, tuple(pattern)) for field, pattern in (data.get("layer_patterns") or {}).items()
        ),
        layer_sets=layer_sets,
        layer_rules=layer_rules,
        per_layer=tuple((config.get("per_layer") or {}).items()),
        logical_axes=tuple(
            (path, tuple(axes)) for path, axes in (data.get("logical_axes") or {}).items()
        ),
        default_inputs={
            name: frozenset(users)
            for name, users in default_inputs.items()
            if name not in read and name not in defaults
        },
    )
