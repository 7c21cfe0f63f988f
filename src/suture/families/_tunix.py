"""What Tunix's `CheckpointManager` saves, made ready for a ``FAMILY:tunix`` recipe.

Tunix writes ``<root>/<step>/model_params``: an Orbax tree of ``nnx.state(model)``, each
variable wrapped as ``{'value': ...}`` and the layers keyed ``'0'``, ``'1'``. A model
fine-tuned with LoRA (qwix) holds, beside a weight ``w``, its factors ``w_lora_a`` and
``w_lora_b``; `merged_lora` folds them in as Tunix's own merge does,
``w + (a @ b) * (alpha / rank)``, lazily, so an export streams.

Example:
    >>> import numpy as np
    >>> tree = {"q": {"w": {"value": np.ones((2, 2), np.float32)},
    ...               "w_lora_a": {"value": np.ones((2, 1), np.float32)},
    ...               "w_lora_b": {"value": np.ones((1, 2), np.float32)}}}
    >>> merged_lora(tree, lora_alpha=2.0)["q/w"].read().tolist()
    [[3.0, 3.0], [3.0, 3.0]]
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from .._errors import ArgumentError, ShapeMismatchError
from .._lazy.array import LazyArray, as_lazy
from .._location import location_of
from .._paths import flatten

ITEM = "model_params"  # the CheckpointManager item that holds the model
LORA_A, LORA_B = "_lora_a", "_lora_b"


def model_params(source: str | os.PathLike) -> str | os.PathLike:
    """The ``model_params`` item of a Tunix checkpoint root (its latest step) or step;
    any other source as it is."""
    place = location_of(source)
    if not place.is_dir():
        return source
    if ITEM in place.subfolders():
        return str(place / ITEM)
    steps = [name for name in place.subfolders() if name.isdigit()]
    with_params = [name for name in steps if ITEM in (place / name).subfolders()]
    if with_params:
        return str(place / max(with_params, key=int) / ITEM)
    return source


def checked_alpha(lora_alpha: float) -> float:
    """`lora_alpha` if it is a finite number; NaN or infinity would scale every delta to NaN.

    Example:
        >>> checked_alpha(16)
        16.0
    """
    import math

    if isinstance(lora_alpha, bool) or not math.isfinite(float(lora_alpha)):
        raise ArgumentError(
            f"lora_alpha (--lora-alpha) is {lora_alpha!r}; expected a finite number, the "
            f"alpha of the qwix LoraProvider the model was trained with (16, 32, ...)."
        )
    return float(lora_alpha)


def merged_lora(
    tree: Any, lora_alpha: float | None = None, base: Callable[[], Any] | None = None
) -> dict[str, Any]:
    """The flat tree with ``/value`` wrappers dropped and LoRA factors merged into their weights.

    Tunix's trainer saves only the adapters of a LoRA model (``save_only_lora_params``);
    `base` then gives the base model's tree (the original HF folder through the recipe), read
    only for the leaves the checkpoint lacks.

    Raises:
        ArgumentError: the tree has LoRA factors and no `lora_alpha` was given (a checkpoint
            does not record it), or a weight has only one of its two factors.
        ShapeMismatchError: factors that do not multiply to their weight's shape.
    """
    flat = {path.removesuffix("/value"): leaf for path, leaf in flatten(tree).items()}
    factors = sorted(path for path in flat if path.endswith(LORA_A))
    stray = [p for p in flat if p.endswith(LORA_B) and p[: -len(LORA_B)] + LORA_A not in flat]
    if stray or any(path[: -len(LORA_A)] + LORA_B not in flat for path in factors):
        lone = (
            stray[0]
            if stray
            else next(p for p in factors if p[: -len(LORA_A)] + LORA_B not in flat)
        )
        raise ArgumentError(
            f"LoRA factor {lone!r} has no partner ({LORA_A} and {LORA_B} come in pairs); the "
            f"checkpoint is incomplete. Export the checkpoint Tunix saved whole."
        )
    if not factors:
        return flat
    if base is not None and any(path[: -len(LORA_A)] not in flat for path in factors):
        for path, leaf in flatten(base()).items():
            flat.setdefault(path, leaf)
    if lora_alpha is None:
        raise ArgumentError(
            f"The checkpoint holds {len(factors)} LoRA adapter(s) ({factors[0]!r} ...) and a "
            f"checkpoint does not record LoRA's alpha. Pass it (--lora-alpha, lora_alpha= in "
            f"Python): the alpha of the qwix LoraProvider the model was trained with."
        )
    checked_alpha(lora_alpha)
    for path in factors:
        weight = path[: -len(LORA_A)]
        if weight not in flat:
            raise ArgumentError(
                f"LoRA factor {path!r} has no weight {weight!r} to merge into: the checkpoint "
                f"holds only the adapters (Tunix's trainer saves only them). Pass the base "
                f"model's Hugging Face folder (--like, like= in Python) to merge them into."
            )
        flat[weight] = _merged(
            weight, flat[weight], flat.pop(path), flat.pop(weight + LORA_B), lora_alpha
        )
    return flat


def _merged(name: str, w: Any, a: Any, b: Any, alpha: float) -> LazyArray:
    """``w + (a @ b) * (alpha / rank)`` in float32, as Tunix's safetensors_saver computes it."""
    w, a, b = (as_lazy(x, path=name) for x in (w, a, b))
    rank = a.shape[-1]
    if b.ndim < 1 or b.shape[0] != rank or tuple(a.shape[:-1]) + tuple(b.shape[1:]) != w.shape:
        raise ShapeMismatchError(
            f"LoRA of {name!r}: factors {a.shape} @ {b.shape} do not give the weight's shape "
            f"{w.shape}. The checkpoint's adapters do not belong to this weight."
        )
    a2 = a.reshape(math.prod(a.shape[:-1]), rank).astype(np.float32)
    b2 = b.reshape(rank, math.prod(b.shape[1:])).astype(np.float32)
    delta = ((a2 @ b2) * np.float32(alpha / rank)).reshape(w.shape).astype(w.dtype)
    return w + delta
