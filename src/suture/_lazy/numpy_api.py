"""numpy functions called on LazyArrays (``np.stack``, ``np.einsum``, ``np.where`` ...).

numpy hands any function call that involves a LazyArray to ``LazyArray.__array_function__``.
The structural functions and products surgery code uses become lazy operations; any other
function reads its LazyArray arguments and runs as usual (inside `no_implicit_reads` it
signals instead, so that the caller can trace it).

Example:
    >>> import numpy as np, suture
    >>> x = suture.LazyArray.from_array(np.arange(6.0).reshape(2, 3), path="w")
    >>> np.swapaxes(np.stack([x, x]), 1, 2).shape
    (2, 3, 2)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .array import ImplicitReadError, LazyArray, as_lazy, elementwise, implicit_reads_forbidden
from .combine import concatenate, stack
from .products import einsum, matmul


def _stack(arrays: Any, axis: int = 0) -> LazyArray:
    return stack(list(arrays), axis=axis)


def _concatenate(arrays: Any, axis: int = 0) -> LazyArray:
    return concatenate(list(arrays), axis=axis)


def _einsum(subscripts: str, *operands: Any, optimize: Any = True) -> LazyArray:
    return einsum(subscripts, *operands)


def _matmul(a: Any, b: Any) -> LazyArray:
    return matmul(a, b)


def _where(condition: Any, x: Any, y: Any) -> LazyArray:
    return elementwise(np.where, condition, x, y, name="where")


def _moveaxis(a: Any, source: int, destination: int) -> LazyArray:
    array = as_lazy(a)
    order = [axis for axis in range(array.ndim) if axis != source % array.ndim]
    order.insert(destination % array.ndim, source % array.ndim)
    return array.transpose(order)


def _swapaxes(a: Any, axis1: int, axis2: int) -> LazyArray:
    array = as_lazy(a)
    order = list(range(array.ndim))
    first, second = axis1 % array.ndim, axis2 % array.ndim
    order[first], order[second] = order[second], order[first]
    return array.transpose(order)


def _expand_dims(a: Any, axis: int) -> LazyArray:
    array = as_lazy(a)
    shape = list(array.shape)
    shape.insert(axis % (array.ndim + 1), 1)
    return array.reshape(shape)


def _squeeze(a: Any, axis: Any = None) -> LazyArray:
    array = as_lazy(a)
    axes = [axis] if isinstance(axis, int) else axis
    dropped = {index % array.ndim for index in (axes if axes is not None else range(array.ndim))}
    return array.reshape([n for i, n in enumerate(array.shape) if not (i in dropped and n == 1)])


def _split(a: Any, indices_or_sections: Any, axis: int = 0) -> list[LazyArray]:
    array = as_lazy(a)
    length = array.shape[axis]
    if isinstance(indices_or_sections, int):
        if length % indices_or_sections:
            raise ValueError("array split does not result in an equal division")
        step = length // indices_or_sections
        bounds = list(range(step, length, step))
    else:
        bounds = [int(index) for index in indices_or_sections]
    starts, stops = [0, *bounds], [*bounds, length]
    before = (slice(None),) * (axis % array.ndim)
    return [array[(*before, slice(start, stop))] for start, stop in zip(starts, stops, strict=True)]


_LAZY: dict[Callable[..., Any], Callable[..., Any]] = {
    np.stack: _stack,
    np.concatenate: _concatenate,
    np.einsum: _einsum,
    np.matmul: _matmul,
    np.where: _where,
    np.transpose: lambda a, axes=None: as_lazy(a).transpose(*(() if axes is None else (axes,))),
    np.reshape: lambda a, shape=None, **kw: as_lazy(a).reshape(kw.get("newshape", shape)),
    np.swapaxes: _swapaxes,
    np.moveaxis: _moveaxis,
    np.expand_dims: _expand_dims,
    np.squeeze: _squeeze,
    np.split: _split,
}


def array_function(func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """What ``func(*args, **kwargs)`` gives when an argument is a LazyArray."""
    lazy = _LAZY.get(func)
    if lazy is not None:
        return lazy(*args, **kwargs)
    if implicit_reads_forbidden():
        raise ImplicitReadError(getattr(func, "__name__", "a numpy function"))
    return func(*_read_all(args), **_read_all(kwargs))


def _read_all(value: Any) -> Any:
    if isinstance(value, LazyArray):
        return value.read()
    if isinstance(value, (list, tuple)):
        return type(value)(_read_all(item) for item in value)
    if isinstance(value, dict):
        return {key: _read_all(item) for key, item in value.items()}
    return value


def _array_ufunc(self: LazyArray, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
    """numpy ufuncs (``np.sqrt(x)``, ``np.maximum(x, 0)``) stay lazy."""
    if method != "__call__" or "out" in kwargs or ufunc.nout != 1:
        return NotImplemented
    if ufunc is np.matmul:
        return matmul(*inputs)
    return elementwise(functools.partial(ufunc, **kwargs), *inputs, name=ufunc.__name__)


def _array_function(self: LazyArray, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
    """numpy functions: the structural ones and products stay lazy, others read."""
    return array_function(func, args, kwargs)


def _matmul_method(self: LazyArray, other: Any) -> LazyArray:
    return matmul(self, other)


def _rmatmul_method(self: LazyArray, other: Any) -> LazyArray:
    return matmul(other, self)


def attach_numpy_protocols(cls: type[LazyArray]) -> None:
    """Gives `cls` numpy's protocols (ufuncs, ``np.*`` functions) and ``@``.

    They are attached here, after the engine's modules exist, rather than defined in the
    class: products and structural functions are built on LazyArray itself (as jax attaches
    its array methods in ``jax/_src/numpy/array_methods.py``).
    """
    cls.__array_ufunc__ = _array_ufunc  # type: ignore[method-assign]
    cls.__array_function__ = _array_function  # type: ignore[method-assign]
    cls.__matmul__ = _matmul_method  # type: ignore[method-assign]
    cls.__rmatmul__ = _rmatmul_method  # type: ignore[method-assign]
