"""One target leaf written by several layer groups: per-layer-kind shapes.

A hybrid model's layers of two kinds can hold the same weight at different shapes: Gemma 4's
full-attention layers have their own head size and key-value head count, and no value
projection where keys and values share one. The target model keeps one path for it
(``decoder/layers/self_attention/query/kernel``), which its layout puts in a different
place for each kind (``scanned_blocks/local_layers/...``, ``scanned_blocks/global_layer/...``,
or ``layers_5/...`` unscanned). A table says so with one leaf per kind on that path, each in
the layer group of its kind and with that kind's sizes in its operations:

.. code-block:: yaml

    layer_groups:
      local: {count: num_hidden_layers - num_hidden_layers // 6, hf_index: i + i // 5, unscanned: hf_index}
      global: {count: num_hidden_layers // 6, hf_index: 6 * i + 5, unscanned: hf_index}
    leaves:
      - maxtext: decoder/layers/self_attention/query/kernel
        hf: model.layers.{local}.self_attn.q_proj.weight
        ops: [transpose, {split_axis: {axis: 1, sizes: [num_attention_heads, head_dim]}}]
      - maxtext: decoder/layers/self_attention/query/kernel
        hf: model.layers.{global}.self_attn.q_proj.weight
        ops: [transpose, {split_axis: {axis: 1, sizes: [num_attention_heads, global_head_dim]}}]

Two leaves may share a path only when both are per-layer and in different groups; the layers
they hold are checked together (`shared_groups`), so neither group's layers count as the
other's extra ones. Two leaves whose conditions exclude each other (``when: X`` and
``when: not X``) may share a path too: a config makes only one of them (Gemma 4's tower holds
``std_scale`` as stored with ``standardize``, made of ones without it).

Example:
    >>> shared_path_problem({"local"}, "global"), shared_path_problem({"local"}, "local") is None
    (None, False)
    >>> exclusive_conditions("standardize", "not standardize")
    True
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import Any

from .._errors import RecipeError


def shared_path_problem(groups: set[str | None], group: str | None) -> str | None:
    """Why a leaf of `group` (None: not per-layer) may not take a path that leaves of
    `groups` already write, or None when it may."""
    if group is None or None in groups:
        return "one would overwrite the other"
    if group in groups:
        return (
            f"one would overwrite the other (both in layer group {group!r}; leaves of "
            f"different layer groups may share a path, one per layer kind)"
        )
    return None


def exclusive_conditions(first: Any, second: Any) -> bool:
    """Whether two leaves' ``when`` conditions are one the negation of the other (``X`` and
    ``not X``, or ``not (X)``), so that no config makes both. They are compared as Python
    parses them, so spacing, brackets and precedence count as they do when evaluated
    (``not a or b`` is ``(not a) or b``, no negation of ``a or b``)."""
    first_tree, second_tree = _parsed(first), _parsed(second)
    if first_tree is None or second_tree is None:
        return False
    return _negated(first_tree) == ast.dump(second_tree) or _negated(second_tree) == ast.dump(
        first_tree
    )


def _parsed(condition: Any) -> ast.expr | None:
    if not isinstance(condition, str):
        return None
    try:
        return ast.parse(condition.strip(), mode="eval").body
    except SyntaxError:  # the table's check of its expressions says what is wrong
        return None


def _negated(tree: ast.expr) -> str | None:
    """What `tree` negates (its dump), when it is ``not X``; else None."""
    if isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.Not):
        return ast.dump(tree.operand)
    return None


def shared_groups(leaves: Iterable[Any]) -> dict[str, set[str]]:
    """Target path -> the layer groups of the per-layer leaves that write it."""
    out: dict[str, set[str]] = {}
    for leaf in leaves:
        if leaf.group is not None:
            out.setdefault(leaf.maxtext, set()).add(leaf.group)
    return out


def check_one_writer(recipe: str, path: str, taken: bool) -> None:
    """Refuses a second leaf writing target `path` (`taken`): layer groups sharing a path must
    land in different places, which a layout without blocks or periods (or an unscanned one
    numbering layers by group) does not give them."""
    if taken:
        raise RecipeError(
            f"Recipe {recipe!r} writes {path!r} from two leaves: their layer groups share the "
            f"path and this layout puts both in the same place. Give the groups their own places "
            f"(layer_blocks or a layer_period; unscanned: hf_index), or their own paths."
        )
