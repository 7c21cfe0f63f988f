"""The layers a config names, checked against those a checkpoint holds, both ways.

Before planning, every per-layer tensor of the Hugging Face checkpoint (`check_hf_layers`) or
leaf of the target tree (`check_maxtext_layers`) is compared with the layers the config
gives: a count past the layers present fails before any layer is listed (a config naming
10**9 layers is an error at once, not a loop over them), and a layer missing or one that
would be lost is named. `check_none_left_out` refuses a ``when:`` that would drop a leaf the
target tree holds.

Example:
    >>> sorted(_indices("model.layers.{}.mlp.w", ["model.layers.0.mlp.w", "model.layers.3.mlp.w"]))
    [0, 3]
    >>> _ranges({0, 1, 2, 3, 5}), unscanned("decoder/layers/mlp/wo/kernel", 3)
    ('0-3, 5', 'decoder/layers_3/mlp/wo/kernel')
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from .._errors import ConfigMismatchError, did_you_mean
from .._lazy.array import LazyArray, as_lazy
from ._config_check import fields_shown as _fields_shown
from ._config_check import shown as _shown
from ._expr import names_in
from ._layout import grid_fits
from ._leaf import Leaf
from ._shared_targets import shared_groups
from ._table_errors import no_tensor_matches


def check_hf_layers(
    recipe: Any, hf: dict[str, Any], names: dict[str, Any], layout: str | None = None
) -> None:
    """The layers the config names against those the HF checkpoint holds, before planning.

    A count past the layers present fails before any index is listed, so a config naming
    10**9 layers is an error at once, not a loop over them. An expert leaf is looked for
    by its first expert, in the expert layout the checkpoint has (`layout`).
    """
    counts = recipe.layer_counts(names)
    templates: dict[str, set[str]] = {}  # tensor name with {} for the layer -> its groups
    for leaf in recipe._active(names):
        if leaf.group is None or leaf.made is not None:
            continue
        if leaf.stacked:
            sources = [name.replace(f"{{{leaf.group}}}", "{}") for name in leaf.stacked]
        else:
            expert = 0 if leaf.experts and leaf.fused_in(layout) is None else None
            sources = [leaf.hf_name(layout, "{}", expert)]
        for name in sources:
            templates.setdefault(name, set()).add(leaf.group)
            if recipe.table_file and not _indices(name, hf):  # a typo in the table's hf:
                raise no_tensor_matches(recipe.name, recipe.table_file, leaf.maxtext, leaf.hf, hf)
    for template, groups in templates.items():
        _compare_layers(
            recipe,
            groups,
            names,
            sum(counts[group] for group in groups),
            template,
            _indices(template, hf),
            lambda groups=groups: {
                index for group in groups for index in recipe._layer_indices(group, names)
            },
        )


def _compare_layers(
    recipe: Any,
    groups: set[str],
    names: dict[str, Any],
    wanted: int,
    template: str,
    found: set[int],
    expected: Callable[[], set[int]],
) -> None:
    """Refuses a config whose layers are not those found; `expected` runs only once
    `wanted` is known to be no more than the layers found, so it lists few."""
    held = _layers_held(template, found)
    if wanted > len(found):
        problem = f"{_layers(wanted)}, and the checkpoint holds {held}"
    else:
        numbers = expected()
        missing, extra = sorted(numbers - found), sorted(found - numbers)
        if not missing and not extra:
            return
        problem = (
            f"{_layers(wanted)} ({_ranges(numbers) or 'none'}), and the checkpoint holds "
            f"{held}: "
            + (f"layer {missing[0]} is missing" if missing else f"layer {extra[0]} would be lost")
        )
    raise ConfigMismatchError(
        f"{_count_fields(recipe, groups, names)}: {problem}. Pass the config.json of these "
        f"weights (--config)."
    )


def _count_fields(recipe: Any, groups: set[str], names: dict[str, Any]) -> str:
    """``config.json field 'num_hidden_layers' is 1000000000``: what sets a layer count."""
    fields = sorted(set().union(*(names_in(recipe.groups[g].count) for g in groups)))
    shown = ", ".join(f"{field!r} is {_shown(names.get(field))}" for field in fields)
    return f"Recipe {recipe.name!r}: config.json field {shown}"


def check_maxtext_layers(recipe: Any, flat: dict[str, Any], prefix: str, names: dict) -> None:
    """The layers the config names against those the target tree holds, before planning.

    As for the HF side, a count past the layers present fails before any is listed.
    """
    counts = recipe.layer_counts(names)
    sharing = shared_groups(recipe._active(names))  # one path, a leaf per layer kind
    for leaf in recipe._active(names):  # Tunix's paths name their group: layers/{global}/...
        if leaf.group is not None and not recipe.scanned:
            template = prefix + unscanned(leaf.maxtext, "{}")
            sharing.setdefault(template, set()).add(leaf.group)
    compared: set[str] = set()
    for leaf in recipe._active(names):
        if leaf.group is None:
            continue
        group, wanted = leaf.group, counts[leaf.group]
        if not recipe.scanned:
            template = prefix + unscanned(leaf.maxtext, "{}")
            if template in compared:
                continue
            compared.add(template)
            groups = sharing[leaf.maxtext] | sharing[template]
            _compare_layers(
                recipe,
                groups,
                names,
                sum(counts[g] for g in groups),
                template,
                _indices(template, flat),
                lambda groups=groups: {
                    index if recipe.groups[g].unscanned_by_hf else i
                    for g in groups
                    for i, index in enumerate(recipe._layer_indices(g, names))
                },
            )
            continue
        if recipe.layout is None:
            check_stack(recipe, leaf, flat, prefix + leaf.maxtext, (wanted,), wanted, names)
            continue
        held = recipe.layout.held(leaf.maxtext, flat, prefix, leaf.layer_axis, names)
        if wanted > held:
            raise ConfigMismatchError(
                f"{_count_fields(recipe, {group}, names)}: {_layers(wanted)}, and "
                f"{recipe._label} leaf {leaf.maxtext!r} holds {held} in the places of its "
                f"{recipe.layout.describe()} and its remainder. Pass the config.json of this "
                f"model (--config)."
            )
        for slot in recipe._slots(leaf, names):
            if slot.grid:
                check_stack(recipe, leaf, flat, prefix + slot.path, slot.grid, wanted, names)
            else:
                take(flat, prefix + slot.path, recipe._label)


def check_none_left_out(recipe: Any, flat: dict[str, Any], prefix: str, names: dict) -> None:
    """Refuses a config whose ``when:`` leaves out a leaf the target tree holds (a tied
    output layer, by tie_word_embeddings true): converting would drop it silently."""
    active = recipe._active(names)
    taken = {path for leaf in active for path in _paths(recipe, leaf, names)}
    for leaf in recipe.leaves:
        if leaf in active:
            continue
        held = [p for p in _paths(recipe, leaf, names) if p not in taken and prefix + p in flat]
        if held:
            raise ConfigMismatchError(
                f"{recipe._label} leaf {held[0]!r} is in the checkpoint, and recipe "
                f"{recipe.name!r} leaves it out with this config (when: {leaf.when}; "
                f"{_fields_shown(leaf.when, names)}): converting would lose it. Pass the "
                f"config.json it was converted from (--config)."
            )


def _paths(recipe: Any, leaf: Leaf, names: dict[str, Any]) -> list[str]:
    if leaf.group is None:
        return [leaf.maxtext]
    return [slot.path for slot in recipe._slots(leaf, names)]


def check_stack(
    recipe: Any, leaf: Leaf, flat: dict, path: str, grid: tuple[int, ...], wanted: int, names: dict
) -> None:
    """The layer axes of the stacked leaf at `path` hold `grid` (of the group's `wanted`):
    (layers,) on the layer axis, or (blocks, positions) from it on."""
    stacked = take(flat, path, recipe._label)
    axis = leaf.layer_axis
    if not grid_fits(stacked, grid, axis):
        layers = math.prod(grid)
        end = axis + len(grid)
        held = (
            "no"
            if stacked.ndim < end
            else " x ".join(map(str, stacked.shape[axis:end]))
            if len(grid) > 1
            else stacked.shape[axis]
        )
        shown = f"{' x '.join(map(str, grid))} = {layers}" if len(grid) > 1 else layers
        part = f", {shown} of them in {path!r}" if layers != wanted or len(grid) > 1 else ""
        where = f"axis {axis}" if len(grid) == 1 else f"axes {axis}-{end - 1}"
        raise ConfigMismatchError(
            f"{_count_fields(recipe, {leaf.group}, names)}: {_layers(wanted)}{part}, and "  # type: ignore[arg-type]
            f"{recipe._label} leaf {path.removeprefix(recipe._root)!r} holds {held} (shape "
            f"{stacked.shape}, layers on {where}). Pass the config.json of this model "
            f"(--config)."
        )


def unscanned(maxtext_path: str, index: int | str) -> str:
    """``decoder/layers/x`` -> ``decoder/layers_3/x`` (and ``moe_layers`` -> ``moe_layers_3``);
    a Tunix path names its layer (``layers/{layer}/x`` -> ``layers/3/x``)."""
    if "{" in maxtext_path:
        return re.sub(r"\{\w+\}", str(index), maxtext_path, count=1)
    return re.sub(r"^decoder/(\w*layers)/", rf"decoder/\g<1>_{index}/", maxtext_path, count=1)


def take(flat: dict[str, Any], path: str, label: str = "MaxText") -> LazyArray:
    if path not in flat:
        raise ConfigMismatchError(
            f"The {label} checkpoint has no leaf {path!r}.{did_you_mean(path, flat)} Is it a "
            f"checkpoint of this family{' and layout (scanned or not)' if label == 'MaxText' else ''}?"
        )
    return as_lazy(flat[path], path=path)


_INDEX = re.compile(r"0|[1-9][0-9]*")


def _indices(template: str, names: Any) -> set[int]:
    """The layer numbers of the names that fit `template` (a name with ``{}`` for the number)."""
    before, after = template.split("{}", 1)
    found = set()
    for name in names:
        if name.startswith(before) and name.endswith(after) and len(name) > len(template) - 2:
            number = name[len(before) : len(name) - len(after)]
            if _INDEX.fullmatch(number):
                found.add(int(number))
    return found


def _layers_held(template: str, found: set[int]) -> str:
    """``2 ('model.layers.N.mlp.down_proj.weight' for N = 0-1)``, for messages."""
    if not found:
        return f"none ({template.replace('{}', 'N')!r} for no layer N)"
    return f"{len(found)} ({template.replace('{}', 'N')!r} for N = {_ranges(found)})"


def _ranges(numbers: set[int]) -> str:
    """``0-3, 5`` for {0, 1, 2, 3, 5}; long lists are cut."""
    runs: list[list[int]] = []
    for number in sorted(numbers):
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    shown = [f"{a}-{b}" if b > a else str(a) for a, b in runs[:8]]
    return ", ".join(shown) + (" ..." if len(runs) > 8 else "")


def _layers(count: int) -> str:
    return f"{count} layer{'' if count == 1 else 's'}"
