"""compressed-tensors checkpoints (llm-compressor's, Kimi K2's experts): the config, and
each module's stored tensors paired into one lazy weight.

Two formats are read, as compressed-tensors 0.20's own decompressors read them:

- ``pack-quantized``: ``M.weight_packed`` int32 (1 to 8 bits densely, `intpack`),
  ``M.weight_scale`` (a float per group of the input axis, per row, or per tensor),
  ``M.weight_shape`` (the logical shape), ``M.weight_zero_point`` when asymmetric.
- ``nvfp4-pack-quantized``: ``M.weight_packed`` uint8 (two E2M1 values, low nibble first),
  ``M.weight_scale`` FP8 E4M3 per 16 values, ``M.weight_global_scale`` that divides them.

Each becomes ``M.weight``; activation scales (``M.input_global_scale``, ``M.input_scale``)
are left out of a dequantized checkpoint.

Example:
    >>> config = {"format": "pack-quantized", "config_groups": {"group_0": {
    ...     "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
    ...     "symmetric": True, "strategy": "group", "group_size": 32}}}}
    >>> parse_config(config, "m").groups[0].describe()
    'INT4 pack-quantized, symmetric, a scale per 32'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._errors import ConfigMismatchError, CorruptCheckpointError, UnsupportedError
from .._lazy.array import LazyArray
from .grouped import E2M1Codec, GroupedDequantNode, IntCodec
from .intpack import packed_words

FORMATS = ("pack-quantized", "nvfp4-pack-quantized")
STRATEGIES = ("group", "channel", "tensor")
DROPPED = ("input_global_scale", "input_scale", "input_zero_point", "output_scale")
# the parts of a module that only its ``weight_packed`` gives a meaning
PACKED_PARTS = (".weight_zero_point", ".weight_shape", ".weight_g_idx")


@dataclass(frozen=True)
class Group:
    """One ``config_groups`` entry: which modules, which format, which weight arguments."""

    name: str
    targets: tuple[str, ...]
    format: str
    bits: int
    type: str
    strategy: str
    group_size: int | None
    symmetric: bool

    def describe(self) -> str:
        if self.format == "nvfp4-pack-quantized":
            return f"NVFP4 (E2M1, an E4M3 scale per {self.group_size} / global scale)"
        side = "symmetric" if self.symmetric else "asymmetric (zero points)"
        per = {"group": f"a scale per {self.group_size}", "channel": "a scale per row"}
        return f"INT{self.bits} {self.format}, {side}, {per.get(self.strategy, 'one scale')}"

    def matches(self, module: str) -> int:
        """How closely a target names `module`: 3 its name, 2 a pattern, 1 a class, 0 none."""
        best = 0
        for target in self.targets:
            if target == module:
                return 3
            if target.startswith("re:"):
                if re.match(target[3:], module):
                    best = max(best, 2)
            elif target[:1].isupper() and "." not in target:  # a module class (Linear)
                best = max(best, 1)
        return best


@dataclass(frozen=True)
class Config:
    groups: tuple[Group, ...]
    ignore: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        return "compressed-tensors " + "; ".join(group.describe() for group in self.groups)

    def group_of(self, module: str, where: str) -> Group:
        ranked = sorted(self.groups, key=lambda group: -group.matches(module))
        if not ranked or ranked[0].matches(module) == 0:
            raise ConfigMismatchError(
                f"{where}: module {module!r} is stored quantized (weight_packed) but no "
                f"config_groups entry targets it (targets: "
                f"{[list(group.targets) for group in self.groups]}). The config does not "
                f"describe the checkpoint."
            )
        return ranked[0]


def parse_config(config: dict[str, Any], where: str) -> Config:
    """The `Config` of a compressed-tensors ``quantization_config``, checked: a format,
    type, strategy or bit width suture does not read is an `UnsupportedError`."""
    groups = config.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ConfigMismatchError(
            f"{where}: a compressed-tensors quantization_config needs config_groups; found "
            f"{groups!r:.80}."
        )
    sparsity = config.get("sparsity_config")
    if isinstance(sparsity, dict) and sparsity.get("format", "dense") != "dense":
        raise UnsupportedError(
            f"{where}: sparsity_config format {sparsity.get('format')!r}; suture reads "
            f"compressed-tensors checkpoints without sparse compression."
        )
    default_format = config.get("format")
    parsed = [_group(name, entry, default_format, where) for name, entry in groups.items()]
    ignore = config.get("ignore") or []
    return Config(tuple(parsed), tuple(str(item) for item in ignore))


def _group(name: str, entry: Any, default_format: Any, where: str) -> Group:
    at = f"{where}: config_groups[{name!r}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("weights"), dict):
        raise ConfigMismatchError(f"{at} has no weights arguments; found {entry!r:.120}.")
    weights = entry["weights"]
    fmt = entry.get("format") or default_format
    if fmt not in FORMATS:
        raise UnsupportedError(
            f"{at}: format {fmt!r}; suture dequantizes compressed-tensors "
            f"{' and '.join(FORMATS)}. Decompress it with compressed-tensors first."
        )
    bits, kind = weights.get("num_bits"), weights.get("type", "int")
    strategy, size = weights.get("strategy"), weights.get("group_size")
    symmetric = bool(weights.get("symmetric", True))
    if fmt == "pack-quantized":
        if kind != "int" or not isinstance(bits, int) or not 1 <= bits <= 8:
            raise UnsupportedError(
                f"{at}: pack-quantized weights of type {kind!r} with num_bits={bits!r}; "
                f"expected int weights of 1 to 8 bits."
            )
        if strategy not in STRATEGIES:
            raise UnsupportedError(
                f"{at}: strategy {strategy!r}; suture reads pack-quantized weights with "
                f"strategy {', '.join(STRATEGIES)}."
            )
        if strategy == "tensor" and not symmetric:
            raise UnsupportedError(f"{at}: asymmetric per-tensor int weights are not supported.")
    else:
        if kind != "float" or bits != 4 or strategy not in (None, "tensor_group", "group"):
            raise UnsupportedError(
                f"{at}: nvfp4-pack-quantized with type {kind!r}, num_bits={bits!r}, strategy "
                f"{strategy!r}; expected float weights of 4 bits in tensor_group strategy."
            )
        if not symmetric:
            raise UnsupportedError(f"{at}: asymmetric NVFP4 is not supported.")
        strategy = "tensor_group"
    if strategy in ("group", "tensor_group") and not (
        isinstance(size, int) and not isinstance(size, bool) and size > 0
    ):
        raise ConfigMismatchError(
            f"{at}: group_size is {size!r}; the {strategy} strategy needs a positive integer."
        )
    if fmt == "nvfp4-pack-quantized" and size % 2:
        raise UnsupportedError(f"{at}: NVFP4 with an odd group_size {size}; expected 16.")
    targets = entry.get("targets") or []
    return Group(name, tuple(str(t) for t in targets), fmt, bits, kind, strategy, size, symmetric)


def dequantize_compressed(
    tensors: dict[str, LazyArray], config: Config, dtype: np.dtype, where: str
) -> dict[str, LazyArray]:
    """`tensors` with each module's packed weight, scales (and zero points, shape, global
    scale) replaced by one lazy ``M.weight``."""
    modules = [
        name[: -len(".weight_packed")] for name in tensors if name.endswith(".weight_packed")
    ]
    consumed: set[str] = set()
    made: dict[str, LazyArray] = {}
    for module in modules:
        plain = tensors.get(module + ".weight")
        if plain is not None:
            raise CorruptCheckpointError(
                f"{where}: {module + '.weight_packed'!r} dequantizes to {module + '.weight'!r}, "
                f"but the checkpoint also holds a tensor {module + '.weight'!r} "
                f"({plain.dtype.name} of shape {plain.shape}): one would silently replace the "
                f"other. Expected one of them; the checkpoint holds a packed and a plain copy "
                f"of the same weight."
            )
        group = config.group_of(module, where)
        if group.format == "nvfp4-pack-quantized":
            made[module + ".weight"], used = _nvfp4(tensors, module, group, dtype, where)
        else:
            made[module + ".weight"], used = _packed_int(tensors, module, group, dtype, where)
        consumed.update(used)
        consumed.update(f"{module}.{suffix}" for suffix in DROPPED)
    for name in tensors:
        if name.endswith((".weight_scale", ".weight_global_scale")) and name not in consumed:
            raise CorruptCheckpointError(
                f"{where}: scale tensor {name!r} has no {name.rsplit('.', 1)[0] + '.weight_packed'!r} "
                f"beside it. The checkpoint is incomplete (a missing shard?)."
            )
        if name.endswith(PACKED_PARTS) and name not in consumed:
            _refuse_part(name, tensors, where)
    result: dict[str, LazyArray] = {}
    for name, array in tensors.items():
        if name.endswith(".weight_packed"):
            module = name[: -len(".weight_packed")]
            result[module + ".weight"] = made[module + ".weight"]
        elif name not in consumed:
            result[name] = array
    return result


def _refuse_part(name: str, tensors: dict[str, LazyArray], where: str) -> None:
    """A part of a packed weight that nothing read: its weight is missing, or its config
    group stores no such part (a zero point of a symmetric scheme, NVFP4's included)."""
    packed = name.rsplit(".", 1)[0] + ".weight_packed"
    if packed in tensors:
        raise CorruptCheckpointError(
            f"{where}: tensor {name!r} sits beside {packed!r}, whose config group stores no "
            f"such part (a zero point of a symmetric scheme, NVFP4's included): the config and "
            f"the tensors disagree. Expected the config group the checkpoint was written with "
            f"(`symmetric: false` where it has zero points)."
        )
    raise CorruptCheckpointError(
        f"{where}: tensor {name!r} belongs to a packed weight {packed!r}, which the checkpoint "
        f"lacks. The checkpoint is incomplete (a missing shard?)."
    )


def _needed(tensors: dict[str, LazyArray], name: str, packed: str, where: str) -> LazyArray:
    found = tensors.get(name)
    if found is None:
        raise CorruptCheckpointError(
            f"{where}: quantized tensor {packed!r} has no {name!r}: its values cannot be "
            f"dequantized. Expected it beside every packed weight; the checkpoint is incomplete."
        )
    return found


def _logical_shape(shape_tensor: LazyArray, name: str, where: str) -> tuple[int, ...]:
    if shape_tensor.dtype.kind not in "iu" or shape_tensor.ndim != 1:
        raise CorruptCheckpointError(
            f"{where}: {name!r} is {shape_tensor.dtype.name} of shape {shape_tensor.shape}; "
            f"expected a 1-D integer tensor holding the weight's shape."
        )
    values = np.asarray(shape_tensor.read()).tolist()
    if any(value < 0 for value in values):
        raise CorruptCheckpointError(f"{where}: {name!r} holds {values}; expected sizes.")
    return tuple(int(value) for value in values)


def _packed_int(
    tensors: dict[str, LazyArray], module: str, group: Group, dtype: np.dtype, where: str
) -> tuple[LazyArray, list[str]]:
    packed_name = f"{module}.weight_packed"
    packed = tensors[packed_name]
    scale_name, shape_name = f"{module}.weight_scale", f"{module}.weight_shape"
    zero_name = f"{module}.weight_zero_point"
    if f"{module}.weight_g_idx" in tensors:
        raise UnsupportedError(
            f"{where}: {packed_name!r} has a weight_g_idx (activation-ordered groups); suture "
            f"does not read that layout. Decompress it with compressed-tensors first."
        )
    scales = _needed(tensors, scale_name, packed_name, where)
    shape = _logical_shape(_needed(tensors, shape_name, packed_name, where), shape_name, where)
    bits = group.bits
    if packed.dtype.name != "int32" or packed.ndim < 2:
        raise CorruptCheckpointError(
            f"{where}: {packed_name!r} is {packed.dtype.name} of shape {packed.shape}; expected "
            f"int32 words (I32) of shape (..., rows, ceil(cols * {bits} / 32))."
        )
    expected_packed = (*shape[:-1], packed_words(shape[-1], bits)) if shape else ()
    if len(shape) != packed.ndim or packed.shape != expected_packed:
        raise CorruptCheckpointError(
            f"{where}: {shape_name!r} says {shape}, but {packed_name!r} has shape "
            f"{packed.shape}: {bits}-bit values of that shape need {expected_packed} int32 "
            f"words. The packed weight and its weight_shape disagree (or the config's "
            f"num_bits={bits} is not the one the checkpoint was packed with)."
        )
    rows, cols = shape[-2:]
    if group.strategy == "group":
        size = group.group_size
        if cols % size:
            raise CorruptCheckpointError(
                f"{where}: {packed_name!r} has {cols} columns, which group_size {size} does not "
                f"divide (compressed-tensors refuses it too): expected a multiple of {size}."
            )
        expected = (*shape[:-1], cols // size)
    elif group.strategy == "channel":
        size, expected = cols, (*shape[:-1], 1)
    else:
        size, expected = cols, None
    if scales.dtype.name not in ("float32", "bfloat16", "float16"):
        raise CorruptCheckpointError(
            f"{where}: scale tensor {scale_name!r} is {scales.dtype.name}; expected float32, "
            f"bfloat16 or float16."
        )
    if (expected is None and scales.size != 1) or (
        expected is not None and scales.shape != expected
    ):
        raise CorruptCheckpointError(
            f"{where}: scale tensor {scale_name!r} has shape {scales.shape}; weight "
            f"{module + '.weight'!r} of shape {shape} with strategy {group.strategy!r}"
            f"{f' and group_size {size}' if group.strategy == 'group' else ''} needs "
            f"{expected if expected is not None else 'one value'}."
        )
    zero_points = tensors.get(zero_name)
    used = [packed_name, scale_name, shape_name]
    if group.symmetric and zero_points is not None:
        raise CorruptCheckpointError(
            f"{where}: {zero_name!r} is present but config group {group.name!r} is symmetric; "
            f"expected no zero points. The config does not describe the checkpoint."
        )
    if not group.symmetric:
        zero_points = _needed(tensors, zero_name, packed_name, where)
        zero_shape = (*shape[:-2], packed_words(rows, bits), expected[-1])
        if zero_points.dtype.name != "int32" or zero_points.shape != zero_shape:
            raise CorruptCheckpointError(
                f"{where}: zero points {zero_name!r} are {zero_points.dtype.name} of shape "
                f"{zero_points.shape}; expected int32 of shape {zero_shape} ({bits}-bit values "
                f"packed along the rows)."
            )
        used.append(zero_name)
    codec = IntCodec(
        packed.node,
        scales.node,
        None if zero_points is None else zero_points.node,
        shape,
        bits,
        size,
        module + ".weight",
        scale_name,
        f"int{bits} pack-quantized, "
        + {"group": f"group {size}", "channel": "a scale per row"}.get(group.strategy, "one scale"),
    )
    return LazyArray(GroupedDequantNode(codec, dtype), path=module + ".weight"), used


def _nvfp4(
    tensors: dict[str, LazyArray], module: str, group: Group, dtype: np.dtype, where: str
) -> tuple[LazyArray, list[str]]:
    packed_name = f"{module}.weight_packed"
    packed = tensors[packed_name]
    scale_name, global_name = f"{module}.weight_scale", f"{module}.weight_global_scale"
    scales = _needed(tensors, scale_name, packed_name, where)
    global_scale = _needed(tensors, global_name, packed_name, where)
    check_nvfp4(
        packed, scales, global_scale, group.group_size, packed_name, scale_name, global_name, where
    )
    codec = E2M1Codec(
        packed.node,
        scales.node,
        group.group_size,
        module + ".weight",
        scale_name,
        global_scale=global_scale.node,
        global_op="divide",
        label=f"nvfp4 group {group.group_size} / global scale",
    )
    used = [packed_name, scale_name, global_name]
    return LazyArray(GroupedDequantNode(codec, dtype), path=module + ".weight"), used


def check_nvfp4(
    packed: LazyArray,
    scales: LazyArray,
    global_scale: LazyArray,
    size: int,
    packed_name: str,
    scale_name: str,
    global_name: str,
    where: str,
) -> None:
    """The dtypes and shapes of an NVFP4 weight's tensors, or an error naming the first that
    does not fit."""
    if packed.dtype.name != "uint8" or packed.ndim < 2:
        raise CorruptCheckpointError(
            f"{where}: {packed_name!r} is {packed.dtype.name} of shape {packed.shape}; expected "
            f"uint8 (U8) of shape (..., rows, cols / 2): two E2M1 values a byte."
        )
    cols = packed.shape[-1] * 2
    if cols % size:
        raise CorruptCheckpointError(
            f"{where}: {packed_name!r} has {cols} values a row, which group_size {size} does "
            f"not divide: expected a multiple of {size}."
        )
    expected = (*packed.shape[:-1], cols // size)
    if scales.dtype.name not in ("float8_e4m3fn", "float32", "bfloat16", "float16"):
        raise CorruptCheckpointError(
            f"{where}: scale tensor {scale_name!r} is {scales.dtype.name}; expected "
            f"float8_e4m3fn (F8_E4M3)."
        )
    if scales.shape != expected:
        raise CorruptCheckpointError(
            f"{where}: scale tensor {scale_name!r} has shape {scales.shape}; weight "
            f"{packed_name!r} of {cols} values a row with group_size {size} needs {expected} "
            f"(one scale per {size} values of each row)."
        )
    if global_scale.size != 1 or global_scale.dtype.kind != "f":
        raise CorruptCheckpointError(
            f"{where}: {global_name!r} is {global_scale.dtype.name} of shape "
            f"{global_scale.shape}; expected one float32 value."
        )
