"""User functions on lazy trees: run them lazily, trace them with jax, or let them read.

`call_function(fn, *args)` tries, in order:

1. **lazy**: ``fn`` runs on the LazyArrays themselves with reads forbidden. LazyArray
   arithmetic, comparisons, ``@``, numpy ufuncs and numpy's structural functions build
   lazy nodes directly.
2. **traced**: ``jax.make_jaxpr`` traces ``fn`` on abstract arrays of the same shapes and
   dtypes (any ``jnp``, ``jax.numpy`` or ``jax.nn`` function), and the jaxpr is rebuilt
   from lazy nodes (`_jaxpr.lazy_eval`): elementwise primitives, products and reductions
   compute by blocks; anything else reads its inputs whole when read.
3. **eager**: ``fn`` runs with reads allowed (``np.asarray(x)``, ``x.read()``, Python
   control flow on values); what it reads is counted and the plan says so.

While a plan is being built (`recording`), each call reports notes and eager reads there.

Example:
    >>> import jax.numpy as jnp, numpy as np, suture
    >>> x = suture.LazyArray.from_array(np.zeros((2, 3), np.float32))
    >>> y = call_function(lambda a: jnp.tanh(a) + 1, x)
    >>> type(y).__name__, y.shape, y.read().tolist()
    ('LazyArray', (2, 3), [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._errors import SurgeryError
from .._jaxtypes import is_tracer, jax_array_type
from .array import ImplicitReadError, LazyArray, logging_reads, no_implicit_reads
from .graph import SourceNode
from .jaxpr import lazy_eval
from .reads import estimate_reads
from .selection import full


@dataclass
class Record:
    """What the user functions called while building a surgery did."""

    notes: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)  # why a function was not run lazily
    eager_reads: dict[int, tuple[SourceNode, int]] = field(default_factory=dict)


_state = threading.local()


@contextlib.contextmanager
def recording() -> Iterator[Record]:
    """Collects notes and eager reads of every `call_function` inside the block."""
    previous = getattr(_state, "record", None)
    _state.record = record = Record()
    try:
        yield record
    finally:
        _state.record = previous


def call_function(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` for arguments holding LazyArrays: lazily, traced, or reading eagerly.

    `fn` runs at most three times, once per way, and only moves on to the next way when the
    previous one failed because of laziness or tracing, not because of a bug in `fn`:

    1. lazily, with reads forbidden. It moves on only for an `ImplicitReadError` (``fn``
       would read an array), a TypeError or ValueError about the LazyArray itself (``jnp``
       or ``float()`` rejecting it), or an AttributeError naming something numpy or jax
       arrays have and LazyArrays lack (``x.at``, ``x.tolist``).
    2. traced by jax (when an argument holds LazyArrays). It moves on only for jax's tracer
       errors (``TracerArrayConversionError``, ``ConcretizationTypeError`` and its
       ``TracerBoolConversionError``/``TracerIntegerConversionError``, ...), a TypeError
       about a tracer, an AttributeError naming a numpy-only attribute, or an error in
       jax or suture around the call rather than in `fn`.
    3. eagerly, with reads allowed: whatever it raises is raised.

    Any other exception of `fn` (``ZeroDivisionError``, a ``KeyError`` on its own dict,
    a `SurgeryError` from a LazyArray operation) is raised at once, from its first run,
    with its own traceback. Inside `recording`, each earlier way's failure is reported
    (`Record.fallbacks`): its exception type and message.
    """
    import jax  # heavy: loaded on first use, not at import

    def fresh() -> tuple:  # new containers for each try: a function may edit its arguments
        return jax.tree.map(lambda leaf: leaf, args, is_leaf=lambda leaf: leaf is None)

    failures: list[str] = []
    try:
        with no_implicit_reads():
            return fn(*fresh())
    except Exception as error:
        if isinstance(error, SurgeryError) or not _about_laziness(error):
            raise
        failures.append(f"running lazily failed ({_why(error)})")
    if any(isinstance(leaf, LazyArray) for leaf in jax.tree.leaves(args)):
        calls: list[BaseException] = []  # what escaped `fn` itself while jax traced it
        try:
            result = traced_call(fn, fresh(), calls)
        except Exception as error:
            from_fn = any(error is escaped for escaped in calls)
            if isinstance(error, SurgeryError) or (from_fn and not _about_tracing(error)):
                raise
            failures.append(f"tracing with jax failed ({_why(error)})")
        else:
            _report_fallback(fn, failures, "traced with jax")
            return result
    result = _eager_call(fn, fresh())
    _report_fallback(fn, failures, "ran reading arrays")
    return result


def _about_laziness(error: Exception) -> bool:
    """Whether `error`, raised by a function run on LazyArrays, is about their laziness."""
    if isinstance(error, ImplicitReadError):
        return True
    if isinstance(error, AttributeError):
        on_lazy = isinstance(getattr(error, "obj", None), LazyArray) or "'LazyArray'" in str(error)
        return on_lazy and _array_attribute(error)
    if isinstance(error, (TypeError, ValueError)):
        # jax (``__jax_array__``), numpy's protocols or Python (``float(x)``) refusing one
        message = str(error)
        return "LazyArray" in message or "__jax_array__" in message
    return False


def _about_tracing(error: Exception) -> bool:
    """Whether `error`, raised by a function jax traces, is about the tracing."""
    import jax  # heavy: loaded on first use, not at import

    names = (
        "ConcretizationTypeError",  # also TracerBoolConversionError, TracerIntegerConversionError
        "TracerArrayConversionError",
        "TracerBoolConversionError",
        "TracerIntegerConversionError",
        "NonConcreteBooleanIndexError",
        "UnexpectedTracerError",
    )
    tracer_errors = tuple(getattr(jax.errors, name) for name in names if hasattr(jax.errors, name))
    if isinstance(error, tracer_errors):
        return True
    if isinstance(error, AttributeError):  # e.g. x.flags: numpy has it, jax arrays do not
        return "Tracer" in str(error) and _array_attribute(error)
    if isinstance(error, TypeError):
        message = str(error)
        return "Tracer" in message or "traced array" in message
    return False


def _array_attribute(error: AttributeError) -> bool:
    """Whether the missing attribute is one numpy's (or jax's) arrays have: not a typo."""
    name = getattr(error, "name", None) or str(error).rsplit(" ", 1)[-1].strip("'\"")
    jax_array = jax_array_type()
    return hasattr(np.ndarray, name) or (jax_array is not None and hasattr(jax_array, name))


def _why(error: BaseException) -> str:
    message = " ".join(str(error).split())
    if isinstance(error, ImplicitReadError) and " " not in message:
        message = f"np.{message} reads its LazyArray arguments"  # numpy_api names the function
    if len(message) > 160:
        message = message[:157] + "..."
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _report_fallback(fn: Callable[..., Any], failures: list[str], how: str) -> None:
    record = getattr(_state, "record", None)
    if record is not None and failures:
        name = getattr(fn, "__name__", None) or type(fn).__name__
        record.fallbacks.append(f"{name}: {'; '.join(failures)}; {how}.")


def _eager_call(fn: Callable[..., Any], args: tuple) -> Any:
    name = getattr(fn, "__name__", "a function")
    with logging_reads() as read_arrays:
        result = fn(*args)
    record = getattr(_state, "record", None)
    if record is not None and read_arrays:
        for array in read_arrays:
            for key, (source, count) in estimate_reads(array.node, full(array.shape)).items():
                previous = record.eager_reads.get(key, (source, 0))[1]
                record.eager_reads[key] = (source, max(previous, count))
        paths = sorted({array.path or "a computed array" for array in read_arrays})
        shown = ", ".join(paths[:4]) + (" ..." if len(paths) > 4 else "")
        record.notes.append(
            f"{name} reads {shown} when it is called (it needs concrete values: np.asarray, "
            f".read(), or Python code on values). jnp, jax.nn, LazyArray arithmetic, "
            f"suture.stack and suture.map stay lazy."
        )
    return result


def traced_call(
    fn: Callable[..., Any], args: tuple, escaped: list[BaseException] | None = None
) -> Any:
    """``fn(*args)`` traced by jax; its array results rebuilt from lazy nodes.

    An exception raised by `fn` itself (not by jax or suture around it) is also appended
    to `escaped`, so that a caller can tell the two apart.
    """
    import jax  # heavy: loaded on first use, not at import

    leaves, treedef = jax.tree.flatten(args)
    lazy_positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, LazyArray)]
    inputs, originals, narrowed = [], {}, set()
    for position in lazy_positions:
        array = leaves[position]
        dtype = jax.dtypes.canonicalize_dtype(array.dtype)  # what jax computes in
        cast = array if array.dtype == dtype else array.astype(dtype)
        if cast is not array:
            narrowed.add(f"{array.dtype.name} -> {dtype.name}")
        inputs.append(cast)
        originals[id(cast)] = array  # a leaf passed through unchanged keeps its dtype
    result_layout: dict[str, Any] = {}

    def arrays_only(*arrays: Any) -> list[Any]:
        filled = list(leaves)
        for position, array in zip(lazy_positions, arrays, strict=True):
            filled[position] = array
        try:
            result = fn(*jax.tree.unflatten(treedef, filled))
        except BaseException as error:
            if escaped is not None:
                escaped.append(error)
            raise
        out_leaves, out_def = jax.tree.flatten(result, is_leaf=lambda leaf: leaf is None)
        traced = [is_tracer(leaf) for leaf in out_leaves]
        result_layout.update(leaves=out_leaves, treedef=out_def, traced=traced)
        return [leaf for leaf, is_traced in zip(out_leaves, traced, strict=True) if is_traced]

    specs = [jax.ShapeDtypeStruct(array.shape, array.dtype) for array in inputs]
    closed = jax.make_jaxpr(arrays_only)(*specs)
    computed = iter(
        originals.get(id(value), value) if isinstance(value, LazyArray) else value
        for value in lazy_eval(closed, inputs)
    )
    record = getattr(_state, "record", None)
    if narrowed and record is not None:
        name = getattr(fn, "__name__", "a function")
        record.notes.append(
            f"{name} is traced by jax, which computes {', '.join(sorted(narrowed))} (64-bit "
            f"types are off in jax by default): its results from those leaves are 32-bit, as "
            f"the same jnp code gives. Set jax_enable_x64, or use LazyArray arithmetic."
        )
    out_leaves = [
        next(computed) if is_traced else leaf
        for leaf, is_traced in zip(result_layout["leaves"], result_layout["traced"], strict=True)
    ]
    return jax.tree.unflatten(result_layout["treedef"], out_leaves)
