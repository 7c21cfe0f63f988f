"""LazyArray: an array described by shape and dtype, read only when asked.

Indexing, casting, reshaping, transposing, stacking, concatenating and mapping build new
LazyArrays without reading anything. ``x.read()`` (or ``np.asarray(x)``) reads the bytes the
view needs and no more: ``x[3]`` of an array stored in chunks along axis 0 reads the chunk
that holds row 3.

Example:
    >>> import numpy as np, suture
    >>> x = suture.LazyArray.from_array(np.arange(12).reshape(3, 4), path="w")
    >>> y = x.T[1:3].astype("float32")
    >>> y.shape, y.dtype.name
    ((2, 3), 'float32')
    >>> y.read().tolist()
    [[1.0, 5.0, 9.0], [2.0, 6.0, 10.0]]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._dtypes import to_dtype
from ._errors import InvalidIndexError, ShapeMismatchError, SurgeryError
from ._nodes import (
    CastNode,
    ConcatNode,
    IndexNode,
    MapNode,
    MemorySource,
    Node,
    PadNode,
    ReshapeNode,
    SourceNode,
    StackNode,
    TransposeNode,
    source_nodes,
)
from ._selection import full, parse_index


class LazyArray:
    """An array in a checkpoint (or computed from some), not yet read.

    Attributes:
        shape: the array's shape.
        dtype: the array's numpy dtype (ml_dtypes for bfloat16, float8 ...).
        path: the '/' path of the leaf it was opened as, or None for a computed array
            that draws on several leaves.
        stored_as: how the checkpoint stored it: ``"jax.Array"``, ``"np.ndarray"`` or
            ``"scalar"`` (a Python number saved by Orbax), or ``"array"`` when unknown.
    """

    __slots__ = ("_node", "path", "stored_as")
    __array_priority__ = 1000  # numpy defers to us in mixed expressions

    def __init__(self, node: Node, path: str | None = None, stored_as: str = "array") -> None:
        self._node = node
        self.path = path
        self.stored_as = stored_as

    @classmethod
    def from_array(cls, array: Any, path: str | None = None) -> LazyArray:
        """Wraps an in-memory array (numpy, jax ...) without copying it.

        Example:
            >>> LazyArray.from_array(np.zeros((2, 3)), path="w")
            LazyArray(path='w', shape=(2, 3), dtype=float64)
        """
        return cls(MemorySource(array, path=path), path=path)

    # Description ---------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return self._node.shape

    @property
    def dtype(self) -> np.dtype:
        return self._node.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the array in memory (not on disk, where it may be compressed)."""
        return self.size * self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d LazyArray")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"LazyArray(path={self.path!r}, shape={self.shape}, dtype={self.dtype.name})"

    def sources(self) -> list[SourceNode]:
        """The stored arrays this array reads from."""
        return source_nodes(self._node)

    # Reading -------------------------------------------------------------------------

    def read(self) -> np.ndarray:
        """Reads the array (only the bytes this view needs) into a numpy array."""
        return self._node.read(full(self.shape))

    def item(self) -> Any:
        """The value of a one-element array as a Python number (for saved step counters)."""
        values = self.read()
        if values.size != 1:
            raise InvalidIndexError(
                f"item() of {self.path!r} needs exactly one element; it has shape {self.shape}."
            )
        return values.item()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        values = self.read()
        return values if dtype is None else values.astype(dtype, copy=False)

    # Structural operations (lazy) -------------------------------------------------------

    def _derived(self, node: Node) -> LazyArray:
        return LazyArray(node, path=self.path, stored_as=self.stored_as)

    def __getitem__(self, index: Any) -> LazyArray:
        parsed = parse_index(index, self.shape, self.path)
        view = self._derived(
            IndexNode(
                self._node, parsed.selection, parsed.dropped_axes, parsed.new_axes, parsed.shape
            )
        )
        if parsed.array_axis_to_front is not None:
            others = [axis for axis in range(view.ndim) if axis != parsed.array_axis_to_front]
            view = view.transpose(parsed.array_axis_to_front, *others)
        return view

    def astype(self, dtype: Any) -> LazyArray:
        """The array converted to `dtype` when read (``"bfloat16"``, ``np.int8`` ...)."""
        target = to_dtype(dtype)
        return self if target == self.dtype else self._derived(CastNode(self._node, target))

    def reshape(self, *shape: Any) -> LazyArray:
        """The array with a new shape (C order); one entry may be -1."""
        wanted = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], Sequence) else shape
        resolved = _resolve_shape(tuple(int(n) for n in wanted), self.size, self.path)
        return self if resolved == self.shape else self._derived(ReshapeNode(self._node, resolved))

    def transpose(self, *axes: Any) -> LazyArray:
        """The array with permuted axes; no argument reverses them, as in numpy."""
        if len(axes) == 1 and isinstance(axes[0], Sequence):
            axes = tuple(axes[0])
        order = tuple(range(self.ndim))[::-1] if not axes else tuple(int(a) for a in axes)
        normalized = tuple(axis % self.ndim if self.ndim else axis for axis in order)
        if sorted(normalized) != list(range(self.ndim)):
            raise InvalidIndexError(
                f"transpose{order} of {self.path!r}: expected a permutation of "
                f"{tuple(range(self.ndim))} for shape {self.shape}."
            )
        if normalized == tuple(range(self.ndim)):
            return self
        return self._derived(TransposeNode(self._node, normalized))

    @property
    def T(self) -> LazyArray:  # noqa: N802 (numpy's name)
        return self.transpose()


def fit_shape(array: LazyArray, shape: tuple[int, ...]) -> LazyArray:
    """`array` truncated or zero-padded at the end of each axis to `shape`, lazily.

    Truncation reads only the kept part; padding reads the whole (smaller) source.

    Example:
        >>> x = LazyArray.from_array(np.arange(6).reshape(2, 3))
        >>> fit_shape(x, (3, 2)).read().tolist()
        [[0, 1], [3, 4], [0, 0]]
    """
    if len(shape) != array.ndim:
        raise ShapeMismatchError(
            f"Leaf {array.path!r} has shape {array.shape} and cannot be padded or truncated to "
            f"{shape}: the number of axes differs. Reshape it with a rule first."
        )
    kept = tuple(slice(0, min(have, want)) for have, want in zip(array.shape, shape, strict=True))
    truncated = (
        array[kept]
        if any(want < have for have, want in zip(array.shape, shape, strict=True))
        else array
    )
    if truncated.shape == shape:
        return truncated
    return truncated._derived(PadNode(truncated._node, shape))


def _resolve_shape(shape: tuple[int, ...], size: int, path: str | None) -> tuple[int, ...]:
    unknown = [i for i, length in enumerate(shape) if length == -1]
    known = math.prod(length for length in shape if length != -1)
    if len(unknown) > 1 or any(length < -1 for length in shape):
        raise ShapeMismatchError(f"reshape{shape} of {path!r}: at most one -1, no other negatives.")
    if unknown:
        if known == 0 or size % known:
            raise ShapeMismatchError(
                f"Cannot reshape {path!r} ({size} elements) to {shape}: {size} is not a "
                f"multiple of {known}."
            )
        shape = shape[: unknown[0]] + (size // known,) + shape[unknown[0] + 1 :]
    if math.prod(shape) != size:
        raise ShapeMismatchError(
            f"Cannot reshape {path!r} with {size} elements to {shape} "
            f"({math.prod(shape)} elements)."
        )
    return shape


def as_lazy(value: Any, path: str | None = None) -> LazyArray:
    """`value` as a LazyArray (an in-memory array is wrapped, not copied)."""
    if isinstance(value, LazyArray):
        return value
    if not (hasattr(value, "shape") and hasattr(value, "dtype")):
        value = np.asarray(value)
    return LazyArray.from_array(value, path=path)


def _common_path(arrays: Sequence[LazyArray]) -> str | None:
    paths = {array.path for array in arrays}
    return paths.pop() if len(paths) == 1 else None


def _joined(arrays: Sequence[Any], axis: int, operation: str, new_axis: bool) -> tuple:
    if not arrays:
        raise ShapeMismatchError(f"suture.{operation} needs at least one array.")
    lazy = [as_lazy(array) for array in arrays]
    ndim = lazy[0].ndim + (1 if new_axis else 0)
    if not -ndim <= axis < ndim:
        raise InvalidIndexError(f"suture.{operation}: axis {axis} is out of range for {ndim} axes.")
    axis %= ndim
    for array in lazy[1:]:
        same = (
            array.shape == lazy[0].shape
            if new_axis
            else array.ndim == lazy[0].ndim
            and all(
                a == b
                for i, (a, b) in enumerate(zip(array.shape, lazy[0].shape, strict=True))
                if i != axis
            )
        )
        if not same:
            raise ShapeMismatchError(
                f"suture.{operation}: {array.path or 'an array'} has shape {array.shape}, which "
                f"does not fit {lazy[0].path or 'the first array'} with shape {lazy[0].shape}"
                + ("" if new_axis else f" along axis {axis}")
                + ". Slice or pad them to matching shapes first."
            )
    dtype = np.result_type(*(array.dtype for array in lazy))
    return lazy, axis, dtype


def stack(arrays: Sequence[Any], axis: int = 0) -> LazyArray:
    """Stacks equally shaped arrays along a new axis, lazily.

    Reading one index of the stacked axis reads only that member.

    Example:
        >>> import numpy as np, suture
        >>> layers = [suture.LazyArray.from_array(np.full((2,), i)) for i in range(3)]
        >>> suture.stack(layers).shape
        (3, 2)
        >>> suture.stack(layers)[2].read()
        array([2, 2])
    """
    lazy, axis, dtype = _joined(arrays, axis, "stack", new_axis=True)
    return LazyArray(StackNode([array._node for array in lazy], axis, dtype), _common_path(lazy))


def concatenate(arrays: Sequence[Any], axis: int = 0) -> LazyArray:
    """Joins arrays along an existing axis, lazily.

    Example:
        >>> import numpy as np, suture
        >>> q, k = (suture.LazyArray.from_array(np.full((2, 2), i)) for i in (1, 2))
        >>> suture.concatenate([q, k], axis=1)[0].read()
        array([1, 1, 2, 2])
    """
    lazy, axis, dtype = _joined(arrays, axis, "concatenate", new_axis=False)
    return LazyArray(ConcatNode([array._node for array in lazy], axis, dtype), _common_path(lazy))


def map(  # noqa: A001 (the public name is suture.map)
    fn: Callable[..., Any],
    *arrays: Any,
    shape: Sequence[int] | None = None,
    dtype: Any = None,
    elementwise: bool = False,
) -> LazyArray:
    """Applies ``fn`` (a numpy or jax function) to the arrays when the result is read.

    The result's shape and dtype come from `shape` and `dtype` when given, else from
    ``jax.eval_shape(fn, ...)``. With ``elementwise=True`` (output element ``i`` depends
    only on input elements ``i``), reading part of the result reads only that part of the
    inputs.

    Example:
        >>> import numpy as np, suture
        >>> a, b = (suture.LazyArray.from_array(np.full((2,), v, np.float32)) for v in (1, 3))
        >>> suture.map(lambda x, y: (x + y) / 2, a, b).read()
        array([2., 2.], dtype=float32)
    """
    lazy = [as_lazy(array) for array in arrays]
    name = getattr(fn, "__name__", "fn")
    if shape is None or dtype is None:
        inferred_shape, inferred_dtype = _infer_shape_dtype(fn, lazy, name)
        shape = inferred_shape if shape is None else shape
        dtype = inferred_dtype if dtype is None else dtype
    node = MapNode(fn, [a._node for a in lazy], tuple(shape), to_dtype(dtype), elementwise, name)
    if elementwise and any(array.shape != node.shape for array in lazy):
        raise ShapeMismatchError(
            f"suture.map({name}, elementwise=True) needs inputs of the output shape {node.shape}; "
            f"got {[array.shape for array in lazy]}. Drop elementwise=True for broadcasting."
        )
    return LazyArray(node, _common_path(lazy))


def _infer_shape_dtype(fn: Callable, arrays: list[LazyArray], name: str) -> tuple:
    import jax

    specs = [jax.ShapeDtypeStruct(array.shape, array.dtype) for array in arrays]
    try:
        result = jax.eval_shape(fn, *specs)
    except Exception as error:  # any tracing failure means: tell us the shape
        raise SurgeryError(
            f"suture.map could not infer what {name} returns by tracing it with jax "
            f"({type(error).__name__}: {error}). Pass shape= and dtype= to suture.map."
        ) from error
    if not hasattr(result, "shape"):
        raise SurgeryError(
            f"suture.map: {name} must return one array, got {type(result).__name__}."
        )
    return tuple(result.shape), result.dtype
