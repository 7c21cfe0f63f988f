"""`suture.merge`: several fine-tuned models into one, leaf by leaf, lazily.

Methods (``x_i`` are the models' leaves, ``b`` the base model's, ``t_i = x_i - b`` the
task vectors):

- ``linear``: ``sum(w_i * x_i)``, weights normalized to sum to 1 unless ``normalize=False``.
- ``slerp``: spherical interpolation of two models at ``t`` (per tensor; falls back to
  linear interpolation when the tensors are nearly parallel).
- ``task_arithmetic``: ``b + scale * sum(w_i * t_i)``.
- ``ties``: trim each ``t_i`` to its ``density`` fraction of largest magnitudes, elect each
  element's sign by the sign of the sum, average the trimmed values that agree with it
  (disjoint mean), then ``b + scale * merged``.
- ``dare``: drop each element of each ``t_i`` with probability ``drop`` (seeded,
  deterministic), rescale the rest by ``1 / (1 - drop)``, then ``b + scale * sum(w_i * t_i)``.

Elementwise methods (linear, task arithmetic) stream: part of a leaf reads only that part of
the inputs. SLERP, TIES and DARE read each leaf whole (one leaf at a time). The result is a
lazy tree: load it, plan it, or stream it with `suture.save`.

Example:
    >>> import numpy as np, suture
    >>> a, b = {"w": np.zeros(2, np.float32)}, {"w": np.ones(2, np.float32)}
    >>> suture.load(suture.merge([a, b], "linear", weights=[1, 3]))["w"]
    array([0.75, 0.75], dtype=float32)
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._dtypes import to_dtype
from ._errors import ShapeMismatchError, SurgeryError
from ._lazy import LazyArray
from ._lazy import map as lazy_map
from ._paths import flatten, match_path_or_ancestor, unflatten
from .sources import open_source

METHODS = ("linear", "slerp", "task_arithmetic", "ties", "dare")
NEEDS_BASE = ("task_arithmetic", "ties", "dare")
DEFAULTS: dict[str, dict[str, Any]] = {
    "linear": {"normalize": True},
    "slerp": {"t": 0.5, "epsilon": 1e-6},
    "task_arithmetic": {"scale": 1.0},
    "ties": {"density": 0.2, "scale": 1.0},
    "dare": {"drop": 0.9, "scale": 1.0, "seed": 0},
}


class MergeError(SurgeryError, ValueError):
    """A merge that cannot be done as asked."""


@dataclass(frozen=True)
class LeafMerge:
    """What is computed for one leaf: the method, its parameters, and who takes part."""

    method: str
    params: dict[str, Any]
    weights: tuple[float, ...]
    take: int | None = None


def merge(
    sources: Sequence[Any],
    method: str,
    *,
    base: Any = None,
    weights: Sequence[float] | None = None,
    params: dict[str, Any] | None = None,
    per_leaf: dict[str, dict[str, Any]] | None = None,
    missing: str = "error",
    compute_dtype: str = "float32",
    dtype: Any = None,
) -> Any:
    """Merges `sources` leaf by leaf; returns a lazy tree.

    Args:
        sources: the models (paths, opened checkpoints or trees), all of the same structure.
        method: one of ``linear``, ``slerp``, ``task_arithmetic``, ``ties``, ``dare``.
        base: the base model, for task arithmetic, TIES and DARE.
        weights: one weight per model (default: equal).
        params: the method's parameters (see the module docstring), e.g. ``{"t": 0.3}``.
        per_leaf: ``{regex: {parameter: value}}`` for leaves whose path (or an ancestor's)
            the regex fully matches; the first match wins. ``{"take": k}`` takes the leaf from
            model ``k`` as it is; ``{"weights": [...]}`` overrides the weights.
        missing: ``"error"`` when some models lack a leaf, or ``"available"`` to merge it
            from the models that have it (taken as is when only one has it).
        compute_dtype: ``"float32"`` (default), or ``"input"`` to compute in the inputs' dtype.
        dtype: the output dtype (default: the first model's dtype for each leaf).

    Raises:
        MergeError: an unknown method or parameter, a missing base, leaves missing from some
            models, or shapes that differ.
    """
    if method not in METHODS:
        raise MergeError(f"Unknown merge method {method!r}. Methods: {', '.join(METHODS)}.")
    trees = [flatten(open_source(source).tree) for source in sources]
    if not trees:
        raise MergeError("merge needs at least one model.")
    if method == "slerp" and len(trees) != 2:
        raise MergeError(f"slerp merges exactly two models; {len(trees)} were given.")
    if method in NEEDS_BASE and base is None:
        raise MergeError(f"{method} needs base= (the model the others were fine-tuned from).")
    base_tree = flatten(open_source(base).tree) if base is not None else None
    default = _leaf_merge(method, params or {}, weights, len(trees))
    overrides = [(re.compile(pattern), values) for pattern, values in (per_leaf or {}).items()]
    merged = {}
    for path in _all_paths(trees):
        present = [i for i, tree in enumerate(trees) if path in tree]
        if len(present) < len(trees) and missing == "error":
            absent = [i for i in range(len(trees)) if i not in present]
            raise MergeError(
                f"Leaf {path!r} is missing from model(s) {absent}. Pass missing='available' to "
                f"merge it from the models that have it, or drop it from all of them first."
            )
        plan = _for_leaf(path, default, overrides, method, len(trees))
        merged[path] = _merge_leaf(path, plan, trees, present, base_tree, compute_dtype, dtype)
    return unflatten(merged)


def _all_paths(trees: list[dict]) -> list[str]:
    seen: dict[str, None] = {}
    for tree in trees:
        seen.update(dict.fromkeys(tree))
    return list(seen)


def _leaf_merge(
    method: str, params: dict[str, Any], weights: Sequence[float] | None, count: int
) -> LeafMerge:
    unknown = sorted(set(params) - set(DEFAULTS[method]))
    if unknown:
        raise MergeError(
            f"{method} has no parameter {unknown[0]!r}; its parameters are "
            f"{', '.join(DEFAULTS[method]) or 'none'}."
        )
    chosen = tuple(float(w) for w in weights) if weights is not None else (1.0,) * count
    if len(chosen) != count:
        raise MergeError(f"{count} models but {len(chosen)} weights; give one weight per model.")
    return LeafMerge(method, {**DEFAULTS[method], **params}, chosen)


def _for_leaf(
    path: str,
    default: LeafMerge,
    overrides: list[tuple[re.Pattern[str], dict[str, Any]]],
    method: str,
    count: int,
) -> LeafMerge:
    for pattern, values in overrides:
        if match_path_or_ancestor(pattern, path) is not None:
            values = dict(values)
            take = values.pop("take", None)
            if take is not None and not (0 <= int(take) < count):
                raise MergeError(
                    f"per_leaf {pattern.pattern!r}: take={take} is not a model index (0 to {count - 1})."
                )
            weights = values.pop("weights", None)
            merged = _leaf_merge(
                method, {**default.params, **values}, weights or default.weights, count
            )
            return LeafMerge(
                merged.method, merged.params, merged.weights, None if take is None else int(take)
            )
    return default


def _merge_leaf(
    path: str,
    plan: LeafMerge,
    trees: list[dict],
    present: list[int],
    base_tree: dict | None,
    compute_dtype: str,
    dtype: Any,
) -> Any:
    if plan.take is not None:
        if plan.take not in present:
            raise MergeError(f"Leaf {path!r}: take={plan.take}, but model {plan.take} lacks it.")
        return trees[plan.take][path]
    leaves = [trees[i][path] for i in present]
    if not all(isinstance(leaf, LazyArray) for leaf in leaves):
        return leaves[0]  # step counters, names: the first model's
    if len(leaves) == 1 and len(trees) > 1:
        return leaves[0]  # missing="available" and only one model has it: taken as it is
    shapes = {leaf.shape for leaf in leaves}
    base = None
    if plan.method in NEEDS_BASE:
        if base_tree is None or path not in base_tree:
            raise MergeError(f"Leaf {path!r} is missing from the base model.")
        base = base_tree[path]
        shapes.add(base.shape)
    if len(shapes) > 1:
        raise ShapeMismatchError(
            f"Leaf {path!r} has different shapes in the models: {sorted(shapes)}. Only equally "
            f"shaped leaves can be merged; drop or reshape it first."
        )
    weights = [
        plan.weights[i] for i in present
    ]  # Python floats: arithmetic stays in the work dtype
    out_dtype = to_dtype(dtype) if dtype is not None else leaves[0].dtype
    work = leaves[0].dtype if compute_dtype == "input" else to_dtype(compute_dtype)
    inputs = leaves + ([base] if base is not None else [])
    kernel = _KERNELS[plan.method](plan.params, weights, _seed(path, plan.params))

    def compute(*arrays: np.ndarray) -> np.ndarray:
        values = [np.asarray(array, dtype=work) for array in arrays]
        return np.asarray(
            kernel(values[: len(leaves)], values[len(leaves)] if base is not None else None)
        ).astype(out_dtype)

    compute.__name__ = f"{plan.method}_merge"
    return lazy_map(
        compute,
        *inputs,
        shape=leaves[0].shape,
        dtype=out_dtype,
        elementwise=plan.method in ("linear", "task_arithmetic"),
    )


def _seed(path: str, params: dict[str, Any]) -> int:
    digest = hashlib.sha256(f"{params.get('seed', 0)}:{path}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


Kernel = Callable[[list[np.ndarray], np.ndarray | None], np.ndarray]


def _linear(params: dict[str, Any], weights: list[float], _: int) -> Kernel:
    if params["normalize"]:
        total = sum(weights)
        if total == 0:
            raise MergeError(
                "linear merge: the weights sum to 0 and cannot be normalized; pass normalize=False."
            )
        weights = [w / total for w in weights]

    def kernel(xs: list[np.ndarray], _: np.ndarray | None) -> np.ndarray:
        total = xs[0] * weights[0]
        for w, x in zip(weights[1:], xs[1:], strict=True):
            total += w * x
        return total

    return kernel


def _slerp(params: dict[str, Any], _: list[float], __: int) -> Kernel:
    t, epsilon = float(params["t"]), float(params["epsilon"])

    def kernel(xs: list[np.ndarray], _: np.ndarray | None) -> np.ndarray:
        a, b = xs
        norm_a, norm_b = np.linalg.norm(a), np.linalg.norm(b)
        if norm_a == 0 or norm_b == 0:
            return (1 - t) * a + t * b
        cosine = float(np.clip(np.vdot(a, b) / (norm_a * norm_b), -1.0, 1.0))
        if abs(cosine) > 1 - epsilon:
            return (1 - t) * a + t * b
        theta = np.arccos(cosine)
        return (np.sin((1 - t) * theta) * a + np.sin(t * theta) * b) / np.sin(theta)

    return kernel


def _task_arithmetic(params: dict[str, Any], weights: list[float], _: int) -> Kernel:
    scale = float(params["scale"])

    def kernel(xs: list[np.ndarray], base: np.ndarray | None) -> np.ndarray:
        return base + scale * sum(w * (x - base) for w, x in zip(weights, xs, strict=True))

    return kernel


def trim(vector: np.ndarray, density: float) -> np.ndarray:
    """`vector` with all but its `density` fraction of largest magnitudes set to 0."""
    keep = int(np.ceil(density * vector.size))
    if keep >= vector.size:
        return vector
    if keep == 0:
        return np.zeros_like(vector)
    magnitudes = np.abs(vector).reshape(-1)
    threshold = np.partition(magnitudes, vector.size - keep)[vector.size - keep]
    return np.where(np.abs(vector) >= threshold, vector, 0)


def _ties(params: dict[str, Any], weights: list[float], _: int) -> Kernel:
    density, scale = float(params["density"]), float(params["scale"])
    if not 0 < density <= 1:
        raise MergeError(f"ties: density must be in (0, 1]; got {density}.")

    def kernel(xs: list[np.ndarray], base: np.ndarray | None) -> np.ndarray:
        tasks = np.stack([w * trim(x - base, density) for w, x in zip(weights, xs, strict=True)])
        sign = np.sign(tasks.sum(axis=0))
        agree = (np.sign(tasks) == sign) & (tasks != 0)
        count = agree.sum(axis=0)
        merged = np.where(count > 0, (tasks * agree).sum(axis=0) / np.maximum(count, 1), 0)
        return base + scale * merged

    return kernel


def _dare(params: dict[str, Any], weights: list[float], seed: int) -> Kernel:
    drop, scale = float(params["drop"]), float(params["scale"])
    if not 0 <= drop < 1:
        raise MergeError(f"dare: drop must be in [0, 1); got {drop}.")

    def kernel(xs: list[np.ndarray], base: np.ndarray | None) -> np.ndarray:
        total = np.zeros_like(base)
        for index, (w, x) in enumerate(zip(weights, xs, strict=True)):
            keep = np.random.default_rng([seed, index]).random(x.shape) >= drop
            total = total + w * np.where(keep, (x - base) / (1 - drop), 0)
        return base + scale * total

    return kernel


_KERNELS: dict[str, Callable[[dict[str, Any], list[float], int], Kernel]] = {
    "linear": _linear,
    "slerp": _slerp,
    "task_arithmetic": _task_arithmetic,
    "ties": _ties,
    "dare": _dare,
}


def load_merge_config(path: str) -> dict[str, Any]:
    """Reads a merge config (YAML or TOML) into `merge`'s arguments plus ``output`` options.

    Example config::

        method: ties
        models: [finetuned_a, finetuned_b]
        base: base_model
        weights: [0.6, 0.4]
        params: {density: 0.3}
        per_leaf:
          'params/embed.*': {take: 0}
        dtype: bfloat16
    """
    from pathlib import Path

    file = Path(path)
    if not file.is_file():
        raise MergeError(f"Merge config {str(file)!r} does not exist.")
    text = file.read_text()
    try:
        if file.suffix.lower() == ".toml":
            import tomllib

            config = tomllib.loads(text)
        else:
            import yaml

            config = yaml.safe_load(text)
    except Exception as error:  # yaml and tomllib raise their own kinds
        raise MergeError(f"Merge config {str(file)!r} cannot be parsed: {error}") from error
    if not isinstance(config, dict):
        raise MergeError(f"Merge config {str(file)!r} must be a mapping with method: and models:.")
    allowed = {
        "method",
        "models",
        "base",
        "weights",
        "params",
        "per_leaf",
        "missing",
        "compute_dtype",
        "dtype",
    }
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise MergeError(
            f"Merge config {str(file)!r}: unknown key {unknown[0]!r}. Keys: {', '.join(sorted(allowed))}."
        )
    for required in ("method", "models"):
        if required not in config:
            raise MergeError(f"Merge config {str(file)!r} needs {required}:.")
    if not isinstance(config["models"], list) or not config["models"]:
        raise MergeError(f"Merge config {str(file)!r}: models: must be a list of checkpoint paths.")
    folder = file.parent

    def resolve(entry: str) -> str:
        from ._location import is_remote

        if is_remote(entry):
            return entry
        candidate = Path(entry)
        return str(
            candidate if candidate.is_absolute() or candidate.exists() else folder / candidate
        )

    config["models"] = [resolve(entry) for entry in config["models"]]
    if config.get("base") is not None:
        config["base"] = resolve(config["base"])
    return config
