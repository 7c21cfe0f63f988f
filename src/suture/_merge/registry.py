"""The merge methods suture knows, their parameters and defaults, and parameter checks."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from .._errors import PatternError
from .._patterns import compile_pattern
from . import methods as kernels
from .task_vectors import (
    RESCALES,
    TASK_DEFAULTS,
    TASK_MODEL_PARAMS,
    Kernel,
    MergeError,
    task_kernel,
)

REQUIRED = object()  # a parameter without a default
MAX_ITERATIONS = 1000  # the most iterations an iterative method (karcher) may be asked for


@dataclass(frozen=True)
class Method:
    """A merge method: its kernel factory, parameters (global and per model), and inputs."""

    name: str
    make_kernel: Callable[[dict[str, Any]], Kernel]
    params: dict[str, Any]
    model_params: dict[str, Any] = field(default_factory=dict)
    base: str = "none"  # "none", "optional" or "required"
    models: tuple[int, int | None] = (1, None)  # fewest and most models (besides the base)
    elementwise: bool = False  # output element i depends only on input elements i


def _task(name: str) -> Method:
    defaults = TASK_DEFAULTS[name]
    per_model = {key: defaults[key] for key in TASK_MODEL_PARAMS if key in defaults}
    if name != "dare":
        per_model.setdefault("density", 1.0)
    return Method(
        name,
        lambda params: task_kernel(name, params),
        {key: value for key, value in defaults.items() if key not in per_model},
        per_model,
        base="required",
        elementwise=name == "task_arithmetic",
    )


METHODS: dict[str, Method] = {
    "linear": Method("linear", kernels.linear_kernel, {"normalize": True}, elementwise=True),
    "slerp": Method(
        "slerp", kernels.slerp_kernel, {"t": 0.5, "dot_threshold": 0.9995}, models=(2, 2)
    ),
    "nuslerp": Method(
        "nuslerp",
        kernels.nuslerp_kernel,
        {"row_wise": False, "flatten": True},
        base="optional",
        models=(2, 2),
    ),
    "multislerp": Method(
        "multislerp",
        kernels.multislerp_kernel,
        {"normalize_weights": True, "eps": 1e-8},
        base="optional",
    ),
    "karcher": Method("karcher", kernels.karcher_kernel, {"max_iter": 10, "tol": 1e-5}),
    "model_stock": Method(
        "model_stock",
        kernels.model_stock_kernel,
        {"filter_wise": False},
        base="required",
        models=(2, None),
    ),
    "sce": Method("sce", kernels.sce_kernel, {"select_topk": 1.0}, base="required"),
    "nearswap": Method(
        "nearswap",
        kernels.nearswap_kernel,
        {"t": REQUIRED},
        base="required",
        models=(1, 1),
        elementwise=True,
    ),
    "arcee_fusion": Method(
        "arcee_fusion", kernels.arcee_fusion_kernel, {}, base="required", models=(1, 1)
    ),
    "passthrough": Method(
        "passthrough",
        kernels.passthrough_kernel,
        {},
        {"scale": None},
        models=(1, 1),
        elementwise=True,
    ),
    **{name: _task(name) for name in TASK_DEFAULTS},
}

_CHOICES: dict[str, tuple[Any, ...]] = {
    "sign_tie": ("positive", "drop"),
    "rescale": (True, False, *RESCALES),
}
_RANGES: dict[str, tuple[float, float, bool]] = {  # name: (low, high, high included)
    "density": (0.0, 1.0, True),
    "drop": (0.0, 1.0, False),
    "gamma": (0.0, 1.0, True),
    "epsilon": (0.0, 1.0, False),
    "select_topk": (0.0, 1.0, True),
    "max_iter": (1, MAX_ITERATIONS, True),  # karcher's; also checked first, with why
    "tol": (0.0, 1.0, True),
}


def get_method(name: Any) -> Method:
    if not isinstance(name, str) or name not in METHODS:
        raise MergeError(f"Unknown merge method {name!r}. Methods: {', '.join(METHODS)}.")
    return METHODS[name]


def check_params(method: Method, params: dict[str, Any], where: str = "") -> dict[str, Any]:
    """`params` (global or per model) checked against `method`'s, with the defaults filled in.

    Raises:
        MergeError: an unknown parameter, a required one missing, or a value of the wrong
            type, not finite, or out of its range.
    """
    allowed = {**method.params, **method.model_params}
    for name in params:
        if name not in allowed:
            raise MergeError(
                f"{where}{method.name} has no parameter {name!r}; its parameters are "
                f"{', '.join(allowed) or 'none'}."
            )
    checked = dict(params)
    for name, value in params.items():
        checked[name] = check_value(method.name, name, value, allowed[name], where)
    return checked


def with_defaults(method: Method, params: dict[str, Any], where: str = "") -> dict[str, Any]:
    """The global parameters of `method`: `params` over the defaults, each required one given."""
    merged = {**method.params, **method.model_params, **params}
    for name, value in merged.items():
        if value is REQUIRED:
            raise MergeError(f"{where}{method.name} needs the parameter {name!r}.")
    return merged


def check_value(method: str, name: str, value: Any, default: Any, where: str = "") -> Any:
    """`value` for parameter `name`, of the default's type, finite and within range."""
    label = f"{where}{method} parameter {name!r}"
    if name in _CHOICES:
        if not isinstance(value, (str, bool)) or value not in _CHOICES[name]:
            choices = ", ".join(repr(choice) for choice in _CHOICES[name])
            raise MergeError(f"{label} must be one of {choices}; got {value!r}.")
        return value
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise MergeError(f"{label} must be true or false; got {value!r}.")
        return value
    if name == "scale" and default is None and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise MergeError(f"{label} must be a number; got {value!r}.")
    if not math.isfinite(value):
        raise MergeError(f"{label} must be a finite number; got {value!r}.")
    if isinstance(default, int):
        if not float(value).is_integer():
            raise MergeError(f"{label} must be a whole number; got {value!r}.")
        value = int(value)
    else:
        value = float(value)
    if name == "max_iter" and value > MAX_ITERATIONS:
        raise MergeError(
            f"{label} is {value!r}; at most {MAX_ITERATIONS} iterations are allowed (each is a "
            f"pass over the leaf, and the mean converges in a few: the default is 10). Lower it, "
            f"or raise tol to stop sooner."
        )
    if name in _RANGES:
        low, high, closed = _RANGES[name]
        if not (low <= value <= high if closed else low <= value < high):
            bracket = "]" if closed else ")"
            raise MergeError(f"{label} must be in [{low:g}, {high:g}{bracket}; got {value!r}.")
    return value


def check_weight(value: Any, index: int, where: str = "") -> float:
    """One model's weight: a finite number (`check_magnitudes` checks it against the dtype
    a leaf is computed in)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise MergeError(
            f"{where}the weight of model {index} must be a finite number; got {value!r}."
        )
    return float(value)


# methods that divide by the sum of the weights, and the parameter that asks them to
DIVIDE_BY_SUM = {"linear": "normalize", "multislerp": "normalize_weights"}


def check_magnitudes(
    path: str,
    method: Method,
    params: dict[str, Any],
    weights: Sequence[float],
    model_params: Sequence[dict[str, Any]],
    work: np.dtype,
) -> None:
    """Refuses, before anything is read, weights and scales that make every merged value of
    leaf `path` inf or NaN in the dtype `work` it is computed in: a sum of weights the
    method divides by that is 0, or a weight (or their sum, or a ``scale``) beyond `work`'s
    largest value."""
    switch = DIVIDE_BY_SUM.get(method.name)
    if switch is not None and params.get(switch) and sum(weights) == 0:
        raise MergeError(
            f"Leaf {path!r}: {method.name} merge weights sum to 0 and cannot be normalized; "
            f"pass {switch}=False, or change the weights {list(weights)} (divided by their "
            f"sum, every value would be inf or NaN)."
        )
    largest = float(ml_dtypes.finfo(work).max)
    scales = [("scale", params.get("scale"))] + [
        (f"scale of model {i}", own.get("scale")) for i, own in enumerate(model_params)
    ]
    sizes = [(f"weight of model {i}", w) for i, w in enumerate(weights)]
    sizes += [("sum of the weights' magnitudes", sum(abs(w) for w in weights))]
    sizes += [(name, value) for name, value in scales if isinstance(value, (int, float))]
    for name, value in sizes:
        if abs(value) > largest:
            smaller = (
                "a smaller scale"
                if "scale" in name
                else "smaller weights (normalized, only their ratios matter)"
            )
            raise MergeError(
                f"Leaf {path!r}: the {method.name} merge's {name} is {value:g}, beyond the "
                f"largest {work.name} ({largest:g}) it is computed in: the merged values would "
                f"be inf. Use {smaller}, or compute_dtype='float64'."
            )


def compile_per_leaf(pattern: Any) -> Any:
    """A ``per_leaf`` key compiled like every user pattern: matched under a time bound."""
    if not isinstance(pattern, str) or not pattern:
        raise MergeError(f"per_leaf: a key must be a regex (text); got {pattern!r:.80}.")
    try:
        return compile_pattern(pattern, "per_leaf")
    except PatternError as error:
        if error.__cause__ is None:  # a valid regex refused for its size: says it all
            raise MergeError(str(error)) from None
        raise MergeError(
            f"per_leaf: {pattern!r} is not a valid regex ({error.__cause__})."
        ) from None
