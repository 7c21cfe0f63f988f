"""Orbax's transformations API, also on lazy trees: `Transform` and `apply_transformations`.

The semantics are those of ``orbax.checkpoint.apply_transformations``: keys of the new tree
are matched against the transformation keys as full-match regular expressions (nested
transformation dicts are '/'-joined keys); every matching transformation applies, in order;
``original_key`` may hold back-references (``\\1``, ``\\g<name>``); keys no transformation
matches come from the original tree when it has them (``default_to_original=True``) or stay
as in the new tree; keys only in the original are dropped. The result has the new tree's
structure.

On a lazy tree nothing is read: ``value_fn`` and ``multi_value_fn`` receive LazyArrays, and
their arithmetic, numpy ufuncs, indexing and ``astype`` stay lazy. A ``value_fn`` that needs
concrete arrays (``jnp.mean``) is traced with jax and becomes a lazy map; a
``multi_value_fn`` that needs them reads just the leaves it touches, when it is called.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._errors import MissingLeafError, did_you_mean
from .._errors import TransformError as TransformError
from .._lazy.array import LazyArray
from .._lazy.trace import call_function
from .._paths import flatten, jax_path, map_leaves_with_path, unflatten
from .._patterns import PatternError, compile_pattern
from .._patterns import fullmatch as bounded_fullmatch
from .targets import is_empty_container


@dataclass
class Transform:
    r"""How one key of the new tree is computed from the original tree.

    Attributes:
        original_key: the key in the original tree ('/' for nesting); may hold
            back-references to the new key's regex. Default: the new key itself.
        use_fallback: take the value from the fallback tree (the new tree when
            ``default_to_original=True``, else the original tree).
        value_fn: ``fn(value) -> value``, applied to the original value.
        multi_value_fn: ``fn(new_key, original_tree) -> value``.

    Raises:
        TransformError: when the attributes contradict each other (Orbax asserts).

    Example:
        >>> import suture
        >>> transforms = {r"layer_(\d+)": suture.Transform(original_key=r"dense\1")}
        >>> suture.apply_transformations({"dense0": 1, "dense1": 2}, transforms, {"layer_0": ..., "layer_1": ...})
        {'layer_0': 1, 'layer_1': 2}
    """

    original_key: str | None = None
    use_fallback: bool = False
    value_fn: Callable[[Any], Any] | None = None
    multi_value_fn: Callable[[str, Any], Any] | None = None

    def __post_init__(self) -> None:
        chosen = [
            name
            for name, given in (
                ("original_key", self.original_key is not None),
                ("use_fallback", self.use_fallback),
                ("multi_value_fn", self.multi_value_fn is not None),
            )
            if given
        ]
        if self.value_fn is not None and ("use_fallback" in chosen or "multi_value_fn" in chosen):
            chosen.append("value_fn")
        if len(chosen) > 1:
            raise TransformError(
                f"Transform got {' and '.join(chosen)}, which exclude each other. Use "
                f"original_key (with an optional value_fn), use_fallback, or multi_value_fn."
            )


def apply_transformations(
    original_tree: Any,
    transformations: Any,
    new_tree: Any,
    default_to_original: bool = True,
) -> Any:
    r"""Builds a tree with `new_tree`'s structure from `original_tree`, as Orbax does.

    Args:
        original_tree: the tree to take values from; in memory, or lazy (a
            ``suture.open(...).tree``), in which case nothing is read.
        transformations: a tree of `Transform` (dicts keyed by full-match regexes, or
            lists, tuples, NamedTuples, registered dataclasses), or a flat dict of them.
        new_tree: the result's structure; its leaf values are kept where neither the
            transformations nor the original tree provide one.
        default_to_original: for keys no transformation matches, take the original's value
            (True) or keep the new tree's (False).

    Returns:
        A tree with `new_tree`'s structure.

    Raises:
        TransformError: an ``original_key`` that the original tree lacks, or a
            ``use_fallback`` key missing from the original tree.

    Example:
        >>> import suture
        >>> original = {"dense_1": {"kernel": 2, "bias": 3}, "a": 1}
        >>> transforms = {r"([a-z]+)_([0-9])_([a-z]+)": suture.Transform(original_key=r"\1_\2/\3")}
        >>> suture.apply_transformations(original, transforms, {"dense_1_kernel": ..., "a": ...})
        {'dense_1_kernel': 2, 'a': 1}
    """
    if new_tree is None or is_empty_container(new_tree):
        return {}
    original = flatten(original_tree)
    transforms = _flatten_in_jax_order(transformations)
    new = flatten(new_tree)
    compiled = [(_compile(key), transform) for key, transform in transforms.items()]
    result = dict(new)
    for key, new_value in new.items():
        if new_value is None or is_empty_container(new_value):
            continue  # Orbax (through jax) does not see None or empty nodes of the new tree.
        found = False
        for pattern, transform in compiled:
            match = bounded_fullmatch(pattern, key)
            if not match:
                continue
            found = True
            if transform.use_fallback:
                if not default_to_original:
                    if key not in original:
                        raise TransformError(
                            f"Key {key!r} uses use_fallback, which takes it from the original "
                            f"tree (default_to_original=False), but the original tree has no "
                            f"such key.{did_you_mean(key, original)}"
                        )
                    result[key] = original[key]
                continue
            if transform.multi_value_fn is not None:
                result[key] = _call_multi_value_fn(transform.multi_value_fn, key, original_tree)
                continue
            source_key = (
                key if transform.original_key is None else match.expand(transform.original_key)
            )
            if source_key not in original:
                raise TransformError(
                    f"Transformation {pattern.pattern!r} maps new key {key!r} to original key "
                    f"{source_key!r}, which the original tree does not have."
                    f"{did_you_mean(source_key, original)}"
                )
            value = original[source_key]
            result[key] = (
                value if transform.value_fn is None else _call_value_fn(transform.value_fn, value)
            )
        if not found and key in original and default_to_original:
            result[key] = original[key]
    return map_leaves_with_path(lambda path, leaf: result.get(path, leaf), new_tree)


def _flatten_in_jax_order(transformations: Any) -> dict[str, Transform]:
    """The transformations by '/'-joined key, in the order jax flattens them.

    Any pytree of `Transform` works: dicts (keys sorted level by level, as jax does),
    lists, tuples, NamedTuples, registered dataclasses. Orbax iterates the transformations
    in this order, so when several match one key, the last one in this order wins.
    """
    import jax  # heavy: loaded on first use, not at import

    keyed, _ = jax.tree_util.tree_flatten_with_path(transformations, is_leaf=is_transform)
    flat = {jax_path(key_path): transform for key_path, transform in keyed}
    return {key: as_transform(key, transform) for key, transform in flat.items()}


def is_transform(value: Any) -> bool:
    """A suture.Transform, or Orbax's own Transform / RestoreTransform.

    Orbax's class is looked up only when Orbax is imported (a value cannot be one otherwise).
    """
    if isinstance(value, Transform):
        return True
    orbax_transform = getattr(
        sys.modules.get("orbax.checkpoint.transform_utils"), "Transform", None
    )
    return orbax_transform is not None and isinstance(value, orbax_transform)


def is_transformations_tree(value: Any) -> bool:
    """A dict (Orbax's usual form), or any other tree whose leaves are all Transforms."""
    if isinstance(value, dict):
        return True
    if callable(value) or value is None:
        return False
    leaves = list(flatten(value).values())
    return bool(leaves) and all(is_transform(leaf) for leaf in leaves)


def as_transform(key: str, value: Any) -> Transform:
    """`value` as a suture.Transform (Orbax's Transform objects are accepted as they are)."""
    if isinstance(value, Transform):
        return value
    if is_transform(value):
        return Transform(
            value.original_key, value.use_fallback, value.value_fn, value.multi_value_fn
        )
    raise TransformError(
        f"transformations[{key!r}] is a {type(value).__name__}, not a suture.Transform."
    )


def _compile(key: str) -> re.Pattern[str]:
    try:
        return compile_pattern(key, f"Transformation key {key!r}")
    except PatternError as error:
        raise TransformError(str(error)) from error


def _call_value_fn(fn: Callable[[Any], Any], value: Any) -> Any:
    return call_function(fn, value) if isinstance(value, LazyArray) else fn(value)


def _call_multi_value_fn(fn: Callable[[str, Any], Any], key: str, original_tree: Any) -> Any:
    return call_function(fn, key, original_tree)


def merge_trees(*trees: Any, target: Any = None) -> Any:
    """Merges trees leaf by leaf; where several have a path, the last one's leaf wins.

    Orbax's ``transform_utils.merge_trees``: trees may be lazy (nothing is read), ``None``
    leaves and empty containers are not leaves (as in jax).

    Args:
        *trees: the trees to merge.
        target: optional tree giving the result's structure (its containers and paths);
            without it the result is nested dicts (list positions become ``"0"``, ``"1"``
            keys, as in Orbax).

    Raises:
        MissingLeafError: `target` has a path no tree provides.

    Example:
        >>> import suture
        >>> suture.merge_trees({"a": 1, "b": {"c": 2}}, {"b": {"c": 3, "d": 4}})
        {'a': 1, 'b': {'c': 3, 'd': 4}}
    """
    merged: dict[str, Any] = {}
    for tree in trees:
        merged.update(_jax_leaves(tree))
    return _rebuild(merged, target)


def intersect_trees(*trees: Any, target: Any = None) -> Any:
    """The paths every tree has, with the last tree's leaves (Orbax's ``intersect_trees``).

    Raises:
        TransformError: no tree is given.
        MissingLeafError: `target` has a path not in the intersection.

    Example:
        >>> import suture
        >>> suture.intersect_trees({"a": 1, "b": 2}, {"b": 3, "c": 4})
        {'b': 3}
    """
    if not trees:
        raise TransformError("intersect_trees needs at least one tree; none was given.")
    flats = [_jax_leaves(tree) for tree in trees]
    common = set.intersection(*(set(flat) for flat in flats))
    return _rebuild({path: leaf for path, leaf in flats[-1].items() if path in common}, target)


def _jax_leaves(tree: Any) -> dict[str, Any]:
    """``{path: leaf}`` without the None leaves and empty containers jax does not count."""
    return {
        path: leaf
        for path, leaf in flatten(tree).items()
        if leaf is not None and not is_empty_container(leaf)
    }


def _rebuild(flat: dict[str, Any], target: Any) -> Any:
    if target is None:
        return unflatten(flat) if flat else {}

    def leaf_at(path: str, _: Any) -> Any:
        if path not in flat:
            raise MissingLeafError(
                f"The target has a leaf at {path!r}, which none of the trees provides."
                f"{did_you_mean(path, flat)}"
            )
        return flat[path]

    return map_leaves_with_path(leaf_at, target)
