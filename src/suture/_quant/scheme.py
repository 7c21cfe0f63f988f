"""A Hugging Face ``quantization_config``, read and checked: which scheme, which block size.

Example:
    >>> scheme_of({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, "x")
    Scheme(method='fp8', block=(128, 128), scale_fmt=None)
    >>> scheme_of({"quant_method": "mxfp4"}, "x").describe()
    'MXFP4 (E2M1 values, an E8M0 scale per 32)'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._errors import ConfigMismatchError, UnsupportedError

SUPPORTED = ("fp8", "mxfp4")
FP8_BLOCK = (128, 128)  # DeepSeek-V3's, Kimi-K2's, and `quantize="fp8-block"`'s


@dataclass(frozen=True)
class Scheme:
    """How a checkpoint is quantized: ``fp8`` with `block` scales, or ``mxfp4``."""

    method: str
    block: tuple[int, int] | None = None
    scale_fmt: str | None = None

    def describe(self) -> str:
        if self.method == "mxfp4":
            return "MXFP4 (E2M1 values, an E8M0 scale per 32)"
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
            f"support yet: it dequantizes {' and '.join(SUPPORTED)} (FP8 with block scales, as "
            f"DeepSeek-V3 and Kimi-K2 publish; MXFP4, as gpt-oss does). Dequantize it with the "
            f"tool that made it, or open it without dequantize to see the stored tensors."
        )
    if method == "mxfp4":
        return Scheme("mxfp4")
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
