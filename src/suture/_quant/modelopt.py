"""NVIDIA ModelOpt NVFP4 checkpoints: the config, and each module's tensors paired.

ModelOpt's Hugging Face export stores ``M.weight`` as uint8 (two E2M1 values a byte, low
nibble first), ``M.weight_scale`` FP8 E4M3 per 16 values of a row, ``M.weight_scale_2`` a
0-D float32 that multiplies them, and ``M.input_scale`` (0-D, for activations, left out of a
dequantized checkpoint). Its config is ``hf_quant_config.json`` (``{"quantization":
{"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": [...]}}``) or, in newer
exports, a ``quantization_config`` with ``quant_method: modelopt``. The value is ModelOpt's
``NVFP4QTensor.dequantize``: ``e2m1 * (float32(weight_scale) * weight_scale_2)``, its
nibble 8 +0.0.

Example:
    >>> parse_config({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "m")
    ModelOptConfig(algorithm='NVFP4', group_size=16, exclude=())
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import ConfigMismatchError, CorruptCheckpointError, UnsupportedError
from .._lazy.array import LazyArray
from .compressed import check_nvfp4
from .e2m1 import E2M1_POSITIVE_ZERO
from .grouped import E2M1Codec, GroupedDequantNode

ALGORITHMS = ("NVFP4", "W4A16_NVFP4")
DROPPED = ("input_scale", "k_scale", "v_scale")


@dataclass(frozen=True)
class ModelOptConfig:
    algorithm: str
    group_size: int
    exclude: tuple[str, ...]

    def describe(self) -> str:
        return (
            f"ModelOpt {self.algorithm} (E2M1 values, an E4M3 scale per {self.group_size} "
            f"times weight_scale_2)"
        )


def parse_config(config: dict[str, Any], where: str) -> ModelOptConfig:
    """The `ModelOptConfig` of a ``quant_method: modelopt`` config (``hf_quant_config.json``'s
    ``quantization`` section merged in), checked."""
    details = {**config, **(config.get("quantization") or {})}
    algorithm = details.get("quant_algo")
    if algorithm not in ALGORITHMS:
        raise UnsupportedError(
            f"{where}: ModelOpt quant_algo {algorithm!r}; suture dequantizes ModelOpt "
            f"{' and '.join(ALGORITHMS)}."
        )
    size = details.get("group_size")
    if size is None:
        for group in (details.get("config_groups") or {}).values():
            size = ((group or {}).get("weights") or {}).get("group_size", size)
    size = 16 if size is None else size
    if not (isinstance(size, int) and not isinstance(size, bool) and size > 0 and size % 2 == 0):
        raise ConfigMismatchError(
            f"{where}: ModelOpt group_size is {size!r}; expected a positive even integer (16)."
        )
    exclude = details.get("exclude_modules") or details.get("ignore") or []
    return ModelOptConfig(algorithm, size, tuple(str(item) for item in exclude))


def dequantize_modelopt(
    tensors: dict[str, LazyArray], config: ModelOptConfig, dtype: np.dtype, where: str
) -> dict[str, LazyArray]:
    """`tensors` with each module's uint8 ``weight``, ``weight_scale`` and ``weight_scale_2``
    replaced by one lazy ``M.weight``."""
    modules = [
        name[: -len(".weight_scale")]
        for name in tensors
        if name.endswith(".weight_scale") and tensors[name].dtype.name == "float8_e4m3fn"
    ]
    consumed: set[str] = set()
    made: dict[str, LazyArray] = {}
    for module in modules:
        weight_name = module + ".weight"
        if weight_name not in tensors:
            raise CorruptCheckpointError(
                f"{where}: scale tensor {module + '.weight_scale'!r} has no weight "
                f"{weight_name!r} beside it. The checkpoint is incomplete (a missing shard?)."
            )
        second = module + ".weight_scale_2"
        if second not in tensors:
            raise CorruptCheckpointError(
                f"{where}: quantized tensor {weight_name!r} has no {second!r}: its values cannot "
                f"be dequantized. Expected it beside every NVFP4 weight; the checkpoint is "
                f"incomplete."
            )
        packed, scales, scale_2 = (
            tensors[weight_name],
            tensors[module + ".weight_scale"],
            tensors[second],
        )
        check_nvfp4(
            packed,
            scales,
            scale_2,
            config.group_size,
            weight_name,
            module + ".weight_scale",
            second,
            where,
        )
        codec = E2M1Codec(
            packed.node,
            scales.node,
            config.group_size,
            weight_name,
            module + ".weight_scale",
            table=E2M1_POSITIVE_ZERO,
            global_scale=scale_2.node,
            global_op="multiply",
            label=f"nvfp4 group {config.group_size} x weight_scale_2",
        )
        made[weight_name] = LazyArray(GroupedDequantNode(codec, dtype), path=weight_name)
        consumed.update({module + ".weight_scale", second})
        consumed.update(f"{module}.{suffix}" for suffix in DROPPED)
    result: dict[str, LazyArray] = {}
    for name, array in tensors.items():
        if name in consumed:
            continue
        if name in made:
            result[name] = made[name]
            continue
        stored = array.dtype.name in STORED and name.endswith(".weight")
        if stored and not _excluded(name, config):
            _refuse_stored(name, array, tensors, where)
        if array.dtype.name == "float8_e4m3fn" and _excluded(name, config):
            raise CorruptCheckpointError(
                f"{where}: tensor {name!r} is float8_e4m3fn in a module that "
                f"hf_quant_config.json's exclude_modules keeps out of NVFP4: a layer of another "
                f"scheme (FP8) in a mixed-precision export, whose codes would be read as values. "
                f"suture reads ModelOpt NVFP4 with the excluded layers in high precision; export "
                f"those layers to real values with ModelOpt first."
            )
        result[name] = array
    return result


STORED = ("uint8", "float8_e4m3fn")  # codes that are no values without their scales


def _refuse_stored(name: str, array: LazyArray, tensors: dict[str, LazyArray], where: str) -> None:
    """A weight left stored (uint8 without E4M3 scales, or FP8 of another scheme): passed on
    as it is, its codes would be read as values."""
    scale_name = name[: -len(".weight")] + ".weight_scale"
    scale = tensors.get(scale_name)
    found = (
        f"has no {scale_name!r}"
        if scale is None
        else f"its {scale_name!r} is {scale.dtype.name} of shape {scale.shape}"
    )
    raise CorruptCheckpointError(
        f"{where}: tensor {name!r} is {array.dtype.name} (stored quantized) and {found}: its "
        f"values cannot be dequantized. suture reads ModelOpt "
        f"NVFP4 layers: uint8 weights with float8_e4m3fn (F8_E4M3) scales per group. A layer "
        f"of another scheme (FP8) needs ModelOpt's own export to real values first."
    )


def _excluded(name: str, config: ModelOptConfig) -> bool:
    module = name.rsplit(".", 1)[0]
    return any(fnmatch.fnmatchcase(module, pattern) for pattern in config.exclude)
