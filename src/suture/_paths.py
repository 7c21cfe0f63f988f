"""Key paths: nested trees <-> flat ``{"a/b/0": leaf}`` dicts, spelled the way Orbax spells them.

A path is the keys from the root to a leaf joined by a separator: dict keys as ``str(key)``,
list and tuple positions as ``"0"``, ``"1"``, NamedTuple and dataclass fields by name. This
is the spelling of Orbax's flat keys and of ``jax.tree_util.keystr(..., simple=True)``.

Containers understood natively: dicts and other mappings (``FrozenDict``, ``nnx.State``),
lists, tuples and NamedTuples. Anything else is a container exactly when jax's pytree
registry says so, as in Orbax: a registered dataclass (``flax.struct``,
``jax.tree_util.register_dataclass``; fields marked static are not children) or any other
registered node (an ``nnx.Variable``, say) is opened one level at a time through
``jax.tree_util``, so its keys are the ones jax and Orbax use; a dataclass jax does not know
(a config object, Orbax's metadata classes) is a leaf. Empty containers are kept as leaves
so that a round trip gives back the same tree.

Example:
    >>> flatten({"params": {"dense": {"kernel": 1, "bias": 2}}, "opt": [3, 4]})
    {'params/dense/kernel': 1, 'params/dense/bias': 2, 'opt/0': 3, 'opt/1': 4}
    >>> unflatten({"a/b": 1, "a/c": 2})
    {'a': {'b': 1, 'c': 2}}
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from ._errors import (
    CorruptCheckpointError,
    MissingLeafError,
    PathConflictError,
    TreeMismatchError,
    did_you_mean,
)
from ._jaxtypes import is_jax_array, is_shape_dtype_struct
from ._patterns import fullmatch as bounded_fullmatch

_SCALAR_TYPES = (str, bytes, int, float, complex, bool, type(None), type(Ellipsis))


def is_namedtuple(node: Any) -> bool:
    return isinstance(node, tuple) and hasattr(type(node), "_fields")


_array_types: tuple[type, ...] = (np.ndarray, np.generic)


def register_array_type(array_type: type) -> None:
    """Makes `array_type` a leaf, never opened as a container (`LazyArray`, from above)."""
    global _array_types
    if array_type not in _array_types:
        _array_types = (*_array_types, array_type)


def _is_known_array(node: Any) -> bool:
    """numpy arrays and scalars, registered array types, and jax's arrays and shapes."""
    return isinstance(node, _array_types) or is_jax_array(node) or is_shape_dtype_struct(node)


def _jax_children(node: Any) -> list[tuple[str, Any]] | None:
    """Children of a node registered with jax, keyed the way Orbax keys them."""
    if "jax" not in sys.modules:
        return None  # Nothing registered with jax can exist before jax is imported.
    import jax  # heavy: loaded on first use, not at import

    keyed_children, _ = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    if len(keyed_children) == 1 and keyed_children[0][1] is node:
        return None
    return [(jax_key_name(key_path[0]), child) for key_path, child in keyed_children]


def jax_key_name(key: Any) -> str:
    """One entry of a jax key path as Orbax spells it (dict key, field name or index)."""
    for attribute in ("key", "name", "idx"):
        if hasattr(key, attribute):
            return str(getattr(key, attribute))
    return str(key)


def jax_path(key_path: Iterable[Any], sep: str = "/") -> str:
    """A whole jax key path as a '/' path (``(DictKey('a'), SequenceKey(0))`` -> ``"a/0"``)."""
    return sep.join(jax_key_name(key) for key in key_path)


def children(node: Any) -> list[tuple[str, Any]] | None:
    """The ``(key, child)`` pairs of a container, or None when `node` is a leaf.

    Example:
        >>> children({"a": 1, "b": [2]})
        [('a', 1), ('b', [2])]
        >>> children(3) is None
        True
    """
    if isinstance(node, _SCALAR_TYPES) or _is_known_array(node):
        return None
    if isinstance(node, Mapping):
        items = [(str(key), value) for key, value in node.items()]
    elif is_namedtuple(node):
        items = list(zip(type(node)._fields, node, strict=True))
    elif isinstance(node, (list, tuple)):
        items = [(str(index), value) for index, value in enumerate(node)]
    else:
        return _jax_children(node) or None  # registered dataclasses, other jax pytree nodes
    return items or None  # An empty container is kept as a leaf.


def iter_leaves(
    tree: Any, prefix: tuple[str, ...] = (), is_leaf: Callable[[Any], bool] | None = None
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Yields ``(key_tuple, leaf)`` for every leaf, depth first, in container order."""
    items = None if is_leaf is not None and is_leaf(tree) else children(tree)
    if items is None:
        yield prefix, tree
        return
    for key, child in items:
        yield from iter_leaves(child, (*prefix, key), is_leaf)


def flatten(
    tree: Any, sep: str = "/", is_leaf: Callable[[Any], bool] | None = None
) -> dict[str, Any]:
    """Flattens a nested tree into ``{path: leaf}`` with Orbax's key spelling.

    Args:
        tree: dicts, lists, tuples, NamedTuples, dataclasses, FrozenDicts, ``nnx.State``
            or any jax pytree, nested in any way.
        sep: the string that joins keys.
        is_leaf: optional predicate; nodes for which it is true are leaves.

    Returns:
        A dict from joined key path to leaf, in the tree's order. A tree that is itself a
        leaf flattens to ``{"": tree}``.

    Raises:
        PathConflictError: when two different key paths join to the same string, because a key
            contains `sep`.

    Example:
        >>> flatten({"layers": [{"w": 1}, {"w": 2}]})
        {'layers/0/w': 1, 'layers/1/w': 2}
        >>> flatten({"a": {"b": 1}}, sep=".")
        {'a.b': 1}
    """
    flat: dict[str, Any] = {}
    for keys, leaf in iter_leaves(tree, is_leaf=is_leaf):
        path = sep.join(keys)
        if path in flat:
            raise PathConflictError(
                f"Two leaves flatten to the same path {path!r}: a key contains the separator "
                f"{sep!r}. Flatten with another separator, e.g. sep='|'."
            )
        flat[path] = leaf
    return flat


def unflatten(flat: Mapping[str, Any], sep: str = "/", like: Any = None) -> Any:
    """Builds a nested tree from ``{path: leaf}``; the inverse of `flatten`.

    Args:
        flat: a mapping from joined key path to leaf.
        sep: the string that splits paths into keys.
        like: optional template tree. Without it the result is nested dicts, as Orbax's
            flat keys give. With it the result has the template's containers (lists,
            tuples, NamedTuples, dataclasses, FrozenDict, nnx.State ...), filled from `flat`.

    Raises:
        PathConflictError: when a path is both a leaf and a subtree.
        MissingLeafError: when `like` has a leaf that `flat` lacks.
        TreeMismatchError: when `flat` has paths that `like` does not.

    Example:
        >>> unflatten({"a/b": 1, "a/c": 2})
        {'a': {'b': 1, 'c': 2}}
        >>> unflatten({"0": 1, "1": 2}, like=(0, 0))
        (1, 2)
    """
    if like is not None:
        return _unflatten_like(flat, sep, like)
    if list(flat) == [""]:
        return flat[""]
    root: dict[str, Any] = {}
    for path, leaf in flat.items():
        keys = path.split(sep)
        check_depth(len(keys), path)
        node = root
        for depth, key in enumerate(keys[:-1]):
            child = node.setdefault(key, {})
            if isinstance(child, _LeafBox):
                raise PathConflictError(
                    f"Path {path!r} goes through {sep.join(keys[: depth + 1])!r}, which is "
                    f"also a leaf. A path cannot be both a leaf and a subtree; rename one."
                )
            node = child
        if keys[-1] in node:
            raise PathConflictError(
                f"Path {path!r} is both a leaf and a subtree (or given twice); rename one."
            )
        node[keys[-1]] = _LeafBox(leaf)
    return _unbox(root)


MAX_DEPTH = 256  # tree levels; real checkpoints use under 20, Python's stack allows ~1000


def check_depth(depth: int, where: str) -> None:
    """Refuses a tree nested deeper than `MAX_DEPTH` (it would exhaust Python's stack).

    Example:
        >>> check_depth(3, "a/b/c")
    """
    if depth > MAX_DEPTH:
        raise CorruptCheckpointError(
            f"{where[:200]!r} is nested {depth} levels deep; suture reads trees of at most "
            f"{MAX_DEPTH} levels. The input is damaged or hostile; real checkpoints nest a few "
            f"levels."
        )


class _LeafBox:
    """Wraps leaves while unflattening, so a leaf that is a dict is not taken for a subtree."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _unbox(node: Any) -> Any:
    if isinstance(node, _LeafBox):
        return node.value
    return {key: _unbox(child) for key, child in node.items()}


def _unflatten_like(flat: Mapping[str, Any], sep: str, like: Any) -> Any:
    used: set[str] = set()

    def rebuild(template: Any, keys: tuple[str, ...]) -> Any:
        items = children(template)
        path = sep.join(keys)
        if items is None:
            if path not in flat:
                raise MissingLeafError(
                    f"unflatten: the template has a leaf at {path!r} but the flat dict does "
                    f"not.{did_you_mean(path, flat)}"
                )
            used.add(path)
            return flat[path]
        values = [(key, rebuild(child, (*keys, key))) for key, child in items]
        return rebuild_container(template, values)

    result = rebuild(like, ())
    extra = [path for path in flat if path not in used]
    if extra:
        raise TreeMismatchError(
            f"unflatten: {len(extra)} path(s) are not in the template, e.g. {extra[0]!r}. "
            f"Drop them from the flat dict or unflatten without like=."
        )
    return result


def rebuild_container(template: Any, values: list[tuple[str, Any]]) -> Any:
    """A container of the same kind as `template` holding `values` (pairs from `children`)."""
    if isinstance(template, Mapping):
        originals = {str(key): key for key in template}
        rebuilt = {originals[key]: value for key, value in values}
        return rebuilt if type(template) is dict else _mapping_like(template, rebuilt)
    if is_namedtuple(template):
        return type(template)(*(value for _, value in values))
    if isinstance(template, (list, tuple)):
        return type(template)(value for _, value in values)
    if dataclasses.is_dataclass(template):
        return dataclasses.replace(template, **dict(values))
    import jax  # heavy: loaded on first use, not at import

    _, treedef = jax.tree_util.tree_flatten(template, is_leaf=lambda x: x is not template)
    return jax.tree_util.tree_unflatten(treedef, [value for _, value in values])


def _mapping_like(template: Mapping, items: dict) -> Mapping:
    try:
        return type(template)(items)
    except TypeError:
        return items


def map_leaves_with_path(fn: Callable[[str, Any], Any], tree: Any, sep: str = "/") -> Any:
    """Applies ``fn(path, leaf)`` to every leaf and keeps the tree's containers.

    Example:
        >>> map_leaves_with_path(lambda path, leaf: path, {"a": [0, 0]})
        {'a': ['a/0', 'a/1']}
    """

    def visit(node: Any, keys: tuple[str, ...]) -> Any:
        items = children(node)
        if items is None:
            return fn(sep.join(keys), node)
        return rebuild_container(node, [(key, visit(child, (*keys, key))) for key, child in items])

    return visit(tree, ())


def match_path_or_ancestor(pattern: re.Pattern[str], path: str) -> tuple[re.Match[str], str] | None:
    """The longest of `path` and its ancestor paths that `pattern` fully matches.

    A pattern compiled with the `regex` module (as suture compiles users' patterns) is
    matched under a time bound.

    Returns the match and the rest of `path` below the matched part ("" for the whole path),
    or None.

    Example:
        >>> match, rest = match_path_or_ancestor(re.compile("opt"), "opt/mu/w")
        >>> match.group(0), rest
        ('opt', 'mu/w')
    """
    parts = path.split("/")
    for depth in range(len(parts), 0, -1):
        match = bounded_fullmatch(pattern, "/".join(parts[:depth]))
        if match:
            return match, "/".join(parts[depth:])
    return None


def ancestor_paths(paths: Iterable[str]) -> list[str]:
    """Every path given and every ancestor of one, sorted (for "did you mean" hints).

    Example:
        >>> ancestor_paths(["a/b/c"])
        ['a', 'a/b', 'a/b/c']
    """
    found: set[str] = set()
    for path in paths:
        parts = path.split("/")
        found.update("/".join(parts[:depth]) for depth in range(1, len(parts) + 1))
    return sorted(found)


# Flax NNX spells a Variable's array `.../value` (`.../raw_value` in older Flax) in
# ``nnx.state(model)``; without these keys its paths are the model's own.
VALUE_KEYS = ("value", "raw_value")


def strip_variable_keys(tree: Any) -> Any:
    """The tree with NNX's ``.../value`` and ``.../raw_value`` leaf keys removed.

    Example:
        >>> strip_variable_keys({"linear": {"kernel": {"value": 1}, "bias": {"raw_value": 2}}})
        {'linear': {'kernel': 1, 'bias': 2}}
    """
    flat = flatten(tree)
    stripped: dict[str, Any] = {}
    for path, leaf in flat.items():
        parts = path.split("/")
        short = "/".join(parts[:-1]) if len(parts) > 1 and parts[-1] in VALUE_KEYS else path
        if short in stripped:
            raise PathConflictError(
                f"Leaf {path!r} and another leaf both become {short!r} without their value key."
            )
        stripped[short] = leaf
    return unflatten(stripped)
