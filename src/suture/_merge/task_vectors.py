"""Task-vector merges: task arithmetic, TIES, DARE, Model Breadcrumbs and DELLA, as mergekit.

Every method here works on task vectors ``t_i = x_i - b`` (``b`` the base model's leaf):

1. sparsify each ``t_i`` (per model ``density``; see `sparsify`),
2. weight it: ``d_i = w_i * t_i``,
3. with sign consensus (TIES and the ``*_ties`` methods, DELLA): keep in each element only
   the ``d_i`` whose sign agrees with the sign of ``sum_i d_i`` (a zero sum elects ``+``,
   as mergekit; ``sign_tie="drop"`` leaves such elements at the base instead),
4. ``merged = sum_i d_i`` (over the kept ones); with ``normalize`` divide by the sum of the
   weights taking part in that element (by ``sum_i w_i`` without consensus),
5. ``b + scale * merged`` (``scale`` is mergekit's ``lambda``).

Example (TIES with density 1 of a model with itself returns the model):
    >>> import numpy as np
    >>> kernel = task_kernel("ties", {**TASK_DEFAULTS["ties"], "density": 1.0})
    >>> a, base = np.array([1.0, -2.0]), np.zeros(2)
    >>> kernel(MergeInputs([a, a], base, [0.5, 0.5], [{}, {}], "w", 0)).tolist()
    [1.0, -2.0]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import MergeError as MergeError


@dataclass
class MergeInputs:
    """One leaf's inputs to a merge kernel (numpy arrays in the work dtype)."""

    models: list[np.ndarray]
    base: np.ndarray | None
    weights: list[float]
    model_params: list[dict[str, Any]]
    path: str
    seed: int


Kernel = Callable[[MergeInputs], np.ndarray]

RESCALES = ("l1", "l2", "linf", "inverse")
_COMMON = {"normalize": False, "rescale": False, "scale": 1.0, "sign_tie": "positive", "seed": 0}
# method: (sparsification, sign consensus, parameter defaults)
_TASK_METHODS: dict[str, tuple[str | None, bool, dict[str, Any]]] = {
    "task_arithmetic": (None, False, {}),
    "ties": ("magnitude", True, {"normalize": True, "density": 0.2}),
    "dare": ("random", False, {"rescale": "inverse", "drop": 0.9}),
    "dare_ties": ("random", True, {"rescale": "l1", "density": 1.0}),
    "dare_linear": ("random", False, {"rescale": "l1", "density": 1.0}),
    "breadcrumbs": ("outliers", False, {"density": 1.0, "gamma": 0.01}),
    "breadcrumbs_ties": ("outliers", True, {"density": 1.0, "gamma": 0.01}),
    "della": ("della", True, {"normalize": True, "rescale": "l1", "density": 1.0, "epsilon": 0.15}),
    "della_linear": ("della", False, {"rescale": "l1", "density": 1.0, "epsilon": 0.15}),
}
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    name: {**_COMMON, **extra} for name, (_, _, extra) in _TASK_METHODS.items()
}
# parameters that may differ per model (mergekit's tensor parameters)
TASK_MODEL_PARAMS = ("density", "gamma", "epsilon", "drop")


def task_kernel(method: str, params: dict[str, Any]) -> Kernel:
    """The kernel of task-vector method `method` with global parameters `params`."""
    sparsification, consensus, _ = _TASK_METHODS[method]
    normalize, scale = bool(params["normalize"]), float(params["scale"])
    rescale = _rescale_norm(params["rescale"])

    def kernel(inputs: MergeInputs) -> np.ndarray:
        base = inputs.base
        assert base is not None
        deltas = []
        for index, (model, own) in enumerate(zip(inputs.models, inputs.model_params, strict=True)):
            settings = {**params, **own}
            if "drop" in settings and method == "dare":
                settings["density"] = 1.0 - float(settings["drop"])
            rng = np.random.default_rng([inputs.seed, index])
            deltas.append(
                sparsify(model - base, sparsification, settings, rescale, rng, inputs.path)
            )
        weights = np.asarray(inputs.weights, dtype=base.dtype).reshape((-1,) + (1,) * base.ndim)
        weighted = np.stack(deltas) * weights
        if consensus:
            agree = consensus_mask(weighted, params["sign_tie"])
            merged = (weighted * agree).sum(axis=0)
            divisor = (weights * agree).sum(axis=0)
            divisor = np.where(divisor == 0, 1, divisor).astype(base.dtype)
        else:
            merged = weighted.sum(axis=0)
            divisor = weights.sum()
            divisor = divisor if abs(divisor) >= 1e-8 else 1
        if normalize:
            merged = merged / divisor
        return base + scale * merged

    return kernel


def consensus_mask(weighted: np.ndarray, sign_tie: str = "positive") -> np.ndarray:
    """Where each model's weighted task vector agrees with the elected sign (TIES' step 2).

    The elected sign is that of the sum over models; ``sign_tie`` decides a zero sum:
    ``"positive"`` (mergekit) elects ``+``, ``"drop"`` keeps no model there.
    """
    total = weighted.sum(axis=0)
    positive = total >= 0 if sign_tie == "positive" else total > 0
    agree = np.where(positive, weighted > 0, weighted < 0)
    if sign_tie != "positive":
        agree &= total != 0
    return agree


def sparsify(
    delta: np.ndarray,
    kind: str | None,
    settings: dict[str, Any],
    rescale: str | None,
    rng: np.random.Generator,
    path: str,
) -> np.ndarray:
    """`delta` with elements dropped as method `kind` does, rescaled as `rescale` says.

    - ``magnitude`` (TIES): keep the ``max(1, int(density * n))`` largest magnitudes.
    - ``random`` (DARE): keep each element with probability ``density``.
    - ``outliers`` (Model Breadcrumbs): drop the ``int(gamma * n)`` largest magnitudes and
      the smallest, keeping ``int(density * n)``.
    - ``della`` (DELLA's MagPrune): keep with probability ``density - epsilon`` for the
      smallest magnitude of each row up to ``density + epsilon`` for the largest.
    """
    density = float(settings.get("density", 1.0))
    if kind is None or density >= 1:
        return delta
    if kind == "random":
        return _rescaled(delta, rng.random(delta.shape) < density, rescale, density)
    if kind == "della":
        return _della(delta, density, float(settings["epsilon"]), rescale, rng, path)
    size = delta.size
    keep = int(density * size)
    magnitudes = np.abs(delta).reshape(-1)
    if kind == "magnitude":
        if density <= 0 or size == 0:
            return np.zeros_like(delta)
        keep = max(1, keep)  # as mergekit: a positive density keeps at least one element
        return _rescaled(delta, _top(magnitudes, keep).reshape(delta.shape), rescale, density)
    order = np.argsort(magnitudes, kind="stable")  # ascending magnitude
    top = int(float(settings["gamma"]) * size)
    bottom = size - keep - top
    if bottom < 0:
        top, bottom = top + bottom, 0
    chosen = order[bottom : size - top]
    mask = np.zeros(size, dtype=bool)
    mask[chosen] = True
    return _rescaled(delta, mask.reshape(delta.shape), rescale, density)


def _top(magnitudes: np.ndarray, keep: int) -> np.ndarray:
    """A mask of the `keep` largest of `magnitudes` (flat); equal ones at the cut by position."""
    size = magnitudes.size
    threshold = np.partition(magnitudes, size - keep)[size - keep]
    mask = magnitudes > threshold
    missing = keep - int(np.count_nonzero(mask))
    if missing:
        mask[np.flatnonzero(magnitudes == threshold)[:missing]] = True
    return mask


def _della(
    delta: np.ndarray,
    density: float,
    epsilon: float,
    rescale: str | None,
    rng: np.random.Generator,
    path: str,
) -> np.ndarray:
    if density <= 0:
        return np.zeros_like(delta)
    if not (density - epsilon > 0 and density + epsilon < 1):
        raise MergeError(
            f"Leaf {path!r}: DELLA needs density - epsilon and density + epsilon within (0, 1); "
            f"got density {density}, epsilon {epsilon}. Lower epsilon."
        )
    rows = delta.reshape(1, -1) if delta.ndim < 2 else delta
    ranks = np.argsort(np.argsort(np.abs(rows), axis=1, kind="stable"), axis=1, kind="stable")
    width = rows.shape[1]
    normalized = ranks / (width - 1) if width > 1 else np.zeros(rows.shape)
    probability = ((density - epsilon) + normalized * 2 * epsilon).reshape(delta.shape)
    return _rescaled(delta, rng.random(delta.shape) < probability, rescale, probability)


def _rescaled(
    delta: np.ndarray, mask: np.ndarray, rescale: str | None, probability: float | np.ndarray
) -> np.ndarray:
    masked = delta * mask
    if rescale is None:
        return masked
    if rescale == "inverse":
        return (masked / probability).astype(delta.dtype)
    before, after = (_norm(array, rescale) for array in (delta, masked))
    if before < 1e-7 or after < 1e-7:
        return masked
    return masked * (before / after)


def _norm(array: np.ndarray, kind: str) -> float:
    if kind == "l1":
        return float(np.abs(array).sum())
    if kind == "l2":
        return float(np.linalg.norm(array.reshape(-1)))
    return float(np.abs(array).max(initial=0))


def _rescale_norm(value: Any) -> str | None:
    if value is True:
        return "l1"
    if value is False or value is None:
        return None
    return str(value)
