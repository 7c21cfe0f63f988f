"""A recipe's way back: the Hugging Face tensors of a target tree, lazily.

Each leaf's layers are taken from their places (`_layout`'s slots), checked against the
config's counts, unstacked, and run through the leaf's operations backwards; experts are
split one per tensor or joined into transformers' fused tensors; a source several leaves
share is written once (`_shared_sources`). ``like`` (the original HF tree) gives back rows
a ``fit_rows`` cut.

Example:
    >>> _unwrapped("layers/0/attn/q_proj/w/value")
    'layers/0/attn/q_proj/w'
"""

from __future__ import annotations

from typing import Any

from .._errors import ConfigMismatchError
from .._lazy.array import LazyArray, as_lazy
from .._lazy.combine import concatenate
from .._lazy.combine import stack as stack_arrays
from .._paths import flatten
from ._collections import gathered
from ._config_check import fields_shown as _fields_shown
from ._expert_layout import check_experts
from ._experts import (
    EXPERT_LAYOUTS,
    FUSED,
    PER_EXPERT,
    FusedSource,
    check_count,
    member,
    stacked_axes,
)
from ._layer_checks import check_maxtext_layers, check_none_left_out, check_stack, take
from ._layout import grid_members
from ._leaf import Leaf
from ._ops import FitRows, RecipeFormatError
from ._shared_sources import GivenBack


def hf_tensors(
    recipe: Any, tree: Any, config: dict[str, Any], layout: str | None
) -> dict[str, Any]:
    """``{tensor name: LazyArray}`` of `recipe`'s target `tree`, experts in `layout`."""
    names = recipe.config_names(config)
    if layout is not None and layout not in EXPERT_LAYOUTS:
        raise ConfigMismatchError(
            f"Expert layout {layout!r} is not one of {', '.join(EXPERT_LAYOUTS)}."
        )
    layout = layout or PER_EXPERT
    flat = flatten(tree)
    if recipe.target != "maxtext":  # nnx.state saved with Orbax spells each leaf .../value
        flat = {_unwrapped(path): leaf for path, leaf in flat.items()}
    collections = {leaf.collection for leaf in recipe.leaves if leaf.collection}
    if collections and recipe.target == "maxtext":
        flat = gathered(flat, collections)
    root = recipe._root
    prefix = root if root and any(p.startswith(root) for p in flat) else ""
    check_maxtext_layers(recipe, flat, prefix, names)
    check_none_left_out(recipe, flat, prefix, names)
    out = GivenBack(recipe.name, recipe._label)  # a source shared by leaves is given back once
    parts: dict[str, GivenBack] = {}  # fused tensor -> its parts, joined below
    fused_of: dict[str, FusedSource] = {}
    for leaf in recipe._active(names):
        if leaf.made is not None:  # nothing to write it to: checked, then dropped
            if leaf.group is None:
                taken = take(flat, prefix + leaf.maxtext, recipe._label)
                leaf.made.check(taken, leaf.maxtext, names, recipe.name)
                continue
            for path, _, layer in _layers_back(recipe, leaf, flat, prefix, names):
                leaf.made.check(layer, path, names, recipe.name)
            continue
        if leaf.group is None:
            taken = take(flat, prefix + leaf.maxtext, recipe._label)
            if leaf.routed:
                check_experts(recipe, leaf, taken, names, f"{recipe._label} leaf {leaf.maxtext!r}")
            out.give_all(_unstacked(recipe, leaf, None, taken, names), leaf.maxtext)
            continue
        for path, index, layer in _layers_back(recipe, leaf, flat, prefix, names):
            if leaf.stacked:
                out.give_all(_unstacked(recipe, leaf, index, layer, names), path)
                continue
            if leaf.routed:
                check_experts(recipe, leaf, layer, names, f"{recipe._label} leaf {path!r}")
            if not leaf.experts:
                tensor = _restored(recipe, leaf, layer, names)
                fused = leaf.fused_in(layout)
                if fused is not None:
                    name = leaf.hf_name(FUSED, index)
                    _part_of(recipe, parts, name).give(fused.part, tensor, path)
                    fused_of[name] = fused
                else:
                    out.give(leaf.hf_name(PER_EXPERT, index), tensor, path)
                continue
            axis, _ = stacked_axes(leaf.expert_axis, leaf.layer_axis)
            count = recipe.expert_count(names)
            check_experts(recipe, leaf, layer, names, f"{recipe._label} leaf {path!r}")
            experts = [
                _restored(recipe, leaf, member(layer, {axis: e}), names) for e in range(count)
            ]
            if layout == FUSED and leaf.fused is not None:
                name = leaf.hf_name(FUSED, index)
                stacked = stack_arrays(experts, axis=0)
                _part_of(recipe, parts, name).give(leaf.fused.part, stacked, path)
                fused_of[name] = leaf.fused
            else:
                for e, tensor in enumerate(experts):
                    out.give(leaf.hf_name(PER_EXPERT, index, e), tensor, path)
    for name, pieces in parts.items():
        fused = fused_of[name]
        if sorted(pieces) != list(range(fused.parts)):
            raise RecipeFormatError(
                f"Recipe {recipe.name!r} fills parts {sorted(pieces)} of fused tensor "
                f"{name!r}, which has {fused.parts}."
            )
        joined = fused.join([pieces[k] for k in range(fused.parts)])
        out.give(name, joined, " + ".join(pieces.sharers(k)[0] for k in range(fused.parts)))
    return dict(out)


def _part_of(recipe: Any, parts: dict[str, GivenBack], name: str) -> GivenBack:
    what = f"part {{}} of fused Hugging Face tensor {name!r}"
    return parts.setdefault(name, GivenBack(recipe.name, recipe._label, what))


def _layers_back(
    recipe: Any, leaf: Leaf, flat: dict, prefix: str, names: dict
) -> list[tuple[str, int, LazyArray]]:
    """(target path, HF layer, that layer's array) of every layer of a per-layer leaf."""
    out = []
    for slot in recipe._slots(leaf, names):
        array = take(flat, prefix + slot.path, recipe._label)
        if len(slot.grid) == 1:
            said = f"config.json gives {_fields_shown(recipe.groups[leaf.group].count, names)}"  # type: ignore[index]
            named = f"{recipe._label} leaf {slot.path!r}"
            check_count(array, leaf.layer_axis, slot.grid[0], "layers", named, said)
        elif slot.grid:
            check_stack(recipe, leaf, flat, prefix + slot.path, slot.grid, len(slot.indices), names)
        members = grid_members(array, slot.grid, leaf.layer_axis) if slot.grid else [array]
        out += [
            (slot.path, index, layer) for index, layer in zip(slot.indices, members, strict=True)
        ]
    return out


def _unstacked(recipe: Any, leaf: Leaf, index: int | None, array: Any, names: dict) -> list:
    """(HF name, tensor) of one target leaf (of layer `index`), its stack taken apart."""
    sources = leaf.sources(index)
    if leaf.interleave is not None:
        restored = _restored(recipe, leaf, array, names)
        return list(zip(sources, leaf.interleave.split(restored, names, sources), strict=True))
    if not leaf.stacked:
        return [(sources[0], _restored(recipe, leaf, array, names))]
    if array.ndim < 1 or array.shape[0] != len(sources):
        raise ConfigMismatchError(
            f"{recipe._label} leaf {leaf.maxtext!r} stacks {len(sources)} tensors "
            f"({', '.join(sources)}) on its first axis; found shape {array.shape}."
        )
    return [(name, _restored(recipe, leaf, array[j], names)) for j, name in enumerate(sources)]


def _restored(recipe: Any, leaf: Leaf, array: LazyArray, names: dict) -> LazyArray:
    for operation in reversed(leaf.operations):
        array = operation.backward(array, names)
    return array


def restore_cut_rows(
    recipe: Any, original: dict[str, Any], out: dict[str, Any], names: dict, prefix: str | None
) -> None:
    """Rows a ``fit_rows`` cut, taken back from the `original` HF tensors."""
    for leaf in recipe._active(names):
        cuts = [op.cut(names) for op in leaf.operations if isinstance(op, FitRows)]
        language_model = recipe.language_model
        name = language_model.hf_name(leaf.hf, prefix) if prefix and language_model else leaf.hf
        if leaf.group is not None or not cuts or name not in original or name not in out:
            continue
        kept, rows = cuts[0]
        source = as_lazy(original[name], path=name)
        if kept < rows and source.shape == out[name].shape:
            restored = concatenate([out[name][:kept], source[kept:].astype(out[name].dtype)])
            out[name] = restored


def _unwrapped(path: str) -> str:
    """``layers/0/attn/q_proj/w`` of ``.../w/value`` (an ``nnx.Variable`` saved by Orbax)."""
    return path.removesuffix("/value")
