"""Merge kernels that are not task-vector sums: interpolations, spherical means, and the rest.

Each follows its paper and mergekit's parameters and defaults (see ``docs/merging.md``):

- ``linear``: ``sum(w_i x_i)``, divided by ``sum(w_i)`` when ``normalize``.
- ``slerp``: spherical interpolation from the first model (``t=0``) to the second (``t=1``);
  linear where the normalized dot product exceeds ``dot_threshold`` in magnitude.
- ``nuslerp``: slerp at ``t = w_1 / (w_0 + w_1)``, of the whole tensor (``flatten``) or row
  by row; with a base, of the task vectors.
- ``multislerp``: barycentric interpolation of any number of models on the hypersphere.
- ``karcher``: the Riemannian (Karcher) mean of the directions, scaled by the mean norm.
- ``model_stock``: ``t * mean(x_i) + (1 - t) * b`` with ``t`` from the angle between the
  fine-tuned models' task vectors.
- ``sce``: select (by variance across models), calculate (weights by energy), erase (signs).
- ``nearswap``: the base, taking the other model's value where the two are within ``t``.
- ``arcee_fusion``: the base plus the other model's differences where they matter most.
- ``passthrough``: the single model as it is, times an optional ``scale``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from .._errors import MergeError
from .task_vectors import Kernel, MergeInputs, consensus_mask


def linear_kernel(params: dict[str, Any]) -> Kernel:
    def kernel(inputs: MergeInputs) -> np.ndarray:
        weights = inputs.weights
        total = inputs.models[0] * weights[0]
        for weight, model in zip(weights[1:], inputs.models[1:], strict=True):
            total += weight * model
        if params["normalize"]:
            total = total / sum(weights)  # not 0: merge_leaf refuses that
        return total

    return kernel


def slerp(t: float, a: np.ndarray, b: np.ndarray, dot_threshold: float = 0.9995) -> np.ndarray:
    """Spherical interpolation of two tensors as whole vectors (mergekit's convention)."""
    unit_a, unit_b = (_unit(x, 1e-8) for x in (a, b))
    dot = float(np.sum(unit_a * unit_b))
    if abs(dot) > dot_threshold:
        return (1 - t) * a + t * b
    theta = math.acos(dot)
    sin_theta = math.sin(theta)
    return (math.sin(theta - theta * t) / sin_theta) * a + (math.sin(theta * t) / sin_theta) * b


def _unit(x: np.ndarray, eps: float) -> np.ndarray:
    norm = float(np.linalg.norm(x.reshape(-1)))
    return x / norm if norm > eps else x


def slerp_kernel(params: dict[str, Any]) -> Kernel:
    t, threshold = float(params["t"]), float(params["dot_threshold"])
    return lambda inputs: slerp(t, inputs.models[0], inputs.models[1], threshold)


def nuslerp_kernel(params: dict[str, Any]) -> Kernel:
    def kernel(inputs: MergeInputs) -> np.ndarray:
        w0, w1 = inputs.weights
        t = 0.5 if abs(w0 + w1) < 1e-6 else w1 / (w0 + w1)
        a, b = inputs.models
        if inputs.base is not None:
            a, b = a - inputs.base, b - inputs.base
        if params["flatten"]:
            result = _row_slerp(t, a.reshape(1, -1), b.reshape(1, -1)).reshape(a.shape)
        else:
            axis = 0 if params["row_wise"] else -1
            moved = [np.moveaxis(x, axis, -1) for x in (a, b)]
            result = np.moveaxis(_row_slerp(t, *moved), -1, axis)
        return result if inputs.base is None else inputs.base + result

    return kernel


def _row_slerp(t: float, a: np.ndarray, b: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """Slerp along the last axis, each row on its own; linear for (nearly) colinear rows."""

    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-7)

    cosine = np.clip(np.sum(unit(a) * unit(b), axis=-1, keepdims=True), -1, 1)
    theta = np.arccos(cosine)
    sin_theta = np.sin(theta)
    colinear = np.abs(sin_theta) < eps
    with np.errstate(divide="ignore", invalid="ignore"):
        spherical = (np.sin((1 - t) * theta) * a + np.sin(t * theta) * b) / sin_theta
    return np.where(colinear, (1 - t) * a + t * b, spherical)


def multislerp_kernel(params: dict[str, Any]) -> Kernel:
    eps = float(params["eps"])

    def kernel(inputs: MergeInputs) -> np.ndarray:
        if len(inputs.models) == 1:
            return inputs.models[0]
        stacked = np.stack(inputs.models)
        if inputs.base is not None:
            stacked = stacked - inputs.base
        flat = stacked.reshape(len(inputs.models), -1)
        weights = np.asarray(inputs.weights, dtype=flat.dtype)
        if params["normalize_weights"]:
            weights = weights / weights.sum()
        norms = np.linalg.norm(flat, axis=-1, keepdims=True)
        units = flat / (norms + eps)
        mean = (units * weights[:, None]).sum(0)
        mean_norm = float(np.linalg.norm(mean))
        if mean_norm < eps:
            if len(inputs.models) != 2:
                raise MergeError(
                    f"Leaf {inputs.path!r}: multislerp's weighted mean direction is zero "
                    f"(antipodal models with balancing weights); change the weights."
                )
            result = (flat[0] * weights[0] + flat[1] * weights[1]).reshape(stacked.shape[1:])
        else:
            mean = mean / mean_norm
            tangents = units - (units * mean).sum(-1, keepdims=True) * mean
            tangent = (tangents * weights[:, None]).sum(0)
            length = float(np.linalg.norm(tangent)) + eps
            direction = mean * math.cos(length) + tangent * (math.sin(length) / length)
            average_norm = float((norms[:, 0] * weights).sum())
            result = (direction * average_norm).reshape(stacked.shape[1:])
        return result if inputs.base is None else result + inputs.base

    return kernel


KARCHER_SECONDS = 600.0  # the most one leaf's Karcher mean may take


def karcher_kernel(params: dict[str, Any]) -> Kernel:
    max_iter, tol = int(params["max_iter"]), float(params["tol"])

    def kernel(inputs: MergeInputs) -> np.ndarray:
        models = inputs.models
        if len(models) == 1:
            return models[0]
        alphas = [1.0 / len(models)] * len(models)  # mergekit: equal weights
        norms = [float(np.linalg.norm(x.reshape(-1))) for x in models]
        units = [x / n if n else np.zeros_like(x) for x, n in zip(models, norms, strict=True)]
        valid = [i for i, n in enumerate(norms) if n > tol]
        if not valid:
            return np.zeros_like(models[0])
        total = sum(alphas[i] for i in valid)
        shares = [(alphas[i] / total, units[i].reshape(-1)) for i in valid]
        u = sum(a * unit for a, unit in shares)
        norm_u = float(np.linalg.norm(u))
        u = shares[0][1].copy() if norm_u < tol else u / norm_u
        deadline = time.monotonic() + KARCHER_SECONDS
        for iteration in range(max_iter):
            if time.monotonic() > deadline:
                raise MergeError(
                    f"Leaf {inputs.path!r}: karcher did not converge within "
                    f"{KARCHER_SECONDS:g} s ({iteration} of max_iter={max_iter} iterations, "
                    f"tol={tol:g}); each leaf gets that long. Raise tol, lower max_iter, or "
                    f"merge this leaf with another method (per_leaf)."
                )
            step = np.zeros_like(u)
            for a, unit in shares:
                dot = float(np.clip(np.dot(u, unit), -1.0, 1.0))
                theta = math.acos(dot)
                if theta >= tol:
                    step += a * (theta / math.sin(theta)) * (unit - dot * u)
            length = float(np.linalg.norm(step))
            if length < tol:
                break
            u = math.cos(length) * u + math.sin(length) * (step / length)
            norm_u = float(np.linalg.norm(u))
            if norm_u > tol:
                u = u / norm_u
        scale = sum(a * n for a, n in zip(alphas, norms, strict=True))
        return (scale * u).reshape(models[0].shape)

    return kernel


def model_stock_kernel(params: dict[str, Any]) -> Kernel:
    def kernel(inputs: MergeInputs) -> np.ndarray:
        base = inputs.base
        assert base is not None
        models = inputs.models
        if len(models) < 2:
            raise MergeError(
                f"Leaf {inputs.path!r}: model_stock needs at least two fine-tuned models "
                f"besides the base; got {len(models)}."
            )
        if params["filter_wise"]:
            rows = lambda x: x.reshape(1, -1) if x.ndim < 2 else x  # noqa: E731
        else:
            rows = lambda x: x.reshape(1, -1)  # noqa: E731
        offsets = [rows(x) - rows(base) for x in models]
        cosines = []
        for i, first in enumerate(offsets):
            for second in offsets[i + 1 :]:
                product = np.linalg.norm(first, axis=-1) * np.linalg.norm(second, axis=-1)
                cosine = (first * second).sum(axis=-1) / np.maximum(product, 1e-6)
                cosines.append(np.clip(cosine, -1, 1))
        cosine = np.mean(cosines, axis=0)[:, None]
        count = len(models)
        t = count * cosine / (1 + (count - 1) * cosine)
        average = sum(rows(x) for x in models) / count
        return (t * average + (1 - t) * rows(base)).reshape(base.shape)

    return kernel


def sce_kernel(params: dict[str, Any]) -> Kernel:
    select = float(params["select_topk"])

    def kernel(inputs: MergeInputs) -> np.ndarray:
        base = inputs.base
        assert base is not None
        tasks = np.stack([x - base for x in inputs.models])
        if select < 1:
            tasks = tasks * _sce_mask(tasks, select)[None]
        agree = consensus_mask(tasks, "positive")
        energy = np.mean(tasks.reshape(len(tasks), -1) ** 2, axis=1)
        total = float(energy.sum())
        weights = np.full(len(tasks), 1 / len(tasks)) if abs(total) < 1e-6 else energy / total
        weights = weights.astype(base.dtype).reshape((-1,) + (1,) * base.ndim)
        kept = weights * agree
        return base + (tasks * kept).sum(axis=0) / np.maximum(kept.sum(axis=0), 1e-6)

    return kernel


def _sce_mask(tasks: np.ndarray, density: float) -> np.ndarray:
    if density <= 0:
        return np.zeros(tasks.shape[1:], dtype=bool)
    variance = np.var(tasks, axis=0).reshape(-1)
    keep = int(np.count_nonzero(variance) * density)
    mask = np.zeros(variance.size, dtype=bool)
    if keep:
        mask[np.argpartition(np.abs(variance), variance.size - keep)[variance.size - keep :]] = True
    return mask.reshape(tasks.shape[1:])


def nearswap_kernel(params: dict[str, Any]) -> Kernel:
    t = float(params["t"])

    def kernel(inputs: MergeInputs) -> np.ndarray:
        base, other = inputs.base, inputs.models[0]
        assert base is not None
        weight = np.clip(t / np.maximum(np.abs(base - other), 1e-6), 0, 1)
        return weight * other + (1 - weight) * base

    return kernel


def arcee_fusion_kernel(_: dict[str, Any]) -> Kernel:
    def kernel(inputs: MergeInputs) -> np.ndarray:
        base, other = inputs.base, inputs.models[0]
        assert base is not None
        p, q = _softmax(other) + 1e-8, _softmax(base) + 1e-8
        divergence = np.sum(p * np.log(p / q), axis=-1, keepdims=True)
        importance = np.abs(other - base) * divergence
        ordered = np.sort(importance.reshape(-1))
        quantile = lambda q: ordered[int(q * (ordered.size - 1))]  # noqa: E731
        threshold = quantile(0.5) + 1.5 * (quantile(0.75) - quantile(0.25))
        return base + (other - base) * (importance >= threshold)

    return kernel


def _softmax(x: np.ndarray) -> np.ndarray:
    shifted = np.exp(x - x.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def passthrough_kernel(_: dict[str, Any]) -> Kernel:
    def kernel(inputs: MergeInputs) -> np.ndarray:
        scale = inputs.model_params[0].get("scale")
        model = inputs.models[0]
        return model if scale is None else model * float(scale)

    return kernel
