"""The lazy-array engine: LazyArray, the graph of nodes behind it, and what reads them.

From the bottom up: `selection` (which elements of each axis a read wants), `graph` (the node
interface, in-memory sources, the walk), `views` and `joins` (index, cast, transpose,
reshape; stack, concatenate, pad), `compute` (nodes that compute: products, elementwise
functions, broadcasts, user maps), `reads` (what a read of a node takes from each source, without
reading), `array` (`LazyArray`), `combine` and `products` (stack, concatenate, matmul,
einsum), `numpy_api` (numpy's protocols on LazyArray), `jaxpr` and `trace` (user functions
and ``jnp`` code made lazy).

LazyArray's numpy protocols are attached here, once every module of the engine exists.
"""

from . import numpy_api as _numpy_api
from . import trace as _trace  # noqa: F401 (the top of the engine: imported with it)
from .array import LazyArray as _LazyArray

_numpy_api.attach_numpy_protocols(_LazyArray)
