"""``isinstance`` for jax's types without importing jax.

Importing jax takes seconds, and suture reads and writes numpy checkpoints without it. But
an object can only be a jax array, tracer or ``ShapeDtypeStruct`` if jax was imported
already, by whoever made it: so these helpers look jax up in ``sys.modules`` and answer
False when it is not there, and otherwise ask real ``isinstance`` (never a class's name,
which any other library may reuse).

Example:
    >>> import numpy as np
    >>> is_jax_array(np.zeros(2)), is_shape_dtype_struct(np.zeros(2)), is_tracer(1.0)
    (False, False, False)
    >>> import jax
    >>> is_shape_dtype_struct(jax.ShapeDtypeStruct((2,), np.float32))
    True
"""

from __future__ import annotations

import sys
from typing import Any


def loaded_jax() -> Any:
    """The jax module when something has imported it, else None (never imports it)."""
    return sys.modules.get("jax")


def jax_array_type() -> type | None:
    """``jax.Array`` when jax is imported, else None."""
    return getattr(loaded_jax(), "Array", None)


def is_jax_array(value: Any) -> bool:
    """Whether `value` is a ``jax.Array`` (a concrete one, or a tracer inside a jax trace)."""
    array_type = jax_array_type()
    return array_type is not None and isinstance(value, array_type)


def is_shape_dtype_struct(value: Any) -> bool:
    """Whether `value` is a ``jax.ShapeDtypeStruct`` (a shape and dtype, with no data)."""
    struct = getattr(loaded_jax(), "ShapeDtypeStruct", None)
    return struct is not None and isinstance(value, struct)


def is_tracer(value: Any) -> bool:
    """Whether `value` is a jax tracer (an abstract value inside ``jit``/``make_jaxpr``)."""
    core = sys.modules.get("jax.core")
    tracer = getattr(core, "Tracer", None)
    return tracer is not None and isinstance(value, tracer)
