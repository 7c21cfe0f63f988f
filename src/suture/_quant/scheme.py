"""A Hugging Face ``quantization_config``, read and checked: which scheme, which block size.

Example:
    >>> scheme_of({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, "x")
    Scheme(method='fp8', block=(128, 128), scale_fmt=None)
    >>> scheme_of({"quant_method": "mxfp4"}, "x").describe()
    'MXFP4 (E2M1 values, an E8M0 scale per 32)'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._errors import ConfigMismatchError, UnsupportedError

SUPPORTED = ("fp8", "mxfp4", "compressed-tensors", "modelopt")
EXPERT_DTYPES = (None, "fp8", "fp4")  # DeepSeek-V4's FP4 experts beside FP8 weights
FP8_BLOCK = (128, 128)  # DeepSeek-V3's, Kimi-K2's, and `quantize="fp8-block"`'s


@dataclass(frozen=True)
class Scheme:
    """How a checkpoint is quantized: ``fp8`` with `block` scales, ``mxfp4``, or a format
    whose parsed config is `details` (``compressed-tensors``, ``modelopt``)."""

    method: str
    block: tuple[int, int] | None = None
    scale_fmt: str | None = None
    details: Any = field(default=None, repr=False, compare=False)

    def describe(self) -> str:
        if self.method == "mxfp4":
            return "MXFP4 (E2M1 values, an E8M0 scale per 32)"
        if self.details is not None:
            return str(self.details.describe())
        block = f"{self.block[0]}x{self.block[1]} blocks" if self.block else "one scale per tensor"
        fmt = f", {self.scale_fmt} scales" if self.scale_fmt else ""
        return f"FP8 E4M3 with {block}{fmt}"


def scheme_of(config: Any, where: str) -> Scheme:
    """The `Scheme` of a ``quantization_config`` (from `where`, named in errors).

    Raises:
        UnsupportedError: a method suture does not dequantize (GPTQ, AWQ, bitsandbytes ...).
        ConfigMismatchError: a config that is not what its method declares.
    """
    if not isinstance(config, dict):
        raise ConfigMismatchError(
            f"The quantization_config of {where} is {config!r:.80}; expected a JSON object."
        )
    method = config.get("quant_method")
    if method not in SUPPORTED:
        raise UnsupportedError(
            f"{where} is quantized with quant_method={method!r}, which suture does not "
            f"support yet: it dequantizes {', '.join(SUPPORTED)} (FP8 with block scales and "
            f"FP4 experts, as DeepSeek publishes; MXFP4, as gpt-oss does; compressed-tensors "
            f"pack-quantized and nvfp4-pack-quantized; ModelOpt NVFP4). Dequantize it with the "
            f"tool that made it, or open it without dequantize to see the stored tensors."
        )
    if method == "mxfp4":
        return Scheme("mxfp4")
    if method == "compressed-tensors":
        from .compressed import parse_config

        return Scheme(method, details=parse_config(config, where))
    if method == "modelopt":
        from .modelopt import parse_config as parse_modelopt

        return Scheme(method, details=parse_modelopt(config, where))
    fmt = config.get("fmt", "e4m3")
    if fmt not in ("e4m3", "float8_e4m3fn"):
        raise UnsupportedError(
            f"{where}: FP8 with fmt={fmt!r}; suture reads fmt 'e4m3' (float8_e4m3fn) weights."
        )
    block = config.get("weight_block_size")
    if block is not None and not (
        isinstance(block, list)
        and len(block) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in block)
    ):
        raise ConfigMismatchError(
            f"{where}: weight_block_size is {block!r:.80}; expected two positive integers such "
            f"as [128, 128]."
        )
    scale_fmt = config.get("scale_fmt")
    if scale_fmt not in (None, "float", "ue8m0"):
        raise UnsupportedError(
            f"{where}: FP8 scale_fmt={scale_fmt!r}; suture reads float scales and 'ue8m0'."
        )
    scale_fmt = None if scale_fmt == "float" else scale_fmt
    if config.get("expert_dtype") not in EXPERT_DTYPES:
        raise UnsupportedError(
            f"{where}: FP8 with expert_dtype={config.get('expert_dtype')!r}; suture reads "
            f"'fp8' and 'fp4' (E2M1 packed two a byte, a UE8M0 scale per 32) experts."
        )
    return Scheme("fp8", None if block is None else (block[0], block[1]), scale_fmt)


def fp8_block_config(block: tuple[int, int], kept: list[str]) -> dict[str, Any]:
    """The ``quantization_config`` of a `quantize="fp8-block"` output (DeepSeek-V3's keys)."""
    config: dict[str, Any] = {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": list(block),
    }
    if kept:
        config["modules_to_not_convert"] = kept
    return config
