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

from ._errors import (
    ArgumentError,
    MissingLeafError,
    TreeMismatchError,
    UnsupportedError,
    did_you_mean,
)
from ._jaxtypes import is_shape_dtype_struct
from ._lazy.array import LazyArray
from ._lazy.combine import fit_shape
from ._load.api import load
from ._paths import VALUE_KEYS as VALUE_KEYS
from ._paths import flatten, strip_variable_keys, unflatten
from ._surgery.build import transform as lazy_transform
from .sources.detect import open_source


def load_into(
    model: Any,
    source: Any,
    transform: Any = None,
    *,
    init: Any = None,
    partial: bool = False,
    pad_truncate: bool | str = False,
    in_place: bool = False,
    mesh: Any = None,
    seed: Any = 0,
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
        pad_truncate: zero-pad or truncate leaves whose shape differs from the model's (a
            bigger vocabulary), as `suture.load` does. ``"mean"`` fills the new rows with the
            mean of the existing ones; ``"init"`` with the model's own initial values there
            (or `init`'s), as people initialize new tokens.
        in_place: update the given live module's variables (as ``nnx.update`` does) and
            return that same module, instead of a new one.
        mesh: a concrete mesh for shardings of an abstract model (default: ``jax.set_mesh``'s).
            Variables without sharding annotations go on the default device, as a live
            module's do, wherever the checkpoint was saved from (a pod, read on a laptop).
        seed: seed or key for JAX initializers in `init` (see `suture.transform`).

    Raises:
        SurgeryError: when the checkpoint gives the model nothing; leaves the model needs
            that neither the checkpoint nor `init` provide; shapes that differ (without
            `pad_truncate`); checkpoint leaves left over without ``partial=True``. Each
            lists the model's and the checkpoint's unmatched paths, paired by similarity.
    """
    from flax import nnx  # heavy: loaded on first use, not at import

    if in_place and not isinstance(model, nnx.Module):
        raise ArgumentError(
            f"load_into(in_place=True) updates a live nnx.Module; got "
            f"{type(model).__name__}. Pass the module itself, or drop in_place=True to get a "
            f"new module."
        )
    factory = model if callable(model) and not isinstance(model, nnx.Module) else None
    abstract = nnx.eval_shape(factory) if factory is not None else model
    graphdef, state = nnx.split(abstract)
    annotated = _sharding_annotations(state, nnx)
    target = _target_of(
        nnx.to_pure_dict(state),
        _declared_shardings(nnx, state, mesh),
        on_default_device=not annotated,
    )
    if init is None:
        init = _default_init(factory, model, nnx)
    if in_place and init is None:
        raise ArgumentError(
            "load_into(in_place=True) got an abstract module (from nnx.eval_shape): it has no "
            "values to update. Pass a live module, or drop in_place=True."
        )
    tree = strip_variable_keys(open_source(source).tree)
    transformed = lazy_transform(transform, tree, seed=seed)
    transformed = _matched(transformed, flatten(target), partial, pad_truncate, init)
    result = lazy_transform(None, transformed, target=target, init=init, partial=partial, seed=seed)
    try:  # leaves are fitted above: the load pads nothing more
        loaded = load(result, target, partial=partial, pad_truncate=bool(pad_truncate), mesh=mesh)
    except UnsupportedError as error:
        if not annotated:
            raise
        raise UnsupportedError(
            f"{error} The model's variables name mesh axes ({', '.join(annotated[:3])}) but "
            f"have no sharding: create the model and load under `with jax.set_mesh(mesh):`, "
            f"or pass mesh= to load_into."
        ) from error
    nnx.replace_by_pure_dict(state, loaded)
    if in_place:
        nnx.update(model, state)
        return model
    return nnx.merge(graphdef, state)


def _matched(
    transformed: Any, model: dict[str, Any], partial: bool, pad_truncate: bool | str, init: Any
) -> Any:
    """The checkpoint's tree, checked against the model's paths before anything is read."""
    flat = flatten(transformed)
    shared = [path for path in model if path in flat]
    missing = [path for path in model if path not in flat]
    extra = [path for path in flat if path not in model]
    if not shared:
        raise TreeMismatchError(
            "The checkpoint gives the model nothing: no checkpoint leaf has a model path, so "
            "every value would stay as initialized.\n"
            + _both_sides(missing, extra)
            + "\nMap the names with a transform (suture.rules.rename), or check the checkpoint."
        )
    if extra and not partial:
        raise TreeMismatchError(
            f"The checkpoint covers {len(shared)} of the model's {len(model)} leaves, and has "
            f"{len(extra)} leaf path(s) the model has no place for.\n"
            + _both_sides(missing, extra)
            + "\nRename them with a transform, or pass partial=True to leave them out."
        )
    if missing and init is None:
        raise MissingLeafError(
            f"The model needs {len(missing)} leaf path(s) the checkpoint lacks, and an "
            f"abstract model has no values for them.\n"
            + _both_sides(missing, extra)
            + "\nRename checkpoint leaves with a transform, pass a factory or a live module, "
            "or pass init=."
        )
    if pad_truncate:
        resized = [
            path
            for path in shared
            if isinstance(flat[path], LazyArray) and tuple(model[path].shape) != flat[path].shape
        ]
        fills: dict[str, Any] = dict.fromkeys(
            resized, "mean" if pad_truncate == "mean" else "zeros"
        )
        if pad_truncate == "init":
            fills = _initial_values(init, resized)
        elif pad_truncate not in (True, "zeros", "mean"):
            raise ArgumentError(
                f"pad_truncate={pad_truncate!r}: pass True (zeros), 'mean' (the mean of the "
                f"existing rows) or 'init' (the model's initial values)."
            )
        for path in resized:
            flat[path] = fit_shape(flat[path], tuple(model[path].shape), fills[path])
        return unflatten(flat)
    return transformed


def _initial_values(init: Any, paths: list[str]) -> dict[str, Any]:
    """The initial values of the leaves at `paths`: a live model's, or computed from a
    factory under ``jax.jit`` with only those leaves as outputs."""
    if not paths:
        return {}
    if init is None:
        raise ArgumentError(
            "pad_truncate='init' takes new rows from the model's initial values, and an "
            "abstract model has none. Pass a factory or a live module, or init=, or pad with "
            "pad_truncate='mean'."
        )
    if callable(init):
        import jax  # heavy: loaded on first use, not at import

        computed = jax.jit(lambda: [flatten(init())[path] for path in paths])()
        return dict(zip(paths, computed, strict=True))
    provided = flatten(init)
    absent = [path for path in paths if not hasattr(provided.get(path), "shape")]
    if absent:
        raise ArgumentError(
            f"pad_truncate='init': init= gives no array for {absent[0]!r}. Give its initial "
            f"value, or pad with pad_truncate='mean'."
        )
    return {path: provided[path] for path in paths}


def _both_sides(model_only: list[str], checkpoint_only: list[str], limit: int = 8) -> str:
    """The unmatched paths of both sides, each model path paired with its closest match."""

    def listed(title: str, paths: list[str], hint: Callable[[str], str]) -> list[str]:
        shown = [f"    {path!r}{hint(path)}" for path in paths[:limit]]
        more = [f"    ... and {len(paths) - limit} more"] if len(paths) > limit else []
        return [f"  {title} ({len(paths)}):", *shown, *more]

    model_side = listed(
        "model paths with no checkpoint leaf",
        model_only,
        lambda path: (
            did_you_mean(path, checkpoint_only, limit=1)
            .replace(" Did you mean", " (did you mean checkpoint")
            .replace("?", "?)")
        ),
    )
    checkpoint_side = listed(
        "checkpoint leaves with no model path", checkpoint_only, lambda path: ""
    )
    return "\n".join(model_side + checkpoint_side)


def _sharding_annotations(state: Any, nnx: Any) -> list[str]:
    """``path: axes`` of the variables that carry sharding annotations (``with_partitioning``)."""
    found = []
    for keys, variable in nnx.to_flat_state(state):
        metadata = variable.get_metadata() if hasattr(variable, "get_metadata") else {}
        for field in ("out_sharding", "sharding_names", "sharding"):
            if metadata.get(field) is not None:
                found.append(f"{'/'.join(map(str, keys))}: {metadata[field]}")
                break
    return found


def _target_of(
    pure: Any, declared: dict[str, Any] | None = None, on_default_device: bool = False
) -> Any:
    """The load's target: the model's leaves as ShapeDtypeStructs with their shardings.

    A leaf whose variable declares a sharding on the mesh (`declared`, ``sharding=`` names)
    takes it. An abstract leaf without one (a factory's, from ``nnx.eval_shape``) goes on the
    default device when `on_default_device`, as a live module's arrays are, rather than on
    the devices the checkpoint was saved from (a pod's, absent on a laptop).
    """
    import jax  # heavy: loaded on first use, not at import

    default = None
    if on_default_device:
        device = jax.config.jax_default_device
        if device is None or isinstance(device, str):
            device = jax.devices(device)[0]
        default = jax.sharding.SingleDeviceSharding(device)

    def describe(leaf: Any, named: Any = None) -> Any:
        if named is not None and any(axis is not None for axis in getattr(named, "spec", ())):
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=named)
        if is_shape_dtype_struct(leaf):
            if getattr(leaf, "sharding", None) is None and default is not None:
                return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=default)
            return leaf
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
            sharding = getattr(leaf, "sharding", None)
            return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
        return leaf

    if declared is None:
        return jax.tree.map(describe, pure)
    return jax.tree.map(describe, pure, declared, is_leaf=lambda x: x is None)


def _declared_shardings(nnx: Any, state: Any, mesh: Any) -> dict[str, Any] | None:
    """The shardings the model's variables declare on `mesh` (or ``jax.set_mesh``'s), as
    Tunix's and MaxText's models do (``nnx.Param(..., sharding=('fsdp', 'tp'))``): under
    ``nnx.eval_shape`` the arrays themselves carry none."""
    import jax  # heavy: loaded on first use, not at import

    if mesh is None:
        current = getattr(jax.sharding, "get_mesh", None)
        mesh = current() if current is not None else None
    if mesh is None or not getattr(mesh, "shape", None):
        return None
    return nnx.to_pure_dict(nnx.get_named_sharding(state, mesh))


def _default_init(factory: Callable[[], Any] | None, model: Any, nnx: Any) -> Any:
    if factory is not None:
        return lambda: nnx.to_pure_dict(nnx.state(factory()))
    if isinstance(model, nnx.Module):
        pure = nnx.to_pure_dict(nnx.state(model))
        import jax  # heavy: loaded on first use, not at import

        if not any(is_shape_dtype_struct(leaf) for leaf in jax.tree.leaves(pure)):
            return pure  # a live model: its current values fill what the checkpoint lacks
    return None
