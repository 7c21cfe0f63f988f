"""A jaxpr rebuilt from lazy nodes: what ``jnp`` code on LazyArrays becomes.

`lazy_eval` walks a jaxpr (what ``jax.make_jaxpr`` records of a user function) with
LazyArrays as its inputs. Each primitive becomes the lazy operation that reads the least:

- structural primitives (reshape, transpose, slice, concatenate, stack, split, rev,
  squeeze, broadcast_in_dim, convert_element_type) become suture's own views, so a
  selection still reaches the source as a narrow read;
- elementwise primitives (``tanh``, ``add``, ``select_n`` ...), ``dot_general`` (matmul,
  einsum), reductions and cumulative sums become `ComputeNode`s: each input axis follows
  an output axis or is read whole, so blocks of rows compute from rows of their inputs;
- calls (``jit``, ``custom_jvp_call`` of ``jax.nn`` functions) are walked inside;
- any other primitive (``gather``, ``sort`` ...) reads its inputs whole when read.

A primitive whose inputs are all constants is evaluated at once (``iota``, ``jnp.zeros``).
Each lazy primitive is computed with jax itself (``primitive.bind``), so the values are
exactly what the same ``jnp`` code gives on jax arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .array import LazyArray, as_lazy, common_path
from .combine import concatenate, stack
from .compute import BroadcastNode, ComputeNode

ELEMENTWISE = frozenset(
    [
        "neg",
        "sign",
        "floor",
        "ceil",
        "round",
        "is_finite",
        "exp",
        "exp2",
        "log",
        "log1p",
        "expm1",
        "tanh",
        "logistic",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "asinh",
        "acosh",
        "atanh",
        "sqrt",
        "rsqrt",
        "cbrt",
        "abs",
        "not",
        "imag",
        "real",
        "conj",
        "population_count",
        "clz",
        "erf",
        "erfc",
        "erf_inv",
        "lgamma",
        "digamma",
        "bessel_i0e",
        "bessel_i1e",
        "integer_pow",
        "reduce_precision",
        "square",
        "stop_gradient",
        "copy",
        "copy_p",
        "add",
        "sub",
        "mul",
        "div",
        "rem",
        "pow",
        "max",
        "min",
        "atan2",
        "nextafter",
        "and",
        "or",
        "xor",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "shift_left",
        "shift_right_arithmetic",
        "shift_right_logical",
        "complex",
        "igamma",
        "igammac",
        "polygamma",
        "zeta",
        "select_n",
        "clamp",
        "add_any",
        "convert_element_type",
    ]
)
REDUCTIONS = frozenset(
    [
        "reduce_sum",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "reduce_and",
        "reduce_or",
        "reduce_xor",
        "argmax",
        "argmin",
    ]
)
CUMULATIVE = frozenset(["cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"])
CALLS = frozenset(
    [
        "jit",
        "pjit",
        "closed_call",
        "core_call",
        "custom_jvp_call",
        "custom_vjp_call",
        "custom_vjp_call_jaxpr",
        "remat",
        "checkpoint",
        "custom_lin",
    ]
)
IDENTITIES = frozenset(["sharding_constraint", "optimization_barrier"])


def lazy_eval(closed: Any, inputs: Sequence[LazyArray]) -> list[Any]:
    """The outputs of `closed` (a ClosedJaxpr) for these inputs, as LazyArrays or constants."""
    return _eval(closed.jaxpr, [np.asarray(const) for const in closed.consts], list(inputs))


def _eval(jaxpr: Any, consts: list[Any], args: list[Any]) -> list[Any]:
    from jax.extend.core import Literal  # heavy: loaded on first use, not at import

    env: dict[Any, Any] = {}

    def read(var: Any) -> Any:
        return np.asarray(var.val) if isinstance(var, Literal) else env[var]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        values = [read(var) for var in eqn.invars]
        results = _apply(eqn, values)
        for var, value in zip(eqn.outvars, results, strict=True):
            env[var] = value
    return [read(var) for var in jaxpr.outvars]


def _apply(eqn: Any, values: list[Any]) -> list[Any]:
    primitive, params = eqn.primitive, eqn.params
    name = primitive.name
    if not any(isinstance(value, LazyArray) for value in values):
        results = primitive.bind(*values, **primitive.get_bind_params(params))
        results = results if primitive.multiple_results else [results]
        return [np.asarray(result) for result in results]
    if name in CALLS:
        inner = params.get("jaxpr", params.get("call_jaxpr", params.get("fun_jaxpr")))
        if inner is not None:
            if hasattr(inner, "consts"):
                return _eval(inner.jaxpr, [np.asarray(c) for c in inner.consts], values)
            return _eval(inner, [], values)
    avals = [var.aval for var in eqn.outvars]
    built = _structural(name, params, values, avals)
    if built is None:
        built = [_computed(eqn, values, avals, index) for index in range(len(avals))]
    return [_as_declared(value, aval) for value, aval in zip(built, avals, strict=True)]


def _as_declared(value: Any, aval: Any) -> Any:
    if isinstance(value, LazyArray) and value.dtype != np.dtype(aval.dtype):
        return value.astype(aval.dtype)
    return value


def _structural(name: str, params: dict, values: list[Any], avals: list[Any]) -> list | None:
    """The primitive as suture views, or None when it is computed instead."""
    first = as_lazy(values[0]) if values else None
    shape = tuple(avals[0].shape)
    if name in IDENTITIES:
        return [first]
    if name == "convert_element_type" and len(values) == 1:
        return [first.astype(params["new_dtype"])]
    if name == "transpose":
        return [first.transpose(tuple(params["permutation"]))]
    if name == "squeeze" or (name == "reshape" and params.get("dimensions") is None):
        return [first.reshape(shape)]
    if name == "broadcast_in_dim":
        axes = tuple(params["broadcast_dimensions"])
        if first.shape == shape and axes == tuple(range(len(shape))):
            return [first]
        node = BroadcastNode(first.node, shape, axes)
        return [LazyArray(node, first.path)]
    if name == "concatenate":
        return [concatenate([as_lazy(v) for v in values], axis=params["dimension"])]
    if name == "stack":
        return [stack([as_lazy(v) for v in values], axis=params["axis"])]
    if name == "slice":
        strides = params.get("strides") or (1,) * first.ndim
        index = tuple(
            slice(start, stop, step)
            for start, stop, step in zip(
                params["start_indices"], params["limit_indices"], strides, strict=True
            )
        )
        return [first[index]]
    if name == "rev":
        reversed_axes = set(params["dimensions"])
        return [
            first[
                tuple(slice(None, None, -1 if a in reversed_axes else 1) for a in range(first.ndim))
            ]
        ]
    if name == "gather" and not isinstance(values[1], LazyArray):
        taken = _take_rows(first, np.asarray(values[1]), params, shape)
        return None if taken is None else [taken]
    if name == "split":
        axis, start, parts = params["axis"], 0, []
        for size in params["sizes"]:
            index = (slice(None),) * axis + (slice(start, start + int(size)),)
            parts.append(first[index])
            start += int(size)
        return parts
    return None


def _take_rows(
    array: LazyArray, indices: np.ndarray, params: dict, shape: tuple[int, ...]
) -> LazyArray | None:
    """A gather of constant indices along one axis (``jnp.take``, ``w[idx]``) as a view.

    Only the taken elements are read. Other gathers return None (computed whole).
    """
    numbers = params["dimension_numbers"]
    if (
        len(numbers.start_index_map) != 1
        or tuple(numbers.collapsed_slice_dims) != tuple(numbers.start_index_map)
        or numbers.operand_batching_dims
        or indices.ndim != 2
        or indices.shape[-1] != 1
    ):
        return None
    axis = numbers.start_index_map[0]
    expected_sizes = tuple(1 if a == axis else n for a, n in enumerate(array.shape))
    batch_positions = [p for p in range(len(shape)) if p not in numbers.offset_dims]
    positions = indices[:, 0]
    if (
        tuple(params["slice_sizes"]) != expected_sizes
        or batch_positions != [axis]
        or positions.size == 0
        or positions.min() < 0
        or positions.max() >= array.shape[axis]
    ):
        return None
    taken = array[(slice(None),) * axis + (positions.astype(np.int64),)]
    return taken if taken.shape == shape else None


def _computed(eqn: Any, values: list[Any], avals: list[Any], index: int) -> LazyArray:
    """Output `index` of the primitive as a `ComputeNode` (see `_axis_maps`)."""
    primitive, params = eqn.primitive, eqn.params
    arrays = [as_lazy(value) for value in values]
    aval = avals[index]
    shape = tuple(aval.shape)
    axis_maps = _axis_maps(primitive.name, params, arrays, shape)
    bind_params = primitive.get_bind_params(params)

    def compute(*inputs: np.ndarray) -> np.ndarray:
        results = primitive.bind(*inputs, **bind_params)
        return np.asarray(results[index] if primitive.multiple_results else results)

    label = "matmul" if primitive.name == "dot_general" else primitive.name
    label = label if len(avals) == 1 else f"{label}[{index}]"
    node = ComputeNode(compute, [a.node for a in arrays], axis_maps, shape, aval.dtype, label)
    return LazyArray(node, common_path(arrays))


def _axis_maps(
    name: str, params: dict, arrays: list[LazyArray], shape: tuple[int, ...]
) -> list[list[int | None]]:
    """For each input axis, the output axis it follows (None: read whole)."""
    if name in ELEMENTWISE:
        rank = len(shape)
        return [
            list(range(rank)) if array.ndim == rank else [None] * array.ndim for array in arrays
        ]
    if name == "dot_general":
        (left_contract, right_contract), (left_batch, right_batch) = params["dimension_numbers"]
        left, right = arrays
        left_free = [a for a in range(left.ndim) if a not in left_contract and a not in left_batch]
        right_free = [
            a for a in range(right.ndim) if a not in right_contract and a not in right_batch
        ]
        left_map: list[int | None] = [None] * left.ndim
        right_map: list[int | None] = [None] * right.ndim
        for out, (a, b) in enumerate(zip(left_batch, right_batch, strict=True)):
            left_map[a], right_map[b] = out, out
        offset = len(left_batch)
        for out, axis in enumerate(left_free, offset):
            left_map[axis] = out
        for out, axis in enumerate(right_free, offset + len(left_free)):
            right_map[axis] = out
        return [left_map, right_map]
    if name in REDUCTIONS:
        reduced = set(params["axes"])
        return [_kept_axes(arrays[0].ndim, reduced)] + [[None] * a.ndim for a in arrays[1:]]
    if name in CUMULATIVE:
        axis = params["axis"]
        return [[None if a == axis else a for a in range(arrays[0].ndim)]]
    if name == "pad":
        config = params["padding_config"]
        kept = [a if tuple(config[a]) == (0, 0, 0) else None for a in range(arrays[0].ndim)]
        return [kept, []]
    return [[None] * array.ndim for array in arrays]


def _kept_axes(ndim: int, reduced: set[int]) -> list[int | None]:
    kept: list[int | None] = []
    out = 0
    for axis in range(ndim):
        if axis in reduced:
            kept.append(None)
        else:
            kept.append(out)
            out += 1
    return kept
