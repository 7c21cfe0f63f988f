"""`suture.merge`: several fine-tuned models into one, leaf by leaf, lazily.

Methods, by mergekit's names and with its parameters (``docs/merging.md`` has the formulas):
``linear``, ``slerp``, ``nuslerp``, ``multislerp``, ``karcher``, ``task_arithmetic``,
``ties``, ``dare``, ``dare_ties``, ``dare_linear``, ``breadcrumbs``, ``breadcrumbs_ties``,
``della``, ``della_linear``, ``model_stock``, ``sce``, ``nearswap``, ``arcee_fusion`` and
``passthrough``.

Elementwise methods (linear, task arithmetic, nearswap, passthrough) stream: part of a leaf
reads only that part of the inputs. The others need whole-tensor statistics and read each
leaf whole, one leaf at a time within the budget. The result is a lazy tree: load it, plan
it, or stream it with `suture.save`.

Example:
    >>> import numpy as np, suture
    >>> a, b = {"w": np.zeros(2, np.float32)}, {"w": np.ones(2, np.float32)}
    >>> suture.load(suture.merge([a, b], "linear", weights=[1, 3]))["w"]
    array([0.75, 0.75], dtype=float32)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._dtypes import to_dtype
from .._errors import MergeError, ShapeMismatchError
from .._lazy.array import LazyArray
from .._lazy.array import map as lazy_map
from .._paths import flatten, match_path_or_ancestor, unflatten
from ..sources.detect import open_source
from .registry import (
    METHODS,
    Method,
    check_magnitudes,
    check_params,
    check_value,
    check_weight,
    compile_per_leaf,
    get_method,
    with_defaults,
)
from .task_vectors import MergeInputs

__all__ = ["METHODS", "LeafMerge", "MergeError", "merge", "merge_leaf"]


@dataclass(frozen=True)
class LeafMerge:
    """What is computed for one leaf: the method, its parameters, and who takes part."""

    method: Method
    params: dict[str, Any]
    weights: tuple[float, ...]
    model_params: tuple[dict[str, Any], ...] = field(default=())
    take: int | None = None


def merge(
    sources: Sequence[Any],
    method: str,
    *,
    base: Any = None,
    weights: Sequence[float] | None = None,
    params: dict[str, Any] | None = None,
    model_params: Sequence[dict[str, Any]] | None = None,
    per_leaf: dict[str, dict[str, Any]] | None = None,
    missing: str = "error",
    compute_dtype: str = "float32",
    dtype: Any = None,
) -> Any:
    """Merges `sources` leaf by leaf; returns a lazy tree.

    Args:
        sources: the models (paths, opened checkpoints or trees), all of the same structure.
        method: a method name (see the module docstring), e.g. ``"ties"``.
        base: the base model, for the task-vector methods, model_stock, sce, nearswap and
            arcee_fusion (optional for nuslerp and multislerp).
        weights: one weight per model (default: 1 each).
        params: the method's parameters, e.g. ``{"t": 0.3}`` or ``{"density": 0.5}``.
        model_params: one dict per model of its own parameters (``density``, ``gamma``,
            ``epsilon`` for the task-vector methods, ``scale`` for passthrough).
        per_leaf: ``{regex: {parameter: value}}`` for leaves whose path (or an ancestor's)
            the regex fully matches; the first match wins. ``{"take": k}`` takes the leaf from
            model ``k`` as it is; ``{"weights": [...]}`` overrides the weights.
        missing: ``"error"`` when some models lack a leaf, or ``"available"`` to merge it
            from the models that have it (taken as is when only one has it).
        compute_dtype: ``"float32"`` (default), or ``"input"`` to compute in the inputs' dtype.
        dtype: the output dtype (default: the first model's dtype for each leaf).

    Raises:
        MergeError: an unknown method or parameter, a parameter or weight that is not a
            finite number of its kind, a missing base, leaves missing from some models, or
            shapes that differ; weights whose sum a normalizing method divides by is 0, or a
            weight or scale beyond the compute dtype's range. When read: a merged block that
            holds inf or NaN, or a Karcher mean that takes a leaf more than 600 s.
    """
    chosen = get_method(method)
    # quantized models merge on their dequantized values, never on FP8 bytes and scales
    trees = [flatten(open_source(source, dequantize="auto").tree) for source in sources]
    if not trees:
        raise MergeError("merge needs at least one model.")
    check_model_count(chosen, len(trees), base is not None)
    base_tree = flatten(open_source(base, dequantize="auto").tree) if base is not None else None
    default = leaf_merge(chosen, params or {}, weights, model_params, len(trees))
    overrides = []
    for pattern, values in (per_leaf or {}).items():
        overrides.append((compile_per_leaf(pattern), values))
    merged = {}
    for path in _all_paths(trees):
        present = [i for i, tree in enumerate(trees) if path in tree]
        if len(present) < len(trees) and missing == "error":
            absent = [i for i in range(len(trees)) if i not in present]
            raise MergeError(
                f"Leaf {path!r} is missing from model(s) {absent}. Pass missing='available' to "
                f"merge it from the models that have it, or drop it from all of them first."
            )
        plan = _for_leaf(path, default, overrides, len(trees))
        if plan.take is not None:
            if plan.take not in present:
                raise MergeError(
                    f"Leaf {path!r}: take={plan.take}, but model {plan.take} lacks it."
                )
            merged[path] = trees[plan.take][path]
            continue
        leaves = [trees[i][path] for i in present]
        if len(leaves) == 1 and len(trees) > 1:
            merged[path] = leaves[0]  # missing="available" and only one model has it
            continue
        base_leaf = None
        if chosen.base != "none" and base_tree is not None:
            if path not in base_tree:
                raise MergeError(f"Leaf {path!r} is missing from the base model.")
            base_leaf = base_tree[path]
        picked = LeafMerge(
            plan.method,
            plan.params,
            tuple(plan.weights[i] for i in present),
            tuple(plan.model_params[i] for i in present),
        )
        merged[path] = merge_leaf(path, picked, leaves, base_leaf, compute_dtype, dtype)
    return unflatten(merged)


def check_model_count(method: Method, count: int, has_base: bool) -> None:
    """Raises MergeError when `method` cannot merge `count` models (with or without a base)."""
    fewest, most = method.models
    if count < fewest or (most is not None and count > most):
        wanted = f"exactly {fewest}" if fewest == most else f"at least {fewest}"
        if most is not None and fewest != most:
            wanted = f"{fewest} to {most}"
        besides = " besides the base" if method.base != "none" else ""
        raise MergeError(f"{method.name} merges {wanted} model(s){besides}; {count} were given.")
    if method.base == "required" and not has_base:
        raise MergeError(f"{method.name} needs base= (the model the others were fine-tuned from).")
    if method.base == "none" and has_base:
        raise MergeError(f"{method.name} takes no base model; list it among the models instead.")


def _all_paths(trees: list[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for tree in trees:
        seen.update(dict.fromkeys(tree))
    return list(seen)


def leaf_merge(
    method: Method,
    params: dict[str, Any],
    weights: Sequence[Any] | None,
    model_params: Sequence[dict[str, Any]] | None,
    count: int,
    where: str = "",
) -> LeafMerge:
    """The checked parameters, weights and per-model parameters of a merge of `count` models."""
    if not isinstance(params, dict):
        raise MergeError(f"{where}params must be a mapping of parameter names to values.")
    checked = with_defaults(method, check_params(method, params, where), where)
    if weights is not None and (
        isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence)
    ):
        raise MergeError(
            f"{where}weights must be a list of numbers, one per model; got {weights!r}."
        )
    chosen = (
        tuple(check_weight(w, i, where) for i, w in enumerate(weights))
        if weights is not None
        else (1.0,) * count
    )
    if len(chosen) != count:
        raise MergeError(
            f"{where}{count} models but {len(chosen)} weights; give one weight per model."
        )
    own = tuple(model_params) if model_params is not None else ({},) * count
    if len(own) != count:
        raise MergeError(f"{where}{count} models but {len(own)} model_params; give one per model.")
    own_checked = []
    for index, values in enumerate(own):
        for name in values:
            if name not in method.model_params:
                raise MergeError(
                    f"{where}model {index}: {method.name} has no per-model parameter {name!r}; "
                    f"those are {', '.join(method.model_params) or 'none'}."
                )
        own_checked.append(
            {
                name: check_value(method.name, name, value, method.model_params[name], where)
                for name, value in values.items()
            }
        )
    return LeafMerge(method, checked, chosen, tuple(own_checked))


def _for_leaf(
    path: str,
    default: LeafMerge,
    overrides: list[tuple[Any, dict[str, Any]]],
    count: int,
) -> LeafMerge:
    for pattern, values in overrides:
        if match_path_or_ancestor(pattern, path) is None:
            continue
        where = f"per_leaf {pattern.pattern!r}: "
        if not isinstance(values, dict):
            raise MergeError(f"{where}the value must be a mapping of parameters; got {values!r}.")
        values = dict(values)
        take = values.pop("take", None)
        if take is not None and (
            isinstance(take, bool) or not isinstance(take, int) or not 0 <= take < count
        ):
            raise MergeError(f"{where}take={take} is not a model index (0 to {count - 1}).")
        weights = values.pop("weights", None)
        merged = leaf_merge(
            default.method,
            {**default.params, **values},
            weights if weights is not None else default.weights,
            default.model_params,
            count,
            where,
        )
        return LeafMerge(merged.method, merged.params, merged.weights, merged.model_params, take)
    return default


def merge_leaf(
    path: str,
    plan: LeafMerge,
    leaves: list[Any],
    base: Any,
    compute_dtype: str = "float32",
    dtype: Any = None,
) -> Any:
    """One merged leaf, lazily: `plan` applied to `leaves` (and `base`).

    Leaves that are not arrays (names), and integer and boolean arrays (a TrainState's
    ``step``, Adam's ``count``, token ids: an average of 2 and 3 would be 2, truncated), are
    not merged: they come from the base model when there is one, else from the first. They
    must still have one shape in every model; a leaf that is floating-point in some models
    and not in others, and complex leaves, are refused.
    """
    inputs = list(leaves) + ([base] if base is not None else [])
    _check_alike(path, inputs, base is not None)
    if not isinstance(leaves[0], LazyArray) or _kind(leaves[0]) == "other":
        return base if base is not None else leaves[0]
    method = plan.method
    if method.base == "required" and base is None:
        raise MergeError(f"Leaf {path!r}: {method.name} needs a base model.")
    out_dtype = to_dtype(dtype) if dtype is not None else leaves[0].dtype
    work = leaves[0].dtype if compute_dtype == "input" else to_dtype(compute_dtype)
    check_magnitudes(path, method, plan.params, plan.weights, plan.model_params, work)
    kernel = method.make_kernel(plan.params)
    seed = _seed(path, plan.params)
    count = len(leaves)

    def compute(*arrays: np.ndarray) -> np.ndarray:
        values = [np.asarray(array, dtype=work) for array in arrays]
        with np.errstate(all="ignore"):  # an overflow is refused by `check_finite` below
            merged, result = _merged(values)
        check_finite(result, merged, values, path, plan)
        return result

    def _merged(values: list[np.ndarray]) -> tuple[Any, np.ndarray]:
        merged = kernel(
            MergeInputs(
                values[:count],
                values[count] if base is not None else None,
                list(plan.weights),
                [dict(own) for own in plan.model_params] or [{} for _ in range(count)],
                path,
                seed,
            )
        )
        return merged, np.asarray(merged).astype(out_dtype)

    compute.__name__ = f"{method.name}_merge"
    return lazy_map(
        compute, *inputs, shape=leaves[0].shape, dtype=out_dtype, elementwise=method.elementwise
    )


def check_finite(
    result: np.ndarray, merged: Any, inputs: list[np.ndarray], path: str, plan: LeafMerge
) -> None:
    """Refuses a block of merged leaf `path` that holds inf or NaN, saying where they come
    from: an input that holds them, the cast to the output dtype, or the merge itself."""
    finite = np.isfinite(result)
    if finite.all():
        return
    bad = np.flatnonzero(~finite.reshape(-1))
    first = result.reshape(-1)[bad[0]]
    method = plan.method.name
    found = f"Leaf {path!r}: {len(bad)} value(s) of a block are {first} after the {method} merge"
    models = [i for i, x in enumerate(inputs) if not np.isfinite(x).all()]
    if models:
        who = ", ".join("the base" if i == len(plan.weights) else f"model {i}" for i in models)
        cause = (
            f"{who} already hold(s) inf or NaN there. Fix or drop that leaf in the model "
            f"(per_leaf: {{take: K}} takes it from a sound model)."
        )
    elif np.isfinite(np.asarray(merged, np.float64)).all():
        cause = (
            f"the merged values exceed the largest {result.dtype.name} of the output. Pass "
            f"dtype='float32' (or a wider dtype), or smaller weights."
        )
    else:
        cause = (
            f"the merge itself overflows or divides by zero on these finite values (weights "
            f"{list(plan.weights)}, parameters {plan.params}). Use smaller or normalized "
            f"weights, or another method for this leaf (per_leaf)."
        )
    raise MergeError(f"{found}: {cause}")


def _check_alike(path: str, inputs: list[Any], has_base: bool) -> None:
    """Refuses leaf `path` unless every model holds it as the same kind of thing: arrays of
    one shape, all floating-point or all not (integer, bool), and never complex."""

    def who(index: int) -> str:
        return "the base" if has_base and index == len(inputs) - 1 else f"model {index}"

    def listing(describe: Any) -> str:
        return ", ".join(f"{who(i)}: {describe(leaf)}" for i, leaf in enumerate(inputs))

    arrays = [isinstance(leaf, LazyArray) for leaf in inputs]
    if any(arrays) and not all(arrays):
        raise MergeError(
            f"Leaf {path!r} is an array in some models and not in others "
            f"({listing(lambda leaf: type(leaf).__name__)}). Make it the same in every model, "
            f"or take it from one (per_leaf={{{path!r}: {{'take': K}}}})."
        )
    if not any(arrays):
        return
    shapes = {leaf.shape for leaf in inputs}
    if len(shapes) > 1:
        raise ShapeMismatchError(
            f"Leaf {path!r} has different shapes in the models: {sorted(shapes)} "
            f"({listing(lambda leaf: leaf.shape)}). Only equally shaped leaves can be merged "
            f"or taken; drop or reshape it first."
        )
    kinds = {_kind(leaf) for leaf in inputs}
    if "complex" in kinds:
        raise MergeError(
            f"Leaf {path!r} is complex ({listing(lambda leaf: leaf.dtype.name)}); merges "
            f"compute on real floating-point values and would drop the imaginary part. Take "
            f"it from one model (per_leaf={{{path!r}: {{'take': K}}}}), or store its real and "
            f"imaginary parts as two float leaves and merge those."
        )
    if len(kinds) > 1:
        raise MergeError(
            f"Leaf {path!r} is floating-point in some models and not in others "
            f"({listing(lambda leaf: leaf.dtype.name)}): floats are merged, integers and "
            f"booleans taken from one model, so it can be neither. Cast it to one dtype in "
            f"every model first, or take it from one (per_leaf={{{path!r}: {{'take': K}}}})."
        )


def _kind(leaf: LazyArray) -> str:
    """``"float"`` (merged), ``"complex"`` (refused) or ``"other"`` (integers, bools: taken)."""
    if np.issubdtype(leaf.dtype, np.floating) or _extended_float(leaf):
        return "float"
    return "complex" if np.issubdtype(leaf.dtype, np.complexfloating) else "other"


def _extended_float(leaf: LazyArray) -> bool:
    """ml_dtypes' floats (bfloat16, float8), which numpy does not count as inexact."""
    return leaf.dtype.kind == "V" and "float" in leaf.dtype.name


def _seed(path: str, params: dict[str, Any]) -> int:
    digest = hashlib.sha256(f"{params.get('seed', 0)}:{path}".encode()).digest()
    return int.from_bytes(digest[:8], "little")
