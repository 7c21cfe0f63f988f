"""Matrix products on LazyArrays: ``a @ b``, ``np.matmul``, ``np.einsum``, ``suture.einsum``.

A product is a `ComputeNode`: each output axis is followed by the input axes with the same
einsum label, so a block of output rows reads the matching rows of the inputs that carry
the row label and the rest of the others. ``(w + a @ b)[rows]`` reads ``w[rows]``,
``a[rows]`` and all of the (small) ``b``, which is how a LoRA merge streams in blocks.

Example:
    >>> import numpy as np, suture
    >>> a = suture.LazyArray.from_array(np.arange(6.0).reshape(3, 2))
    >>> b = suture.LazyArray.from_array(np.ones((2, 4)))
    >>> (a @ b)[1].read().tolist()
    [5.0, 5.0, 5.0, 5.0]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import ShapeMismatchError
from .array import LazyArray, as_lazy, common_path
from .compute import ComputeNode

_LOW_PRECISION_KINDS = ("V",)  # ml_dtypes floats (bfloat16, float8) have kind "V"


def einsum(subscripts: str, *operands: Any) -> LazyArray:
    """``np.einsum(subscripts, *operands)`` as a LazyArray, computed by blocks when read.

    Example:
        >>> import numpy as np, suture
        >>> x = suture.LazyArray.from_array(np.arange(4.0).reshape(2, 2))
        >>> suture.einsum("ij,kj->ik", x, x).read().tolist()
        [[1.0, 3.0], [3.0, 13.0]]
    """
    arrays = [as_lazy(operand) for operand in operands]
    inputs, output = _explicit(subscripts.replace(" ", ""), arrays)
    rank = _ellipsis_rank(arrays, inputs)
    labels = [_expanded(spec, array.ndim, rank) for spec, array in zip(inputs, arrays, strict=True)]
    out_labels = _expanded(output, rank + len(output.replace("...", "")), rank)
    sizes: dict[str, int] = {}
    for array, axes in zip(arrays, labels, strict=True):
        for label, length in zip(axes, array.shape, strict=True):
            known = sizes.get(label, 1)
            if length != 1 and known != 1 and length != known:
                raise ShapeMismatchError(
                    f"einsum {subscripts!r}: label {label!r} has length {known} in one operand "
                    f"and {length} in another (shapes {[a.shape for a in arrays]}). Slice or "
                    f"transpose the operands so that their shared axes agree."
                )
            sizes[label] = max(known, length)
    shape = tuple(sizes[label] for label in out_labels)
    dtype = np.result_type(*(array.dtype for array in arrays))
    work = np.dtype(np.float32) if _low_precision(dtype) else None
    expression = ",".join(inputs) + "->" + output

    def compute(*values: np.ndarray) -> np.ndarray:
        if work is not None:
            values = tuple(value.astype(work) for value in values)
        if expression == "ik,kj->ij":
            return chunked_matmul(*values)
        return np.einsum(expression, *values, optimize=True)

    axis_maps = [
        [out_labels.index(label) if label in out_labels else None for label in axes]
        for axes in labels
    ]
    node = ComputeNode(compute, [a.node for a in arrays], axis_maps, shape, dtype, "einsum")
    return LazyArray(node, common_path(arrays))


# OpenBLAS runs a product of m * n * k under about 2**20 in the calling thread, and a larger
# one on threads of its own: called from every writer thread at once, on a loaded machine,
# that was 10-30x slower than chunks of rows under the limit (a rank-16 block of 512 x 1024
# rows: 25 ms against 1 ms), and made a streamed LoRA merge slower than a whole-model one.
SMALL_PRODUCT = 1 << 18


def chunked_matmul(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """``left @ right`` (2-D) by chunks of rows small enough for BLAS to stay in this thread.

    Example:
        >>> chunked_matmul(np.ones((5, 2)), np.ones((2, 3))).tolist()[0]
        [2.0, 2.0, 2.0]
    """
    out = np.empty((left.shape[0], right.shape[1]), np.result_type(left, right))
    step = max(1, SMALL_PRODUCT // max(1, right.shape[0] * right.shape[1]))
    for start in range(0, left.shape[0], step):
        np.matmul(left[start : start + step], right, out=out[start : start + step])
    return out


def matmul(a: Any, b: Any) -> LazyArray:
    """``a @ b`` with numpy's rules (1-D operands, broadcast batch axes), lazily."""
    left, right = as_lazy(a), as_lazy(b)
    if left.ndim == 0 or right.ndim == 0:
        raise ShapeMismatchError(
            f"matmul needs arrays with at least one axis; got shapes {left.shape} and "
            f"{right.shape}. Use * to multiply by a scalar."
        )
    left_k = left.shape[-1]
    right_k = right.shape[-2] if right.ndim > 1 else right.shape[0]
    if left_k != right_k:
        raise ShapeMismatchError(
            f"Cannot multiply shapes {left.shape} @ {right.shape}: the last axis of the left "
            f"operand ({left_k}) must equal the "
            f"{'second-to-last' if right.ndim > 1 else 'only'} axis of the right ({right_k}). "
            f"Transpose one of them (x.T) or check which leaf you meant."
        )
    left_spec = "...ik" if left.ndim > 1 else "k"
    right_spec = "...kj" if right.ndim > 1 else "k"
    out = (
        ("..." if max(left.ndim, right.ndim) > 2 else "")
        + ("i" if left.ndim > 1 else "")
        + ("j" if right.ndim > 1 else "")
    )
    if left.ndim <= 2 and right.ndim <= 2:
        left_spec, right_spec = left_spec.replace("...", ""), right_spec.replace("...", "")
    result = einsum(f"{left_spec},{right_spec}->{out}", left, right)
    result.node.name = "matmul"
    return result


def _low_precision(dtype: np.dtype) -> bool:
    return dtype.kind in _LOW_PRECISION_KINDS or (dtype.kind == "f" and dtype.itemsize < 4)


def _explicit(subscripts: str, arrays: list[LazyArray]) -> tuple[list[str], str]:
    """The operand specs and the output spec, made explicit as numpy's implicit mode does."""
    given, arrow, output = subscripts.partition("->")
    inputs = given.split(",")
    if len(inputs) != len(arrays):
        raise ShapeMismatchError(
            f"einsum {subscripts!r} names {len(inputs)} operand(s) but {len(arrays)} were given."
        )
    for spec, array in zip(inputs, arrays, strict=True):
        explicit = len(spec.replace("...", ""))
        if explicit > array.ndim or ("..." not in spec and explicit != array.ndim):
            raise ShapeMismatchError(
                f"einsum {subscripts!r}: operand spec {spec!r} does not fit shape {array.shape}."
            )
    if not arrow:
        letters = "".join(inputs).replace(".", "")
        singles = sorted(label for label in set(letters) if letters.count(label) == 1)
        output = ("..." if "..." in given else "") + "".join(singles)
    return inputs, output


def _ellipsis_rank(arrays: list[LazyArray], inputs: list[str]) -> int:
    ranks = [
        array.ndim - len(spec.replace("...", ""))
        for spec, array in zip(inputs, arrays, strict=True)
        if "..." in spec
    ]
    return max(ranks, default=0)


def _expanded(spec: str, ndim: int, ellipsis_rank: int) -> list[str]:
    """One label per axis; the ellipsis's axes get labels ``...N``, aligned to the right."""
    if "..." not in spec:
        return list(spec)
    before, _, after = spec.partition("...")
    own = ndim - len(before) - len(after)
    broadcast = [f"...{ellipsis_rank - own + i}" for i in range(own)]
    return [*before, *broadcast, *after]
