"""compressed-tensors' preset schemes that `quantize=` writes, and their ``quantization_config``.

Names are compressed-tensors' (``preset_name_to_scheme``), matched case-insensitively; the
config is the one its ``ModelCompressor.update_config`` writes for the scheme applied to
every ``Linear`` except the `ignore`d modules.

Example:
    >>> scheme = ct_scheme("w4a16", None)
    >>> scheme.name, scheme.kind, scheme.bits, scheme.group, scheme.format
    ('W4A16', 'int', 4, 128, 'pack-quantized')
    >>> ct_config(ct_scheme("W8A16", 32), ["lm_head"])["config_groups"]["group_0"]["weights"]
    {'dynamic': False, 'group_size': 32, 'num_bits': 8, 'strategy': 'group', 'symmetric': True, 'type': 'int'}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._errors import ArgumentError

CT_VERSION = "0.20.1"  # the compressed-tensors whose bytes and config these are (tests)


@dataclass(frozen=True)
class CTScheme:
    """A preset: `kind` ``int``, ``fp8`` or ``nvfp4``; `group` None for per-channel."""

    name: str
    kind: str
    bits: int
    group: int | None
    format: str

    def describe(self) -> str:
        grouping = f"group {self.group}" if self.group else "per output channel"
        what = {"int": f"INT{self.bits}", "fp8": "FP8 E4M3", "nvfp4": "NVFP4 (E2M1)"}[self.kind]
        return f"{self.name}: {what} weights, {grouping}, compressed-tensors {self.format}"


PRESETS = {
    "W4A16": CTScheme("W4A16", "int", 4, 128, "pack-quantized"),
    "W8A16": CTScheme("W8A16", "int", 8, 128, "pack-quantized"),
    "NVFP4A16": CTScheme("NVFP4A16", "nvfp4", 4, 16, "nvfp4-pack-quantized"),
    "FP8_DYNAMIC": CTScheme("FP8_DYNAMIC", "fp8", 8, None, "float-quantized"),
}
GROUPED = ("W4A16", "W8A16")  # the presets whose group size --group-size may change


def ct_scheme(name: str, group_size: int | None) -> CTScheme | None:
    """The preset named `name` (any case), with `group_size` where it has groups; None
    when `name` is not one of compressed-tensors' presets.

    Raises:
        ArgumentError: a `group_size` for a scheme without groups, or not a positive int.
    """
    scheme = PRESETS.get(name.upper().replace("-", "_"))
    if scheme is None or group_size is None:
        return scheme
    if scheme.name not in GROUPED:
        raise ArgumentError(
            f"group_size={group_size} (--group-size) does not apply to {scheme.name}: "
            f"{scheme.describe()}. Group sizes go with {' and '.join(GROUPED)}; drop it."
        )
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise ArgumentError(
            f"group_size={group_size!r}: expected a positive integer such as 32 or 128."
        )
    return CTScheme(scheme.name, scheme.kind, scheme.bits, group_size, scheme.format)


def _weights(scheme: CTScheme) -> dict[str, Any]:
    if scheme.kind == "int":
        return {
            "dynamic": False,
            "group_size": scheme.group,
            "num_bits": scheme.bits,
            "strategy": "group",
            "symmetric": True,
            "type": "int",
        }
    if scheme.kind == "nvfp4":
        return {
            "dynamic": False,
            "group_size": 16,
            "num_bits": 4,
            "scale_dtype": "torch.float8_e4m3fn",
            "strategy": "tensor_group",
            "symmetric": True,
            "type": "float",
        }
    return {
        "dynamic": False,
        "group_size": None,
        "num_bits": 8,
        "strategy": "channel",
        "symmetric": True,
        "type": "float",
    }


def ct_config(scheme: CTScheme, ignore: list[str]) -> dict[str, Any]:
    """The ``quantization_config`` compressed-tensors writes for `scheme` on ``Linear``
    layers, `ignore` the modules kept unquantized."""
    activations = None
    if scheme.kind == "fp8":  # FP8_DYNAMIC: activations quantized per token at run time
        activations = {
            "dynamic": True,
            "group_size": None,
            "num_bits": 8,
            "strategy": "token",
            "symmetric": True,
            "type": "float",
        }
    return {
        "config_groups": {
            "group_0": {
                "format": scheme.format,
                "input_activations": activations,
                "output_activations": None,
                "targets": ["Linear"],
                "weights": _weights(scheme),
            }
        },
        "format": scheme.format,
        "global_compression_ratio": None,
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "moe_sparsity_config": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": CT_VERSION,
    }
