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

import contextlib
import math
import operator
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .._dtypes import cast_loss, to_dtype
from .._errors import (
    ArgumentError,
    InvalidIndexError,
    ShapeMismatchError,
    SurgeryError,
    UnsupportedError,
)
from .._format import human_bytes
from .._interrupts import native_call
from .._paths import register_array_type
from .compute import MapNode
from .graph import MemorySource, Node, SourceNode, source_nodes
from .joins import ConcatNode, StackNode
from .selection import full, parse_index
from .views import (
    CastNode,
    CheckedCastNode,
    IndexNode,
    ReshapeNode,
    TransposeNode,
    checking_casts,
)


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

    __slots__ = ("node", "path", "stored_as")
    __array_priority__ = 1000  # numpy defers to us in mixed expressions

    def __init__(self, node: Node, path: str | None = None, stored_as: str = "array") -> None:
        self.node = node
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
        return self.node.shape

    @property
    def dtype(self) -> np.dtype:
        return self.node.dtype

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
        return source_nodes(self.node)

    # Reading -------------------------------------------------------------------------

    def read(self) -> np.ndarray:
        """Reads the array (only the bytes this view needs) into a numpy array."""
        log = getattr(_guard, "reads", None)
        if log is not None:  # a user function reading eagerly: the plan counts what it reads
            log.append(self)
        try:
            return self.node.read(full(self.shape))
        except MemoryError:
            raise SurgeryError(
                f"Reading {self.path!r} ({human_bytes(self.nbytes)}, shape {self.shape}) needs "
                f"more memory than this machine can give. Read a slice (x[:n].read()), or "
                f"stream it to disk with suture.save, which works under a memory budget."
            ) from None

    def item(self) -> Any:
        """The value of a one-element array as a Python number (for saved step counters)."""
        values = self.read()
        if values.size != 1:
            raise InvalidIndexError(
                f"item() of {self.path!r} needs exactly one element; it has shape {self.shape}."
            )
        return values.item()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        if getattr(_guard, "active", False):
            raise ImplicitReadError(f"np.asarray reads {self.path or 'a computed array'!r}")
        values = self.read()
        return values if dtype is None else values.astype(dtype, copy=False)

    # Structural operations (lazy) -------------------------------------------------------

    def with_node(self, node: Node) -> LazyArray:
        """A LazyArray of `node` that keeps this one's path and stored dtype."""
        return LazyArray(node, path=self.path, stored_as=self.stored_as)

    def __getitem__(self, index: Any) -> LazyArray:
        parsed = parse_index(index, self.shape, self.path)
        view = self.with_node(
            IndexNode(
                self.node, parsed.selection, parsed.dropped_axes, parsed.new_axes, parsed.shape
            )
        )
        if parsed.array_axis_to_front is not None:
            others = [axis for axis in range(view.ndim) if axis != parsed.array_axis_to_front]
            view = view.transpose(parsed.array_axis_to_front, *others)
        return view

    def astype(self, dtype: Any) -> LazyArray:
        """The array converted to `dtype` when read (``"bfloat16"``, ``np.int8`` ...).

        Inside `suture.transform(..., strict_casts=True)` (`views.strict_casts`), a cast that
        can destroy values checks them as it is read.
        """
        target = to_dtype(dtype)
        if target == self.dtype:
            return self
        if checking_casts() and cast_loss(self.dtype, target):
            return self.with_node(CheckedCastNode(self.node, target, self.path))
        if isinstance(self.node, (StackNode, ConcatNode)):
            # Members are converted as they are copied into the result: one pass, no
            # full-precision copy of the whole block.
            return self.with_node(type(self.node)(self.node.members, self.node.axis, target))
        return self.with_node(CastNode(self.node, target))

    def reshape(self, *shape: Any) -> LazyArray:
        """The array with a new shape (C order); one entry may be -1."""
        wanted = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], Sequence) else shape
        resolved = _resolve_shape(tuple(int(n) for n in wanted), self.size, self.path)
        return self if resolved == self.shape else self.with_node(ReshapeNode(self.node, resolved))

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
        return self.with_node(TransposeNode(self.node, normalized))

    @property
    def T(self) -> LazyArray:  # noqa: N802 (numpy's name)
        return self.transpose()

    # Arithmetic (lazy, numpy's broadcasting and dtype rules) ------------------------------

    def __add__(self, other: Any) -> LazyArray:
        return elementwise(operator.add, self, other)

    def __radd__(self, other: Any) -> LazyArray:
        return elementwise(operator.add, other, self)

    def __sub__(self, other: Any) -> LazyArray:
        return elementwise(operator.sub, self, other)

    def __rsub__(self, other: Any) -> LazyArray:
        return elementwise(operator.sub, other, self)

    def __mul__(self, other: Any) -> LazyArray:
        return elementwise(operator.mul, self, other)

    def __rmul__(self, other: Any) -> LazyArray:
        return elementwise(operator.mul, other, self)

    def __truediv__(self, other: Any) -> LazyArray:
        return elementwise(operator.truediv, self, other)

    def __rtruediv__(self, other: Any) -> LazyArray:
        return elementwise(operator.truediv, other, self)

    def __pow__(self, other: Any) -> LazyArray:
        return elementwise(operator.pow, self, other)

    def __neg__(self) -> LazyArray:
        return elementwise(operator.mul, self, -1)

    def __floordiv__(self, other: Any) -> LazyArray:
        return elementwise(operator.floordiv, self, other)

    def __mod__(self, other: Any) -> LazyArray:
        return elementwise(operator.mod, self, other)

    def __abs__(self) -> LazyArray:
        return elementwise(operator.abs, self)

    def __gt__(self, other: Any) -> LazyArray:
        return elementwise(operator.gt, self, other)

    def __ge__(self, other: Any) -> LazyArray:
        return elementwise(operator.ge, self, other)

    def __lt__(self, other: Any) -> LazyArray:
        return elementwise(operator.lt, self, other)

    def __le__(self, other: Any) -> LazyArray:
        return elementwise(operator.le, self, other)

    def __eq__(self, other: Any) -> LazyArray:  # type: ignore[override] (numpy's meaning)
        return elementwise(operator.eq, self, other)

    def __ne__(self, other: Any) -> LazyArray:  # type: ignore[override]
        return elementwise(operator.ne, self, other)

    __hash__ = object.__hash__  # identity, as before: LazyArrays stay usable as dict keys

    def __and__(self, other: Any) -> LazyArray:
        return elementwise(operator.and_, self, other)

    def __or__(self, other: Any) -> LazyArray:
        return elementwise(operator.or_, self, other)

    def __invert__(self) -> LazyArray:
        return elementwise(operator.invert, self)

    def __jax_array__(self) -> Any:
        """Lets jax functions take a LazyArray (``jnp.stack([...])``); this reads it."""
        if getattr(_guard, "active", False):
            raise ImplicitReadError(f"jax reads {self.path or 'a computed array'!r}")
        import jax.numpy as jnp  # heavy: loaded on first use, not at import

        return jnp.asarray(self.read())


_NUMBER = (int, float, complex, np.generic)


def elementwise(op: Callable[..., Any], *operands: Any, name: str | None = None) -> LazyArray:
    """``op(*operands)`` as a LazyArray, with numpy's broadcasting and dtype rules.

    Numbers stay constants; arrays become inputs. When every array has the result's shape,
    reading part of the result reads only that part of the inputs.
    """
    lazy = [as_lazy(value) for value in operands if not isinstance(value, _NUMBER)]
    samples = [
        value if isinstance(value, _NUMBER) else np.empty((0,), as_lazy(value).dtype)
        for value in operands
    ]
    dtype = np.asarray(op(*samples)).dtype  # numpy's own promotion, NEP 50 included
    label = name or getattr(op, "__name__", "op")
    try:
        shape = np.broadcast_shapes(*(array.shape for array in lazy))
    except ValueError as error:
        raise ShapeMismatchError(
            f"Cannot combine shapes {[array.shape for array in lazy]} with {label}: they do "
            f"not broadcast. Slice, reshape or pad them first."
        ) from error

    def compute(*values: np.ndarray) -> np.ndarray:
        remaining = iter(values)
        filled = [value if isinstance(value, _NUMBER) else next(remaining) for value in operands]
        return np.asarray(op(*filled)).astype(dtype, copy=False)

    compute.__name__ = label
    same_shape = all(array.shape == shape for array in lazy)
    return map(compute, *lazy, shape=shape, dtype=dtype, elementwise=same_shape)


class ImplicitReadError(Exception):
    """Raised by ``np.asarray(lazy)`` inside `no_implicit_reads` (internal signal).

    Not a `SurgeryError`: nothing is wrong with the user's input. `call_function` catches it
    and runs the function another way; it never reaches a user.
    """


_guard = threading.local()


def implicit_reads_forbidden() -> bool:
    """Whether this thread is inside `no_implicit_reads` (where a read signals instead)."""
    return getattr(_guard, "active", False)


@contextlib.contextmanager
def no_implicit_reads() -> Iterator[None]:
    """Inside this block ``np.asarray(lazy_array)`` raises `ImplicitReadError`.

    suture calls user functions on lazy trees inside it, so that a function that would
    quietly read an array (``jnp.mean(x)``) is noticed and traced lazily instead.
    """
    previous = getattr(_guard, "active", False)
    _guard.active = True
    try:
        yield
    finally:
        _guard.active = previous


@contextlib.contextmanager
def logging_reads() -> Iterator[list[LazyArray]]:
    """Inside this block every LazyArray read is appended to the list it yields."""
    previous = getattr(_guard, "reads", None)
    _guard.reads = log = []
    try:
        yield log
    finally:
        _guard.reads = previous


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


def common_path(arrays: Sequence[LazyArray]) -> str | None:
    paths = {array.path for array in arrays}
    return paths.pop() if len(paths) == 1 else None


def map(  # noqa: A001 (the public name is suture.map)
    fn: Callable[..., Any],
    *arrays: Any,
    shape: Sequence[int] | None = None,
    dtype: Any = None,
    elementwise: bool = False,
) -> LazyArray:
    """Applies ``fn`` (a numpy or jax function) to the arrays when the result is read.

    The result's shape and dtype come from `shape` and `dtype` when given, else from
    numpy's rules for a ufunc (``np.tanh``), from ``jax.eval_shape(fn, ...)``, or, for numpy
    code jax cannot trace, from running `fn` once on ones of small inputs. With ``elementwise=True`` (output element ``i`` depends
    only on input elements ``i``), reading part of the result reads only that part of the
    inputs. A result of another dtype is cast to `dtype`; a cast that changes a value
    beyond a float's rounding (3000 to int8, 1e39 to float32) is a `LossyCastError`.

    Example:
        >>> import numpy as np, suture
        >>> a, b = (suture.LazyArray.from_array(np.full((2,), v, np.float32)) for v in (1, 3))
        >>> suture.map(lambda x, y: (x + y) / 2, a, b).read()
        array([2., 2.], dtype=float32)
    """
    lazy = [as_lazy(array) for array in arrays]
    name = getattr(fn, "__name__", "fn")
    if shape is None or dtype is None:
        inferred_shape, inferred_dtype = _infer_shape_dtype(fn, lazy, name, elementwise)
        shape = inferred_shape if shape is None else shape
        dtype = inferred_dtype if dtype is None else dtype
    path = common_path(lazy)
    node = MapNode(
        fn, [a.node for a in lazy], tuple(shape), to_dtype(dtype), elementwise, name, path
    )
    if elementwise and any(array.shape != node.shape for array in lazy):
        raise ShapeMismatchError(
            f"suture.map({name}, elementwise=True) needs inputs of the output shape {node.shape}; "
            f"got {[array.shape for array in lazy]}. Drop elementwise=True for broadcasting."
        )
    return LazyArray(node, path)


def _infer_shape_dtype(
    fn: Callable, arrays: list[LazyArray], name: str, elementwise: bool
) -> tuple:
    """What `fn` returns: from numpy's rules for a ufunc, else from tracing it with jax,
    else from running it on a small sample (numpy code that jax cannot trace)."""
    if isinstance(fn, np.ufunc):
        # jax keeps weak references to what it traces, and a ufunc cannot have one (jax 0.10
        # crashed with a segmentation fault on the second try): it never sees one.
        if fn.nout != 1:
            raise ArgumentError(f"suture.map: {name} returns {fn.nout} arrays; it must return one.")
        shape = np.broadcast_shapes(*(array.shape for array in arrays))
        return shape, _run_on_sample(fn, [(1,)] * len(arrays), arrays).dtype
    import jax  # heavy: loaded on first use, not at import

    def traced(*values: Any) -> Any:  # jax sees a plain function, whatever `fn` is
        return fn(*values)

    specs = [jax.ShapeDtypeStruct(array.shape, array.dtype) for array in arrays]
    try:
        with native_call():  # Ctrl-C inside jax's C++ tracing would abort the process
            result = jax.eval_shape(traced, *specs)
    except Exception as error:  # numpy code on tracers: run it on a sample instead
        result = _sampled(fn, arrays, elementwise)
        if result is None:
            raise UnsupportedError(
                f"suture.map could not infer what {name} returns: tracing it with jax failed "
                f"({type(error).__name__}: {error}), and its inputs are too large to run it on "
                f"to find out. Pass shape= and dtype= to suture.map (or elementwise=True if "
                f"each output element depends only on the same input elements)."
            ) from error
    if not hasattr(result, "shape"):
        raise ArgumentError(
            f"suture.map: {name} must return one array, got {type(result).__name__}."
        )
    return tuple(result.shape), result.dtype


_SAMPLE_ELEMENTS = 1 << 20  # inputs up to this size may be computed once to learn the result


def _sampled(fn: Callable, arrays: list[LazyArray], elementwise: bool) -> Any:
    """`fn`'s result on inputs of ones (one element each when `elementwise`); None when the
    inputs are too large to compute on."""
    if elementwise:
        result = _run_on_sample(fn, [(1,) * len(array.shape) for array in arrays], arrays)
        shape = np.broadcast_shapes(*(array.shape for array in arrays))
        return np.broadcast_to(np.asarray(result), shape)  # a view: no memory
    if sum(math.prod(array.shape) for array in arrays) > _SAMPLE_ELEMENTS:
        return None
    return _run_on_sample(fn, [array.shape for array in arrays], arrays)


def _run_on_sample(fn: Callable, shapes: list[tuple], arrays: list[LazyArray]) -> Any:
    samples = [
        np.broadcast_to(np.ones((), a.dtype), s) for a, s in zip(arrays, shapes, strict=True)
    ]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ones are not the data: a warning about them misleads
        result = np.asarray(fn(*samples))
    return result


register_array_type(LazyArray)  # a leaf of every tree, never opened as a container
