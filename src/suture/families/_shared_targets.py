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
    ``not X``, or ``not (X)``), so that no config makes both."""
    if not isinstance(first, str) or not isinstance(second, str):
        return False
    return _negated(first) == _plain(second) or _negated(second) == _plain(first)


def _plain(condition: str) -> str:
    text = " ".join(condition.split())
    while text.startswith("(") and text.endswith(")") and _balanced(text[1:-1]):
        text = text[1:-1].strip()
    return text


def _negated(condition: str) -> str | None:
    """What `condition` negates, when it is ``not X``; else None. ``not a or b`` negates ``a``
    alone (``not`` binds tighter than ``and``, ``or``, ``if``), so its X is a single term or
    a parenthesized whole."""
    text = _plain(condition)
    if not text.startswith(("not ", "not(")):
        return None
    rest = text[3:].strip()
    if rest.startswith("(") and rest.endswith(")") and _balanced(rest[1:-1]):
        return _plain(rest)
    return rest if _is_term(rest) else None


def _is_term(text: str) -> bool:
    return not any(f" {word} " in f" {text} " for word in ("and", "or", "if", "else"))


def _balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


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
