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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._errors import SurgeryError, did_you_mean
from ._lazy import ImplicitReadError, LazyArray, call_lazily, no_implicit_reads
from ._paths import flatten, map_leaves_with_path
from ._patterns import PatternError, compile_pattern
from ._patterns import fullmatch as bounded_fullmatch


class TransformError(SurgeryError, ValueError):
    """A transformation that cannot be applied (Orbax raises ValueError in these cases)."""


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
        transformations: a tree (or flat dict) of `Transform`, keyed by full-match regexes.
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
    if new_tree is None or _is_empty_container(new_tree):
        return {}
    original = flatten(original_tree)
    transforms = _flatten_in_jax_order(transformations)
    new = flatten(new_tree)
    compiled = [(_compile(key), transform) for key, transform in transforms.items()]
    result = dict(new)
    for key, new_value in new.items():
        if new_value is None or _is_empty_container(new_value):
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


def _flatten_in_jax_order(transformations: Any, prefix: str = "") -> dict[str, Transform]:
    """The transformations by '/'-joined key, dict keys sorted level by level as jax does.

    Orbax iterates the transformations in this order, so when several match one key, the
    last one in this order wins.
    """
    if not isinstance(transformations, dict):
        return {prefix: as_transform(prefix, transformations)}
    flat: dict[str, Transform] = {}
    for key in sorted(transformations):
        path = f"{prefix}/{key}" if prefix else str(key)
        flat.update(_flatten_in_jax_order(transformations[key], path))
    return flat


def is_transform(value: Any) -> bool:
    """A suture.Transform, or Orbax's own Transform / RestoreTransform."""
    return isinstance(value, Transform) or (
        type(value).__name__ in ("Transform", "RestoreTransform") and hasattr(value, "use_fallback")
    )


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


def _is_empty_container(value: Any) -> bool:
    return isinstance(value, (dict, list, tuple)) and len(value) == 0


def _compile(key: str) -> re.Pattern[str]:
    try:
        return compile_pattern(key, f"Transformation key {key!r}")
    except PatternError as error:
        raise TransformError(str(error)) from error


def _call_value_fn(fn: Callable[[Any], Any], value: Any) -> Any:
    return call_lazily(fn, value) if isinstance(value, LazyArray) else fn(value)


def _call_multi_value_fn(fn: Callable[[str, Any], Any], key: str, original_tree: Any) -> Any:
    try:
        with no_implicit_reads():
            return fn(key, original_tree)
    except ImplicitReadError:
        return fn(key, original_tree)  # needs concrete values: read just what it touches
