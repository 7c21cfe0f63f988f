"""What `suture inspect` shows of a packed weight: its logical shape and its format.

Example:
    >>> import numpy as np
    >>> from suture._lazy.array import LazyArray
    >>> tensors = {
    ...     "e.weight": LazyArray.from_array(np.zeros((4, 16), np.uint8), path="e.weight"),
    ...     "e.scale": LazyArray.from_array(np.zeros((4, 1), np.uint8), path="e.scale"),
    ... }
    >>> logical_views(tensors, {"quant_method": "fp8", "scale_fmt": "ue8m0"}, "m")
    {'e.weight': ((4, 32), 'fp4 e2m1 group 32')}
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._errors import SurgeryError
from .._lazy.array import LazyArray
from .grouped import GroupedDequantNode
from .nodes import MXFP4DequantNode
from .scheme import scheme_of
from .tensors import dequantize_tensors


def logical_views(
    tensors: dict[str, LazyArray], config: Any, where: str
) -> dict[str, tuple[tuple[int, ...], str]]:
    """``{stored name: (logical shape, format)}`` of each packed weight among `tensors` (by
    their stored names); empty when the config or the tensors do not fit (dequantizing
    says why)."""
    try:
        result = dequantize_tensors(tensors, scheme_of(config, where), np.dtype("float32"), where)
    except SurgeryError:
        return {}
    stored = {id(array.node): name for name, array in tensors.items()}
    views = {}
    for array in result.values():
        node = array.node
        if isinstance(node, GroupedDequantNode):
            first, label = node.codec.nodes()[0], node.codec.label
        elif isinstance(node, MXFP4DequantNode):
            first, label = node.blocks, "mxfp4 (transposed)"
        else:
            continue
        name = stored.get(id(first))
        if name is not None:
            views[name] = (tuple(node.shape), label)
    return views
