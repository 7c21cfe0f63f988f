"""A checkpoint's tensors, by name, dequantized or quantized as a whole set.

Dequantizing pairs each quantized tensor with its scales by name: FP8's ``X.weight`` with
``X.weight_scale_inv`` (any ``N`` with ``N_scale_inv``), MXFP4's ``N_blocks`` with
``N_scales``; the pair becomes one lazy tensor under the plain name (``X.weight``, ``N``),
and every other tensor passes through. Everything is checked against the scheme before
anything is read: a scale of the wrong shape or dtype, or a quantized tensor without its
scales, is an error naming the tensor, never raw bytes passed off as weights.

Quantizing (``"fp8-block"``) turns every 2-D floating-point linear weight, except those
`DEFAULT_KEEP` or the caller's patterns keep, into ``weight`` (F8_E4M3) and
``weight_scale_inv`` (float32, one per 128 x 128 block).

Example:
    >>> import numpy as np, ml_dtypes
    >>> from suture._lazy.array import LazyArray
    >>> tensors = {
    ...     "a.weight": LazyArray.from_array(np.ones((3, 3), ml_dtypes.float8_e4m3fn)),
    ...     "a.weight_scale_inv": LazyArray.from_array(np.full((1, 1), 0.5, np.float32)),
    ...     "a.bias": LazyArray.from_array(np.zeros(3, np.float32)),
    ... }
    >>> out = dequantize_tensors(tensors, Scheme("fp8", (128, 128)), np.dtype("float32"), "m")
    >>> list(out), out["a.weight"].read()[0].tolist()
    (['a.weight', 'a.bias'], [0.5, 0.5, 0.5])
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .._errors import ArgumentError, CorruptCheckpointError
from .._lazy.array import LazyArray, as_lazy
from .._paths import flatten, unflatten
from .._patterns import compile_pattern, search
from .compressed import dequantize_compressed
from .grouped import E2M1Codec, GroupedDequantNode
from .modelopt import dequantize_modelopt
from .nodes import FP8DequantNode, MXFP4DequantNode, quantized_pair
from .scheme import FP8_BLOCK, Scheme, fp8_block_config

FP8_SCALE_SUFFIX = "_scale_inv"
V4_SCALE_SUFFIX = ".scale"  # DeepSeek-V4: ``X.weight`` + ``X.scale``
FP4_GROUP = 32  # DeepSeek-V4's FP4 experts: one UE8M0 scale per 32 values of a row
FP4_DTYPES = ("int8", "uint8")  # packed E2M1 bytes (the F4 dtype is read as uint8)
FP4_SCALE_DTYPES = ("float8_e8m0fnu", "uint8", "float32", "bfloat16")
MXFP4_SUFFIXES = ("_blocks", "_scales")
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
FP8_SCALE_DTYPES = ("float32", "bfloat16", "float16", "float8_e8m0fnu", "uint8")
# Kept in high precision by `quantize="fp8-block"`, as DeepSeek-V3's published checkpoint
# keeps them: embeddings, norms, the LM head, and MoE routers (DeepSeek's `mlp.gate`).
DEFAULT_KEEP = (r"embed", r"norm", r"lm_head", r"\.gate\.weight$", r"router")
# transformers v5's fused expert tensors (save_pretrained(save_original_format=False))
FUSED_EXPERTS = re.compile(r"\.experts\.(gate_up_proj|gate_proj|up_proj|down_proj)$")


def is_quantized_name(name: str) -> bool:
    """Whether `name` is a scale or packed tensor of a quantized pair."""
    return name.endswith((FP8_SCALE_SUFFIX, *MXFP4_SUFFIXES))


def dequantize_tensors(
    tensors: dict[str, LazyArray],
    scheme: Scheme,
    dtype: np.dtype,
    where: str,
    packed_fp4: frozenset[str] = frozenset(),
) -> dict[str, LazyArray]:
    """`tensors` with each quantized pair replaced by its lazy dequantized tensor.

    `packed_fp4` names the tensors a safetensors header declares ``F4`` (read as bytes).
    A tensor still stored quantized after the scheme's pairing (another format's codes,
    scales or packed words, or a quantized tensor whose pair is missing) is refused: passed
    on, its codes would be read as values under a config that says they are dequantized.
    """
    if scheme.method == "compressed-tensors":
        result = dequantize_compressed(tensors, scheme.details, dtype, where)
    elif scheme.method == "modelopt":
        result = dequantize_modelopt(tensors, scheme.details, dtype, where)
    elif scheme.method == "mxfp4":
        result = _dequantize_mxfp4(tensors, dtype, where)
    else:
        result = _dequantize_fp8(tensors, scheme, dtype, where, packed_fp4)
    for name, array in result.items():
        if tensors.get(name) is array:  # passed through as stored
            _refuse_if_stored_quantized(name, array, tensors, scheme.method, where, packed_fp4)
    return result


E8M0_DTYPES = ("float8_e8m0fnu", "uint8")


def _stored_form(name: str, array: LazyArray, tensors: dict[str, LazyArray]) -> str | None:
    """What `name` holds when it looks like a quantized format's stored part, else None."""
    if array.dtype.name in FP8_DTYPES:
        return f"{array.dtype.name}, FP8 codes"
    if name.endswith(FP8_SCALE_SUFFIX):
        return f"{array.dtype.name}, an FP8 block scale"
    if name.endswith(".weight_packed"):
        return f"{array.dtype.name}, compressed-tensors' packed values"
    if name.endswith("_blocks") and name[: -len("_blocks")] + "_scales" in tensors:
        return f"{array.dtype.name}, MXFP4 blocks"
    return None


def _refuse_if_stored_quantized(
    name: str,
    array: LazyArray,
    tensors: dict[str, LazyArray],
    method: str,
    where: str,
    packed_fp4: frozenset[str],
) -> None:
    found = "F4, packed E2M1 values" if name in packed_fp4 else _stored_form(name, array, tensors)
    if found is None:
        return
    raise CorruptCheckpointError(
        f"{where}: tensor {name!r} is stored quantized ({found}), and the config's "
        f"{method!r} quantization_config pairs it with nothing, so it cannot be dequantized: "
        f"passed on, its codes would be read as values. Expected every quantized tensor in "
        f"the config's format with its scales beside it; the checkpoint mixes formats, lacks "
        f"a scale, or its config names the wrong scheme. Open it without dequantize to see "
        f"the stored tensors."
    )


def _dequantize_fp8(
    tensors: dict[str, LazyArray],
    scheme: Scheme,
    dtype: np.dtype,
    where: str,
    packed_fp4: frozenset[str] = frozenset(),
) -> dict[str, LazyArray]:
    result: dict[str, LazyArray] = {}
    scales = {name for name in tensors if name.endswith(FP8_SCALE_SUFFIX)}
    for name in scales:
        if name[: -len(FP8_SCALE_SUFFIX)] not in tensors:
            raise CorruptCheckpointError(
                f"{where}: scale tensor {name!r} has no weight {name[: -len(FP8_SCALE_SUFFIX)]!r} "
                f"beside it. The checkpoint is incomplete (a missing shard?)."
            )
    scales |= {_v4_scale_name(name) for name in tensors if _v4_scale_of(name, tensors)}
    for name, array in tensors.items():
        if (
            name.endswith(V4_SCALE_SUFFIX)
            and array.dtype.name in E8M0_DTYPES
            and name not in scales
        ):
            weight = name[: -len(V4_SCALE_SUFFIX)] + ".weight"
            there = tensors.get(weight)
            beside = "is missing" if there is None else f"is {there.dtype.name}, not FP8 or FP4"
            raise CorruptCheckpointError(
                f"{where}: UE8M0 scale tensor {name!r} ({array.dtype.name}) scales no quantized "
                f"weight: {weight!r} {beside}. Expected an FP8 or FP4 {weight!r} beside it; the "
                f"checkpoint is incomplete or damaged."
            )
    for name, array in tensors.items():
        if name in scales:
            continue
        scale_name = name + FP8_SCALE_SUFFIX
        if scale_name not in tensors and _v4_scale_of(name, tensors):
            scale_name = _v4_scale_name(name)
        scale = tensors.get(scale_name)
        if scale is None:
            if name in packed_fp4:
                raise CorruptCheckpointError(
                    f"{where}: tensor {name!r} is F4 (packed E2M1 values) but has no "
                    f"{_v4_scale_name(name) if name.endswith('.weight') else name + '.scale'!r}: "
                    f"its values cannot be dequantized. Expected every FP4 tensor to have its "
                    f"UE8M0 scales (one per {FP4_GROUP} values); the checkpoint is incomplete."
                )
            if array.dtype.name in FP8_DTYPES:
                raise CorruptCheckpointError(
                    f"{where}: tensor {name!r} is {array.dtype.name} but has no "
                    f"{name + FP8_SCALE_SUFFIX!r}: its values cannot be dequantized. Expected "
                    f"every FP8 tensor to have its scales; the checkpoint is incomplete."
                )
            result[name] = array
            continue
        if array.dtype.name in FP4_DTYPES:
            result[name] = _fp4_experts(name, array, scale, scale_name, dtype, where)
            continue
        block = _fp8_block(name, array, scale, scheme, where, scale_name)
        label = f"fp8 {block[0]}x{block[1]} blocks"
        node = FP8DequantNode(array.node, scale.node, block, dtype, label, name, scale_name)
        result[name] = LazyArray(node, path=array.path)
    return result


def _v4_scale_name(name: str) -> str:
    return name[: -len(".weight")] + V4_SCALE_SUFFIX


def _v4_scale_of(name: str, tensors: dict[str, LazyArray]) -> bool:
    """Whether `name` is a quantized ``X.weight`` (FP8, or FP4 bytes) with a DeepSeek-V4
    ``X.scale`` beside it (a ``.scale`` beside a float weight is an ordinary tensor)."""
    if not name.endswith(".weight") or _v4_scale_name(name) not in tensors:
        return False
    return tensors[name].dtype.name in (*FP8_DTYPES, *FP4_DTYPES)


def _fp4_experts(
    name: str, weight: LazyArray, scale: LazyArray, scale_name: str, dtype: np.dtype, where: str
) -> LazyArray:
    """DeepSeek-V4's FP4 weight: E2M1 bytes ``(..., rows, cols / 2)``, low nibble first, and
    a scale per 32 values of each row ``(..., rows, cols / 32)``."""
    if weight.ndim < 2:
        raise CorruptCheckpointError(
            f"{where}: FP4 tensor {name!r} has shape {weight.shape}; expected (..., rows, "
            f"cols / 2) bytes of two E2M1 values."
        )
    cols = weight.shape[-1] * 2
    if cols % FP4_GROUP:
        raise CorruptCheckpointError(
            f"{where}: FP4 tensor {name!r} holds {cols} values a row, which the group of "
            f"{FP4_GROUP} values per scale does not divide: expected a multiple of {FP4_GROUP}."
        )
    expected = (*weight.shape[:-1], cols // FP4_GROUP)
    if scale.dtype.name not in FP4_SCALE_DTYPES or scale.shape != expected:
        raise CorruptCheckpointError(
            f"{where}: scale tensor {scale_name!r} is {scale.dtype.name} of shape {scale.shape}; "
            f"FP4 weight {name!r} ({weight.shape[-2]} rows of {cols} values) needs "
            f"float8_e8m0fnu (UE8M0) of shape {expected}: one scale per {FP4_GROUP} values "
            f"of each row."
        )
    codec = E2M1Codec(
        weight.node, scale.node, FP4_GROUP, name, scale_name, label="fp4 e2m1 group 32"
    )
    return LazyArray(GroupedDequantNode(codec, dtype), path=weight.path)


def _fp8_block(
    name: str,
    weight: LazyArray,
    scale: LazyArray,
    scheme: Scheme,
    where: str,
    scale_name: str | None = None,
) -> tuple[int, int]:
    """The block of `weight`'s scales, once their dtypes and shapes are checked."""
    scale_name = scale_name or name + FP8_SCALE_SUFFIX
    if weight.dtype.name not in FP8_DTYPES:
        raise CorruptCheckpointError(
            f"{where}: tensor {name!r} has scales ({scale_name!r}) but is {weight.dtype.name}; "
            f"expected float8_e4m3fn (F8_E4M3) values."
        )
    if scale.dtype.name not in FP8_SCALE_DTYPES:
        raise CorruptCheckpointError(
            f"{where}: scale tensor {scale_name!r} is {scale.dtype.name}; expected float32 "
            f"(or bfloat16, float16, or E8M0 as float8_e8m0fnu/uint8 for ue8m0)."
        )
    if weight.ndim < 2 or scale.ndim != weight.ndim or scale.shape[:-2] != weight.shape[:-2]:
        raise CorruptCheckpointError(
            f"{where}: scale tensor {scale_name!r} has shape {scale.shape}, which does not "
            f"fit weight {name!r} of shape {weight.shape}: expected the weight's leading axes "
            f"and one scale per block of its last two axes."
        )
    rows, cols = weight.shape[-2:]
    if scheme.block is not None:
        block = scheme.block
        expected = (*weight.shape[:-2], -(-rows // block[0]), -(-cols // block[1]))
        if scale.shape != expected:
            raise CorruptCheckpointError(
                f"{where}: scale tensor {scale_name!r} has shape {scale.shape}; with "
                f"weight_block_size {list(block)} the weight {name!r} of shape {weight.shape} "
                f"needs {expected} (one scale per block, edge blocks included). The scales do "
                f"not divide the weight as the config declares."
            )
        return block
    scale_rows, scale_cols = scale.shape[-2:]
    if not scale_rows or not scale_cols or rows % scale_rows or cols % scale_cols:
        raise CorruptCheckpointError(
            f"{where}: scale tensor {scale_name!r} of shape {scale.shape} does not divide weight "
            f"{name!r} of shape {weight.shape} into equal blocks, and the config gives no "
            f"weight_block_size."
        )
    return rows // scale_rows, cols // scale_cols


def _dequantize_mxfp4(
    tensors: dict[str, LazyArray], dtype: np.dtype, where: str
) -> dict[str, LazyArray]:
    result: dict[str, LazyArray] = {}
    for name, array in tensors.items():
        if name.endswith("_scales"):
            if name[: -len("_scales")] + "_blocks" not in tensors:
                raise CorruptCheckpointError(
                    f"{where}: MXFP4 scales {name!r} have no {name[: -len('_scales')] + '_blocks'!r} "
                    f"beside them. The checkpoint is incomplete (a missing shard?)."
                )
            continue
        if not name.endswith("_blocks"):
            result[name] = array
            continue
        base = name[: -len("_blocks")]
        if base in tensors:
            raise CorruptCheckpointError(
                f"{where}: MXFP4 tensor {name!r} dequantizes to {base!r}, but the checkpoint also "
                f"holds a tensor {base!r} ({tensors[base].dtype.name} of shape "
                f"{tensors[base].shape}): one would silently replace the other. Expected one of "
                f"them; the checkpoint holds a packed and a plain copy of the same weight."
            )
        scales = tensors.get(base + "_scales")
        if scales is None:
            raise CorruptCheckpointError(
                f"{where}: MXFP4 tensor {name!r} has no {base + '_scales'!r}: its values cannot "
                f"be dequantized. The checkpoint is incomplete (a missing shard?)."
            )
        if array.dtype.name != "uint8" or array.ndim < 3 or array.shape[-1] != 16:
            raise CorruptCheckpointError(
                f"{where}: MXFP4 tensor {name!r} is {array.dtype.name} of shape {array.shape}; "
                f"expected uint8 (U8) of shape (..., rows, groups, 16): 32 FP4 values in 16 bytes."
            )
        if scales.dtype.name not in ("uint8", "float8_e8m0fnu") or scales.shape != array.shape[:-1]:
            raise CorruptCheckpointError(
                f"{where}: MXFP4 scales {base + '_scales'!r} are {scales.dtype.name} of shape "
                f"{scales.shape}; expected uint8 (E8M0) of shape {array.shape[:-1]}, one per "
                f"32 values of {name!r}."
            )
        node = MXFP4DequantNode(array.node, scales.node, dtype, "mxfp4", base)
        path = array.path[: -len("_blocks")] if array.path else None
        result[base] = LazyArray(node, path=path)
    return result


def quantize_tensors(
    tensors: dict[str, LazyArray], keep: tuple[str, ...] | None = None
) -> tuple[dict[str, LazyArray], list[str]]:
    """FP8 block quantization of `tensors` (names joined by ``.``), and the kept modules.

    A tensor is quantized when it is a floating-point 2-D ``weight`` whose name matches none
    of `keep` (`DEFAULT_KEEP` when None; each a regular expression searched in the name).
    Returns the new tensors, each quantized weight followed by its ``weight_scale_inv``, and
    the modules of the 2-D weights kept in high precision (for ``modules_to_not_convert``).
    """
    patterns = [
        compile_pattern(p, "keep-unquantized") for p in (DEFAULT_KEEP if keep is None else keep)
    ]
    result: dict[str, LazyArray] = {}
    kept: list[str] = []
    for name, array in tensors.items():
        high_precision = array.dtype.name in ("float32", "float16", "bfloat16", "float64")
        linear = array.ndim == 2 and name.rsplit(".", 1)[-1] == "weight" and high_precision
        if high_precision and FUSED_EXPERTS.search(name) and array.ndim == 3:
            # transformers' fused experts (E, out, in): its FP8 experts module wants scales
            # of another layout, so they stay as they are and are named as not converted
            result[name] = array
            module = name.rsplit(".", 1)[0]
            if module not in kept:
                kept.append(module)
            continue
        if not linear:
            result[name] = array
            continue
        if any(search(pattern, name) for pattern in patterns):
            result[name] = array
            kept.append(name[: -len(".weight")])
            continue
        values, scales = quantized_pair(array.node, FP8_BLOCK, name)
        result[name] = LazyArray(values, path=array.path)
        result[name + FP8_SCALE_SUFFIX] = LazyArray(scales, path=None)
    return result, kept


def describe_quantized(tensors: dict[str, Any]) -> str | None:
    """How the tensor names look quantized (for `suture inspect` on a folder without a config)."""
    if any(name.endswith(FP8_SCALE_SUFFIX) for name in tensors):
        return "fp8"
    if any(name.endswith("_blocks") for name in tensors):
        return "mxfp4"
    return None


QUANTIZE_METHODS = ("fp8-block",)


def quantize_tree(
    tree: Any, method: str, keep: tuple[str, ...] | None, separator: str = "."
) -> tuple[Any, dict[str, Any]]:
    """`tree` with its linear weights quantized (`quantize_tensors`), and the output's
    ``quantization_config``. Names for `keep` join the tree's keys with `separator`."""
    if method not in QUANTIZE_METHODS:
        raise ArgumentError(
            f"Unknown quantize={method!r}: suture writes {', '.join(QUANTIZE_METHODS)} (FP8 E4M3 "
            f"with a float32 scale per 128x128 block, DeepSeek-V3's layout)."
        )
    flat = flatten(tree)
    arrays = {
        path.replace("/", separator): as_lazy(leaf, path=path)
        for path, leaf in flat.items()
        if isinstance(leaf, LazyArray) or (hasattr(leaf, "shape") and hasattr(leaf, "dtype"))
    }
    quantized, kept = quantize_tensors(arrays, keep)
    by_name = {path.replace("/", separator): path for path in flat}
    result: dict[str, Any] = {}
    for path, leaf in flat.items():
        name = path.replace("/", separator)
        if name not in arrays:
            result[path] = leaf
            continue
        result[path] = quantized[name]
        scale = quantized.get(name + FP8_SCALE_SUFFIX)
        if scale is not None and name + FP8_SCALE_SUFFIX not in by_name:
            result[path + FP8_SCALE_SUFFIX] = scale
    return unflatten(result), fp8_block_config(FP8_BLOCK, kept)


QUANTIZATION_FILES = ("hf_quant_config.json",)  # ModelOpt's config, beside config.json


def dequantized_files(side: dict[str, Any]) -> dict[str, Any]:
    """The side files of a dequantized output: those of the source but a quantization config."""
    return {name: file for name, file in side.items() if name not in QUANTIZATION_FILES}


def dequantized_config(dtype: str) -> Any:
    """The edit of a ``config.json`` for a dequantized output: no ``quantization_config``,
    its dtype fields `dtype`."""

    def edit(config: dict[str, Any]) -> dict[str, Any]:
        edited = {key: value for key, value in config.items() if key != "quantization_config"}
        text = edited.get("text_config")
        if isinstance(text, dict) and "quantization_config" in text:  # Kimi K2.5 keeps it there
            edited["text_config"] = {k: v for k, v in text.items() if k != "quantization_config"}
        fields = [key for key in ("torch_dtype", "dtype") if key in edited] or ["torch_dtype"]
        for key in fields:
            edited[key] = dtype
        return edited

    return edit


def quantized_config(quantization: dict[str, Any]) -> Any:
    """The edit of a ``config.json`` for a quantized output: its ``quantization_config``."""
    return lambda config: {**config, "quantization_config": quantization}
