"""`suture.transform` and `suture.load_and_transform`: the result tree of a surgery, lazily.

A surgery is a `transform` applied to one or more sources:

- a list of rules (`suture.rules`), for one source;
- an Orbax-style transformations tree of `suture.Transform` (a dict, or a list, tuple,
  NamedTuple or registered dataclass of them), for one source, with `target`
  as the new tree's structure;
- a plain function ``fn(*trees) -> tree``, one lazy tree per source (merging models);
- None: the source as it is.

The result may hold LazyArrays, arrays, values, and ``jax.ShapeDtypeStruct`` leaves meaning
"create this"; `init` creates those and any `target` leaf the result lacks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._errors import ArgumentError, ShapeMismatchError, SurgeryError, raise_problems
from .._jaxtypes import is_shape_dtype_struct
from .._lazy.array import LazyArray
from .._lazy.graph import SourceNode
from .._lazy.trace import call_function, recording
from .._lazy.views import strict_casts as checked_casts
from .._paths import flatten, map_leaves_with_path
from ..sources.checkpoint import Checkpoint
from ..sources.detect import open_source
from .init import covers, initialize
from .orbax_transforms import apply_transformations, is_transformations_tree
from .rules import Rule, apply_rules
from .targets import LeafTarget, classify, placeholders_as_stored, unfilled_as_placeholders


@dataclass
class Built:
    """What `build` made: the result tree and what a plan reports about it."""

    tree: Any
    sources: list[Checkpoint]
    initialized: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)  # how each user function had to run
    eager_reads: dict[int, tuple[SourceNode, int]] = field(default_factory=dict)
    unmatched: list[str] = field(default_factory=list)  # result paths the target lacks


def build(
    transform: Any,
    sources: Sequence[Any],
    target: Any = None,
    init: Any = None,
    partial: bool = False,
    seed: Any = 0,
    strict_casts: bool = False,
) -> Built:
    """The lazy result of a surgery, with every problem found (see `transform`)."""
    with checked_casts(strict_casts):
        return _build(transform, sources, target, init, partial, seed)


def _build(
    transform: Any, sources: Sequence[Any], target: Any, init: Any, partial: bool, seed: Any
) -> Built:
    if is_transformations_tree(transform) and target is not None:
        target = placeholders_as_stored(target)  # Orbax's new_tree: `...` is "any value"
    _check_argument_order(transform, sources)
    checkpoints = [open_source(source) for source in sources]
    built = Built(tree=None, sources=checkpoints)
    trees = [ckpt.tree for ckpt in checkpoints]
    try:
        with recording() as record:  # what user functions read or could not keep lazy
            result = _apply(transform, trees, target, built)
    except SurgeryError as error:
        built.problems.append(str(error))
        return built
    finally:
        built.notes.extend(record.notes)
        built.fallbacks.extend(record.fallbacks)
        built.eager_reads.update(record.eager_reads)
    if target is not None:
        result = _shaped_by_target(result, target, partial, built)
    built.tree = _initialized(result, init, built, seed)
    return built


def _check_argument_order(transform: Any, sources: Sequence[Any]) -> None:
    """A checkpoint passed where the transform goes (Orbax's order) gets a clear hint."""
    if not isinstance(transform, (str, os.PathLike, Checkpoint)):
        return
    shown = repr(str(transform)) if not isinstance(transform, Checkpoint) else "ckpt"
    swapped = any(callable(source) or isinstance(source, (list, tuple, Rule)) for source in sources)
    raise ArgumentError(
        f"Got the checkpoint {shown} where the transform goes: the transform comes first, "
        f"then the sources, e.g. suture.load_and_transform(transform, {shown})"
        + (" (the arguments look swapped)." if swapped else ".")
        + " Pass transform=None to take a checkpoint as it is."
    )


def _apply(transform: Any, trees: list[Any], target: Any, built: Built) -> Any:
    if transform is None:
        return _only_tree(trees, "transform=None")
    if isinstance(transform, Rule):
        transform = [transform]
    if is_transformations_tree(transform):
        if target is None:
            raise ArgumentError(
                "An Orbax-style transformations tree needs target= as the result's structure "
                "(Orbax's new_tree). Pass target=, or use rules or a function instead."
            )
        original = _only_tree(trees, "A transformations tree")
        return unfilled_as_placeholders(apply_transformations(original, transform, target))
    if isinstance(transform, (list, tuple)):
        return apply_rules(transform, _only_tree(trees, "A rule list"), built.problems)
    if callable(transform):
        return _call_function(transform, trees, built)
    raise ArgumentError(
        f"transform must be a list of rules, a transformations dict, a function or None; "
        f"got {type(transform).__name__}."
    )


def _only_tree(trees: list[Any], what: str) -> Any:
    if len(trees) != 1:
        raise ArgumentError(
            f"{what} applies to one source, but {len(trees)} were given. To combine several "
            f"checkpoints, pass a function fn(*trees) -> tree."
        )
    return trees[0]


def _call_function(fn: Callable[..., Any], trees: list[Any], built: Built) -> Any:
    return call_function(fn, *trees)


def _shaped_by_target(result: Any, target: Any, partial: bool, built: Built) -> Any:
    flat_result = flatten(result)
    flat_target = flatten(target)
    extra = [path for path in flat_result if path not in flat_target]
    built.unmatched = extra
    if extra and not partial:
        shown = ", ".join(repr(path) for path in extra[:5])
        built.problems.append(
            f"The result has {len(extra)} leaf path(s) that the target leaves out: {shown}"
            f"{' ...' if len(extra) > 5 else ''}. Pass partial=True to drop them, or add them "
            f"to the target."
        )

    def fitted(path: str, target_leaf: Any) -> Any:
        wanted = classify(target_leaf)
        if wanted.kind == "skip":
            return target_leaf
        if path not in flat_result:
            return _Create(wanted, target_leaf)
        value = flat_result[path]
        if (
            isinstance(value, LazyArray)
            and wanted.shape is not None
            and wanted.shape != value.shape
        ):
            built.problems.append(
                str(
                    ShapeMismatchError(
                        f"Leaf {path!r}: the target wants shape {wanted.shape}, the result has "
                        f"{value.shape}. Reshape it with a rule, or fix the target."
                    )
                )
            )
        elif isinstance(value, LazyArray) and wanted.dtype is not None:
            value = value.astype(wanted.dtype)
        return value

    return map_leaves_with_path(fitted, target)


class _Create:
    """A leaf to be created by init (a target leaf that the result lacks)."""

    def __init__(self, wanted: LeafTarget, target_leaf: Any) -> None:
        self.wanted, self.target_leaf = wanted, target_leaf


def _initialized(result: Any, init: Any, built: Built, seed: Any) -> Any:
    flat = flatten(result)
    missing: dict[str, LeafTarget] = {}
    for path, leaf in flat.items():
        if isinstance(leaf, _Create):
            missing[path] = leaf.wanted
        elif is_shape_dtype_struct(leaf):
            missing[path] = classify(leaf)
        elif _is_constant(leaf) and covers(init, path):  # np.empty(...) that init names
            missing[path] = LeafTarget("numpy", tuple(leaf.shape), np.dtype(leaf.dtype))
    if not missing:
        return result
    unmatched = built.unmatched or [path for path in flat if path not in missing]
    try:
        values = initialize(init, missing, unmatched, seed)
    except SurgeryError as error:
        built.problems.append(str(error))
        return result
    built.initialized.extend(missing)
    return map_leaves_with_path(lambda path, leaf: values.get(path, leaf), result)


def _is_constant(leaf: Any) -> bool:
    """An array in a result that no source gives (``np.empty(...)`` returned by a function)."""
    return (
        not isinstance(leaf, LazyArray)
        and hasattr(leaf, "shape")
        and hasattr(leaf, "dtype")
        and not is_shape_dtype_struct(leaf)
    )


def _checked_tree(
    transform: Any,
    sources: Sequence[Any],
    target: Any,
    init: Any,
    partial: bool,
    seed: Any,
    strict_casts: bool = False,
) -> Any:
    """The built tree, or a SurgeryError that lists every problem."""
    built = build(transform, sources, target, init, partial, seed, strict_casts)
    raise_problems(built.problems)
    return built.tree


def transform(
    transform: Any,
    *sources: Any,
    target: Any = None,
    init: Any = None,
    partial: bool = False,
    seed: Any = 0,
    strict_casts: bool = False,
) -> Any:
    """The result of a surgery as a lazy tree; reads no array data.

    Args:
        transform: a list of `suture.rules`, an Orbax-style tree of `suture.Transform`, a
            function ``fn(*trees) -> tree`` (one lazy tree per source), or None.
        *sources: checkpoint paths, opened checkpoints, or in-memory trees.
        target: optional tree giving the result's structure, dtypes and shapes (as in
            `suture.load`); leaves it has and the result lacks are created by `init`.
        init: creates leaves that no source provides (see `suture.load`), and replaces
            constants the function returns (``np.empty(...)``) at the paths it names.
            Entries may be values, ``fn(shape, dtype)``, JAX/Flax initializers
            ``fn(key, shape, dtype)``, or a no-argument function building the whole tree.
        partial: drop result leaves that `target` leaves out, instead of failing.
        seed: an int or a jax PRNG key for initializers that take a key; each leaf gets
            ``fold_in(seed, hash(path))``, so values do not depend on order.
        strict_casts: the casts the surgery makes that can destroy values (those
            `suture.plan` lists as lossy: float32 -> int8, float32 -> float16 ...) check
            every value as it is read; one that does not fit is a `LossyCastError`, and a
            save stops without leaving an output. Precision-only casts (float32 ->
            bfloat16) are not checked.

    Returns:
        A tree of LazyArrays and values: load it with `suture.load`, or stream it to disk.

    Raises:
        SurgeryError: listing every problem found (unmatched rules, duplicate outputs,
            missing leaves, shape mismatches).

    Example:
        >>> import numpy as np, suture
        >>> from suture import rules
        >>> source = {"layer0": {"w": np.ones(2)}, "layer1": {"w": np.zeros(2)}}
        >>> lazy = suture.transform([rules.stack(r"layer(\\d+)", into="layers")], source)
        >>> lazy["layers"]["w"]
        LazyArray(path=None, shape=(2, 2), dtype=float64)
    """
    return _checked_tree(transform, sources, target, init, partial, seed, strict_casts)
