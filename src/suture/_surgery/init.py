"""Initializing leaves that the target wants and no source has.

``init`` may be:

- a tree of values (arrays, numbers) at the missing paths;
- a tree whose leaves are callables ``fn(shape, dtype) -> array`` (``np.zeros``,
  ``jnp.ones`` and friends work as they are), or JAX and Flax initializers
  ``fn(key, shape, dtype)`` (``jax.nn.initializers.normal()``,
  ``flax.nnx.initializers.lecun_normal()``): each gets its own key, folded from `seed` and
  a hash of the leaf's path, so a leaf's value does not depend on the other leaves or their
  order;
- a callable with no arguments that builds the whole tree (a closure over a Flax
  ``model.init`` and its rng, say). It runs under ``jax.jit`` with only the missing leaves
  as outputs, so XLA computes and allocates just those.
"""

from __future__ import annotations

import difflib
import inspect
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import (
    ArgumentError,
    MissingLeafError,
    ShapeMismatchError,
    did_you_mean,
)
from .._lazy.array import LazyArray, as_lazy
from .._paths import flatten
from .targets import LeafTarget


def initialize(
    init: Any, missing: Mapping[str, LeafTarget], available: list[str], seed: Any = 0
) -> dict[str, Any]:
    """Values for the `missing` paths, from `init`.

    Args:
        init: see the module docstring, or None.
        missing: ``{path: what the target asks for}``.
        available: the paths the sources do have, for "did you mean" hints.
        seed: an int or a jax PRNG key, for initializers that take a key.

    Raises:
        MissingLeafError: when `init` is None or does not provide a missing path.
        ShapeMismatchError: when an initialized value has the wrong shape.
    """
    if not missing:
        return {}
    if init is None:
        raise MissingLeafError(_missing_message(list(missing), available))
    if callable(init) and not isinstance(init, Mapping):
        return _from_model_init(init, missing, available)
    provided = flatten(init)
    values = {}
    for path, target in missing.items():
        if path not in provided:
            raise MissingLeafError(
                _missing_message([path], available)
                + f" init= has no entry for it either.{did_you_mean(path, provided)}"
            )
        values[path] = _from_entry(provided[path], path, target, seed)
    return values


def covers(init: Any, path: str) -> bool:
    """Whether `init` names `path` (a tree entry, or a leaf of what an init function builds)."""
    if init is None:
        return False
    if callable(init) and not isinstance(init, Mapping):
        import jax  # heavy: loaded on first use, not at import

        return path in flatten(jax.eval_shape(lambda: init()))  # jax sees a plain function
    return path in flatten(init)


def leaf_key(seed: Any, path: str) -> Any:
    """The PRNG key for the leaf at `path`: `seed` folded with a hash of the path.

    Example:
        >>> import jax
        >>> a, b = leaf_key(0, "head/kernel"), leaf_key(0, "head/bias")
        >>> bool((jax.random.key_data(a) != jax.random.key_data(b)).any())
        True
    """
    import jax  # heavy: loaded on first use, not at import

    base = jax.random.key(seed) if isinstance(seed, int) else seed
    return jax.random.fold_in(base, zlib.crc32(path.encode()) & 0x7FFFFFFF)


_KEY_NAMES = ("key", "rng", "rngs", "prng_key", "rng_key")


def takes_key(fn: Callable[..., Any]) -> bool:
    """Whether `fn` is a JAX-style initializer ``fn(key, shape, dtype)``."""
    try:
        parameters = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # builtins such as np.zeros have no signature
        return False
    return bool(parameters) and parameters[0] in _KEY_NAMES


def _missing_message(paths: list[str], available: list[str]) -> str:
    """The message for target `paths` no source provides: one "Did you mean" of close
    matches only, then the fixes, creating them with ``init=`` first (a model that gains
    leaves, LoRA's, over a checkpoint that has none).

    Example:
        >>> print(_missing_message(["m/lora_a", "m/kernal"], ["m/kernel"]))  # doctest: +ELLIPSIS
        The target has 2 leaf path(s) that no source provides: 'm/lora_a', 'm/kernal'. Did you mean 'm/kernel'? To create them, pass init= ...
    """
    shown = paths[:5]
    hints = did_you_mean_any(shown, available)
    more = f" (and {len(paths) - len(shown)} more)" if len(paths) > len(shown) else ""
    return (
        f"The target has {len(paths)} leaf path(s) that no source provides: "
        f"{', '.join(repr(p) for p in shown)}{more}.{hints} To create them, pass init= (a "
        f"tree of values or initializers; for a Flax NNX model and optimizer built fresh, "
        f"init={{'model': nnx.state(model), 'optimizer': nnx.state(optimizer)}}); else fix "
        f"the target's paths, or map them with rules."
    )


def did_you_mean_any(paths: list[str], available: list[str], limit: int = 3) -> str:
    """One " Did you mean ...?" for all of `paths`: close matches only (the whole path and
    its last part alike: ``lora_a`` is not ``kernel``), each named once.

    Example:
        >>> did_you_mean_any(["p/dense/kernal", "p/dense/lora/a/value"], ["p/dense/kernel"])
        " Did you mean 'p/dense/kernel'?"
    """
    found: list[str] = []
    for path in paths:
        for match in difflib.get_close_matches(path, available, n=limit, cutoff=0.6):
            if _parts_differ_little(path, match) and match not in found:
                found.append(match)
    if not found:
        return ""
    return " Did you mean " + " or ".join(repr(match) for match in found[:limit]) + "?"


def _parts_differ_little(path: str, other: str) -> bool:
    """Whether what differs between two paths, once the parts they share at both ends go, is
    alike (``kernal``, ``kernel``) rather than another leaf (``lora/lora_a``, ``kernel``)."""
    a, b = path.split("/"), other.split("/")
    while a and b and a[0] == b[0]:
        a, b = a[1:], b[1:]
    while a and b and a[-1] == b[-1]:
        a, b = a[:-1], b[:-1]
    rest_a, rest_b = "/".join(a), "/".join(b)
    return difflib.SequenceMatcher(None, rest_a, rest_b).ratio() >= 0.6


def _from_entry(entry: Any, path: str, target: LeafTarget, seed: Any) -> Any:
    if callable(entry) and not isinstance(entry, LazyArray):
        if target.shape is None or target.dtype is None:
            raise ArgumentError(
                f"init for {path!r} is a function, but the target leaf gives no shape and "
                f"dtype to call it with. Use a jax.ShapeDtypeStruct or an array as the target leaf."
            )
        if takes_key(entry):
            entry = entry(leaf_key(seed, path), target.shape, target.dtype)
        else:
            entry = entry(target.shape, target.dtype)
    if hasattr(entry, "shape") and hasattr(entry, "dtype"):
        _check_shape(entry, path, target)
        return as_lazy(entry, path=path)
    return entry


def _check_shape(value: Any, path: str, target: LeafTarget) -> None:
    if target.shape is not None and tuple(value.shape) != target.shape:
        raise ShapeMismatchError(
            f"init for {path!r} has shape {tuple(value.shape)}, but the target wants "
            f"{target.shape}. Make the initializer produce {target.shape}."
        )


def _from_model_init(
    init: Callable[[], Any], missing: Mapping[str, LeafTarget], available: list[str]
) -> dict[str, Any]:
    import jax  # heavy: loaded on first use, not at import

    abstract = flatten(jax.eval_shape(lambda: init()))  # jax sees a plain function
    absent = [path for path in missing if path not in abstract]
    if absent:
        raise MissingLeafError(
            _missing_message(absent, available)
            + f" The init function's tree has no such leaf either.{did_you_mean(absent[0], abstract)}"
        )
    wanted = list(missing)

    def only_missing() -> list[Any]:
        full = flatten(init())
        return [full[path] for path in wanted]

    computed = jax.jit(only_missing)()  # XLA drops everything the outputs do not need
    values = {}
    for path, value in zip(wanted, computed, strict=True):
        _check_shape(value, path, missing[path])
        values[path] = as_lazy(value, path=path) if hasattr(value, "shape") else value
    return values
