"""`quantize=` for a save: a tree's linear weights in a serving format, and its config.

``"fp8-block"`` is DeepSeek-V3's FP8 layout (`tensors.quantize_tree`); compressed-tensors'
presets (``W4A16``, ``W8A16``, ``NVFP4A16``, ``FP8_DYNAMIC``, any case) write each 2-D
floating-point linear ``weight`` as the tensors its compressor writes (`ct_nodes`),
quantized a block of rows at a time as the save streams, and the ``quantization_config``
compressed-tensors writes, whose ``ignore`` lists the linear modules kept in high precision
(`tensors.DEFAULT_KEEP`: embeddings, norms, the LM head, MoE routers; or the caller's
patterns). NVFP4's global scale is shared by the projections serving stacks fuse: q/k/v of
an attention block, gate/up of an MLP.

Example:
    >>> import numpy as np, ml_dtypes
    >>> tree = {"model": {"up_proj": {"weight": np.ones((8, 32), ml_dtypes.bfloat16)},
    ...                   "embed_tokens": {"weight": np.ones((8, 32), ml_dtypes.bfloat16)}}}
    >>> out, config = quantize_for_serving(tree, "w4a16", None, group_size=32)
    >>> sorted(out["model"]["up_proj"]), config["ignore"]
    (['weight_packed', 'weight_scale', 'weight_shape'], ['model.embed_tokens'])
"""

from __future__ import annotations

import re
from typing import Any

from .._errors import ArgumentError, ShapeMismatchError
from .._lazy.array import LazyArray, as_lazy
from .._paths import flatten, unflatten
from .._patterns import compile_pattern, search
from .ct_nodes import GlobalScaleNode, ct_parts
from .ct_scheme import PRESETS, CTScheme, ct_config, ct_scheme
from .tensors import DEFAULT_KEEP, QUANTIZE_METHODS, quantize_tree

FLOATS = ("float32", "float16", "bfloat16", "float64")
# projections a serving stack fuses into one matrix, whose NVFP4 global scale is shared
FUSED = re.compile(r"^(.*)\.(?:(q_proj|k_proj|v_proj)|(gate_proj|up_proj))\.weight$")
SCHEMES = (*QUANTIZE_METHODS, *PRESETS)


def quantize_for_serving(
    tree: Any,
    method: str,
    keep: tuple[str, ...] | None,
    separator: str = ".",
    group_size: int | None = None,
) -> tuple[Any, dict[str, Any]]:
    """`tree` with its linear weights quantized by `method`, and the ``quantization_config``.

    Raises:
        ArgumentError: an unknown `method`, or a `group_size` it does not take.
        ShapeMismatchError: a weight whose columns the scheme's groups do not divide.
    """
    if not isinstance(method, str):
        raise ArgumentError(f"quantize={method!r}: expected one of {', '.join(SCHEMES)}.")
    if method.lower() in QUANTIZE_METHODS:
        if group_size is not None:
            raise ArgumentError(
                f"group_size={group_size} (--group-size) does not apply to {method}: its "
                f"scales cover fixed 128x128 blocks. Group sizes go with W4A16 and W8A16."
            )
        return quantize_tree(tree, method.lower(), keep, separator)
    scheme = ct_scheme(method, group_size)
    if scheme is None:
        raise ArgumentError(
            f"Unknown quantize={method!r}: suture writes {', '.join(SCHEMES)} (any case): "
            f"fp8-block is DeepSeek-V3's FP8 layout, the others compressed-tensors' preset "
            f"schemes of the same names (vLLM and SGLang load them)."
        )
    return _ct_tree(tree, scheme, keep, separator)


def _ct_tree(
    tree: Any, scheme: CTScheme, keep: tuple[str, ...] | None, separator: str
) -> tuple[Any, dict[str, Any]]:
    patterns = [
        compile_pattern(p, "keep-unquantized") for p in (DEFAULT_KEEP if keep is None else keep)
    ]
    flat = flatten(tree)
    chosen: dict[str, LazyArray] = {}
    ignore: list[str] = []
    for path, leaf in flat.items():
        if not (isinstance(leaf, LazyArray) or (hasattr(leaf, "shape") and hasattr(leaf, "dtype"))):
            continue
        array = as_lazy(leaf, path=path)
        name = path.replace("/", separator)
        linear = array.ndim == 2 and name.rsplit(".", 1)[-1] == "weight"
        if not linear or array.dtype.name not in FLOATS:
            continue
        if any(search(pattern, name) for pattern in patterns):
            ignore.append(name[: -len(".weight")])
            continue
        _check_columns(name, array, scheme)
        chosen[path] = array
    shared = _global_scales(chosen, separator) if scheme.kind == "nvfp4" else {}
    result: dict[str, Any] = {}
    for path, leaf in flat.items():
        array = chosen.get(path)
        if array is None:
            result[path] = leaf
            continue
        name = path.replace("/", separator)
        module = path.rsplit("/", 1)[0]
        for suffix, node in ct_parts(array.node, scheme, name, shared.get(path)).items():
            result[f"{module}/{suffix}"] = LazyArray(node, path=None)
    return unflatten(result), ct_config(scheme, ignore)


def _check_columns(name: str, array: LazyArray, scheme: CTScheme) -> None:
    columns = array.shape[1]
    group = scheme.group
    if group is not None and columns % group:
        divisors = [size for size in (128, 64, 32, 16, 8) if columns % size == 0]
        keep = (
            f"keep it unquantized with keep_unquantized / --keep-unquantized "
            f"'^{re.escape(name)}$' (with the default patterns, if you pass any)"
        )
        if scheme.kind == "int" and divisors:
            fix = f"Pass a group_size (--group-size) that divides it, such as {divisors[0]}, or {keep}."
        else:
            fix = f"{keep[0].upper()}{keep[1:]}."
        raise ShapeMismatchError(
            f"Tensor {name!r} of shape {array.shape}: {scheme.name} quantizes groups of "
            f"{group} input columns, which do not divide its {columns} columns "
            f"(compressed-tensors refuses such a weight too). {fix}"
        )


def _global_scales(chosen: dict[str, LazyArray], separator: str) -> dict[str, GlobalScaleNode]:
    """NVFP4's global scale node of each weight, one per group of fused projections."""
    groups: dict[str, list[str]] = {}
    for path in chosen:
        match = FUSED.match(path.replace("/", separator))
        key = path if match is None else match.group(1) + ("/attn" if match.group(2) else "/mlp")
        groups.setdefault(key, []).append(path)
    nodes: dict[str, GlobalScaleNode] = {}
    for paths in groups.values():
        names = [path.replace("/", separator) for path in paths]
        node = GlobalScaleNode([chosen[path].node for path in paths], names)
        nodes.update(dict.fromkeys(paths, node))
    return nodes
