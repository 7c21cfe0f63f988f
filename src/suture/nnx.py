"""Flax NNX: load a checkpoint into a model, with surgery on the way.

`load_into` takes the model as a live module, an abstract one (``nnx.eval_shape``) or a
factory, builds the abstract state, loads just the leaves it needs (with the model's
shardings), creates the leaves the checkpoint lacks with the model's own initializers, and
returns a real module. Checkpoints of ``nnx.state(model)`` saved with Orbax spell leaves
``.../value`` (or ``.../raw_value`` in older Flax); plain param dicts work as they are.

Example:
    >>> import jax.numpy as jnp, suture
    >>> from flax import nnx
    >>> saved = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    >>> loaded = suture.nnx.load_into(lambda: nnx.Linear(2, 3, rngs=nnx.Rngs(1)), nnx.state(saved))
    >>> bool(jnp.all(loaded.kernel[...] == saved.kernel[...]))
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._errors import SurgeryError
from ._paths import flatten, unflatten
from .sources import open_source

VALUE_KEYS = ("value", "raw_value")


def load_into(
    model: Any,
    source: Any,
    transform: Any = None,
    *,
    init: Any = None,
    partial: bool = False,
    mesh: Any = None,
) -> Any:
    """Returns a real NNX module holding `source`'s weights (after `transform`).

    Args:
        model: an ``nnx.Module``, an abstract one from ``nnx.eval_shape``, or a factory
            (``lambda: Model(rngs=nnx.Rngs(0))``).
        source: a checkpoint path, an opened checkpoint, or a tree (``nnx.state(other)``).
        transform: rules, a transformations tree or a function, applied to the source's
            tree after its ``value``/``raw_value`` keys are removed.
        init: values for leaves the checkpoint lacks. Default: the model's own initial
            values. From a factory they are computed under ``jax.jit`` with only the missing
            leaves as outputs, so only those are allocated (the LoRA case).
        partial: ignore checkpoint leaves the model has no place for.
        mesh: a concrete mesh for shardings of an abstract model (default: ``jax.set_mesh``'s).

    Raises:
        SurgeryError: leaves the model needs that neither the checkpoint nor `init` provide,
            shapes that differ, or checkpoint leaves left over without ``partial=True``.
    """
    from flax import nnx

    from ._load import load
    from ._surgery import transform as lazy_transform

    factory = model if callable(model) and not isinstance(model, nnx.Module) else None
    abstract = nnx.eval_shape(factory) if factory is not None else model
    graphdef, state = nnx.split(abstract)
    target = _target_of(nnx.to_pure_dict(state))
    if init is None:
        init = _default_init(factory, model, nnx)
    tree = strip_variable_keys(open_source(source).tree)
    result = lazy_transform(transform, tree, target=target, init=init, partial=partial)
    loaded = load(result, target, partial=partial, mesh=mesh)
    nnx.replace_by_pure_dict(state, loaded)
    return nnx.merge(graphdef, state)


def _target_of(pure: Any) -> Any:
    import jax

    def describe(leaf: Any) -> Any:
        if isinstance(leaf, jax.ShapeDtypeStruct):
            return leaf
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            sharding = getattr(leaf, "sharding", None)
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        return leaf

    return jax.tree.map(describe, pure)


def _default_init(factory: Callable[[], Any] | None, model: Any, nnx: Any) -> Any:
    if factory is not None:
        return lambda: nnx.to_pure_dict(nnx.state(factory()))
    if isinstance(model, nnx.Module):
        pure = nnx.to_pure_dict(nnx.state(model))
        import jax

        if all(not isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(pure)):
            return pure  # a live model: its current values fill what the checkpoint lacks
    return None


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
            raise SurgeryError(
                f"Leaf {path!r} and another leaf both become {short!r} without their value key."
            )
        stripped[short] = leaf
    return unflatten(stripped)
