"""A Kimi K2-Thinking-like HF folder for bench/_maxtext_families.py, and MaxText's route to it.

``pack`` turns a bfloat16 DeepseekV3 folder into what Kimi K2-Thinking publishes: each routed
expert packed by compressed-tensors' own compressor (INT4, symmetric, a bfloat16 scale per 32
inputs), ``model_type: kimi_k2``, the ``quantization_config``. ``maxtext_dequantized`` is
MaxText 0.2.5's route to a folder its ``to_maxtext`` converts: each packed weight through
``dequantize_pack_quantized_int4`` of its ``convert_deepseek_family_ckpt.py`` (the function
itself, read from MaxText's installed file and run under torch here: the script imports torch,
which MaxText's environment is built without), written as a bfloat16 folder.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

GROUP = 32
QUANTIZATION = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 4,
                "type": "int",
                "symmetric": True,
                "strategy": "group",
                "group_size": GROUP,
            },
        }
    },
    "ignore": [
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|down)_proj.*",
    ],
}


def pack(bf16: Path, out: Path) -> None:
    """`bf16`'s routed experts packed as Kimi publishes them, into `out`."""
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from safetensors.torch import load_file, save_file

    weights = QuantizationArgs(**QUANTIZATION["config_groups"]["group_0"]["weights"])
    scheme = QuantizationScheme(targets=["Linear"], weights=weights)
    out.mkdir(parents=True)
    for shard in sorted(bf16.glob("*.safetensors")):
        packed = {}
        for name, weight in load_file(shard).items():
            if ".mlp.experts." not in name:
                packed[name] = weight
                continue
            grouped = weight.float().reshape(weight.shape[0], -1, GROUP)
            scale = (grouped.abs().amax(-1) / 7).clamp(min=1e-4).to(torch.bfloat16)
            compressed = PackedQuantizationCompressor.compress(
                {"weight": weight.float(), "weight_scale": scale}, scheme
            )
            module = name[: -len(".weight")]
            packed.update({f"{module}.{key}": value for key, value in compressed.items()})
        save_file(packed, out / shard.name, metadata={"format": "pt"})
    config = json.loads((bf16 / "config.json").read_text())
    config.update(model_type="kimi_k2", quantization_config=QUANTIZATION)
    (out / "config.json").write_text(json.dumps(config, indent=2))


def _maxtext_dequantizer(python: Path):  # noqa: ANN202
    """``dequantize_pack_quantized_int4`` as MaxText's installed script defines it."""
    import torch

    found = sorted(
        python.absolute().parent.parent.glob(
            "lib/python*/site-packages/maxtext/checkpoint_conversion/standalone_scripts/"
            "convert_deepseek_family_ckpt.py"
        )
    )
    if not found:
        raise RuntimeError(f"no convert_deepseek_family_ckpt.py in the environment of {python}")
    tree = ast.parse(found[0].read_text())
    wanted = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name == "dequantize_pack_quantized_int4")
        or (
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", None) == "INT4_GROUP_SIZE" for t in node.targets)
        )
    ]
    namespace: dict = {"torch": torch}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(found[0]), "exec"), namespace)  # noqa: S102
    return namespace["dequantize_pack_quantized_int4"]


def maxtext_dequantized(python: Path, source: Path, out: Path) -> None:
    """`source` (INT4 experts) as a bfloat16 folder, each packed weight dequantized by MaxText's
    own function, the way its Kimi converter reads them."""
    from safetensors.torch import load_file, save_file

    dequantize = _maxtext_dequantizer(python)
    out.mkdir(parents=True)
    for shard in sorted(source.glob("*.safetensors")):
        state = load_file(shard)
        plain = {}
        for name, tensor in state.items():
            if name.endswith((".weight_scale", ".weight_shape")):
                continue
            if name.endswith(".weight_packed"):
                base = name[: -len("_packed")]
                shape = state[f"{base}_shape"].tolist()
                plain[base] = dequantize(tensor, state[f"{base}_scale"], shape)
            else:
                plain[name] = tensor
        save_file(plain, out / shard.name, metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config.pop("quantization_config")
    config["model_type"] = "deepseek_v3"
    (out / "config.json").write_text(json.dumps(config, indent=2))
