"""The packed formats of issue 39, one full-width expert each: suture's streamed read against
each format's reference on the same tensors (issue 39).

For each format, one Kimi-K2/DeepSeek-V4-shaped expert projection (2048 x 7168) is written
as that format stores it (a safetensors folder with its config) and read to bfloat16 two ways:

- suture: ``suture.open(folder, dequantize=True)``, the whole tensor read in blocks of 256
  rows (as a convert streams it);
- the reference, on the tensors loaded whole: transformers' ``Fp8Dequantize`` for
  DeepSeek-V4's FP4 (the formula MaxText's ``deepseek_dequantize.py`` copies),
  compressed-tensors 0.20's ``PackedQuantizationCompressor`` / ``NVFP4PackedCompressor``
  ``decompress``, and ModelOpt's ``NVFP4QTensor.dequantize``.

The outputs are compared bit for bit (bfloat16 from suture is the round-to-nearest of the
float32 value; compressed-tensors' INT4 output is taken with float32 scales, its contract).
Reported: wall of each (median of `--repeats` after one untimed run, page cache warm: the
arithmetic, not the disk), millions of values a second, and the bytes suture holds for one block as its plan
counts them. Run from the repository root: ``.venv/bin/python -m bench.quantized_formats``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from bench._common import machine, write_section

ROWS, COLS, BLOCK_ROWS = 2048, 7168, 256


def write(folder: Path, tensors: dict, quantization: dict | None, extra: dict | None = None):
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    config = {"model_type": "llama"}
    if quantization is not None:
        config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    for name, value in (extra or {}).items():
        (folder / name).write_text(json.dumps(value))
    save_file(tensors, folder / "model.safetensors")


def formats(root: Path):  # noqa: ANN201
    """``(name, folder, tensor path, reference function giving bfloat16 torch)`` per format."""
    import torch
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    rng = np.random.default_rng(0)
    found = []
    # DeepSeek-V4 FP4 experts: F4 bytes, UE8M0 scale per 32
    packed = torch.from_numpy(rng.integers(0, 256, (ROWS, COLS // 2), dtype=np.uint8))
    scale = torch.from_numpy(rng.integers(110, 135, (ROWS, COLS // 32), dtype=np.uint8))
    write(
        root / "v4",
        {
            "e.w1.weight": packed.view(torch.float4_e2m1fn_x2),
            "e.w1.scale": scale.view(torch.float8_e8m0fnu),
        },
        {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "scale_fmt": "ue8m0",
            "weight_block_size": [128, 128],
        },
    )
    found.append(
        (
            "DeepSeek-V4 FP4 (UE8M0 / 32)",
            root / "v4",
            "e/w1/weight",
            lambda: Fp8Dequantize(None)._dequantize_one(
                packed.view(torch.int8), scale.view(torch.float8_e8m0fnu), torch.bfloat16
            ),
        )
    )
    # compressed-tensors INT4, group 32, symmetric (Kimi K2's experts)
    args = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))
    values = torch.from_numpy(rng.integers(-8, 8, (ROWS, COLS), dtype=np.int8))
    state = {
        "weight_packed": pack_to_int32(values, 4),
        "weight_scale": torch.from_numpy(
            rng.uniform(1e-3, 1e-2, (ROWS, COLS // 32)).astype(np.float32)
        ).to(torch.bfloat16),
        "weight_shape": torch.tensor([ROWS, COLS]),
    }
    config = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"g": {"targets": ["Linear"], "weights": args}},
    }
    write(root / "int4", {f"e.{k}": v for k, v in state.items()}, config)
    float_scales = {**state, "weight_scale": state["weight_scale"].float()}
    found.append(
        (
            "compressed-tensors INT4 (group 32)",
            root / "int4",
            "e/weight",
            lambda: PackedQuantizationCompressor.decompress(float_scales, scheme)["weight"].to(
                torch.bfloat16
            ),
        )
    )
    # compressed-tensors NVFP4
    nv_args = {
        "num_bits": 4,
        "type": "float",
        "symmetric": True,
        "strategy": "tensor_group",
        "group_size": 16,
    }
    nv_scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**nv_args))
    nv_scales = torch.from_numpy(rng.integers(0x20, 0x60, (ROWS, COLS // 16), dtype=np.uint8)).view(
        torch.float8_e4m3fn
    )
    nv_state = {
        "weight_packed": packed,
        "weight_scale": nv_scales,
        "weight_global_scale": torch.tensor([700.0]),
    }
    nv_config = {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "config_groups": {"g": {"targets": ["Linear"], "weights": nv_args}},
    }
    write(root / "nvfp4", {f"e.{k}": v for k, v in nv_state.items()}, nv_config)
    found.append(
        (
            "compressed-tensors NVFP4",
            root / "nvfp4",
            "e/weight",
            lambda: NVFP4PackedCompressor.decompress(nv_state, nv_scheme)["weight"],
        )
    )
    # ModelOpt NVFP4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    scale_2 = torch.tensor(1 / 700.0)
    write(
        root / "modelopt",
        {"e.weight": packed, "e.weight_scale": nv_scales, "e.weight_scale_2": scale_2},
        None,
        {"hf_quant_config.json": {"quantization": {"quant_algo": "NVFP4", "group_size": 16}}},
    )
    found.append(
        (
            "ModelOpt NVFP4",
            root / "modelopt",
            "e/weight",
            lambda: (
                NVFP4QTensor(torch.Size([ROWS, COLS]), torch.float32, packed)
                .dequantize(
                    dtype=torch.float32, scale=nv_scales, double_scale=scale_2, block_sizes={-1: 16}
                )
                .to(torch.bfloat16)
            ),
        )
    )
    return found


def suture_read(folder: Path, path: str) -> tuple[np.ndarray, int]:
    import suture

    lazy = suture.open(folder, dequantize=True)[path]
    out = np.empty(lazy.shape, lazy.dtype)
    for start in range(0, ROWS, BLOCK_ROWS):
        out[start : start + BLOCK_ROWS] = lazy[start : start + BLOCK_ROWS].read()
    held = lazy.node.held_while_reading((range(BLOCK_ROWS), range(COLS)))
    return out, held


def timed(function, repeats: int):  # noqa: ANN001, ANN201
    """Median wall of `repeats` calls after one untimed (imports, lookup tables)."""
    function()
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    arguments = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # suture reads one block at a time on one thread here too
    root = Path(tempfile.mkdtemp(prefix="quantized_formats_"))
    rows = []
    try:
        for name, folder, path, reference in formats(root):
            ours_s, (ours, held) = timed(
                lambda f=folder, p=path: suture_read(f, p), arguments.repeats
            )
            theirs_s, theirs = timed(reference, arguments.repeats)
            same = np.array_equal(
                ours.view(np.uint16), theirs.view(torch.int16).numpy().view(np.uint16)
            )
            count = ROWS * COLS / 1e6
            rows.append(
                f"| {name} | {ours_s:.2f} s ({count / ours_s:.0f} M/s) | {held / 2**20:.0f} MiB "
                f"| {theirs_s:.2f} s ({count / theirs_s:.0f} M/s) | {'yes' if same else 'NO'} |"
            )
            print(rows[-1], flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    body = f"""## Packed formats: one full-width expert each, against the reference (issue 39)

`python -m bench.quantized_formats --repeats {arguments.repeats}` on {machine()}. One
{ROWS} x {COLS} expert projection per format, read to bfloat16 by suture in blocks of
{BLOCK_ROWS} rows (page cache warm: the arithmetic) and by the format's reference on the
tensors loaded whole (torch on one thread, as suture's read here). Medians of
{arguments.repeats} after one untimed run; "held" is what suture's plan counts for one block.
Load average at the end of the run: {os.getloadavg()[0]:.1f} (a shared machine: the
walls compare the two in the same run, not across runs).

| format | suture | held a block | reference | bit-identical bfloat16 |
| --- | --- | --- | --- | --- |
{chr(10).join(rows)}
"""
    write_section("quantized-formats", body)


if __name__ == "__main__":
    main()
