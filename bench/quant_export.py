"""A 7B-shaped bfloat16 model exported as W4A16 (compressed-tensors pack-quantized): suture's
one streamed pass beside compressed-tensors' own route (issue 40).

The source: Llama-2-7B's widths (hidden 4096, intermediate 11008, 32 heads, vocabulary
32000) with `--layers` decoder layers (4 by default, full widths; the whole 7B has 32) in
bfloat16 safetensors with its `config.json`, random weights (normal, std 0.02).

Routes, each in a fresh process after dropping the page cache (where permitted):
- suture: ``suture.convert(SRC, OUT, quantize="W4A16")``, default memory budget;
- compressed-tensors: transformers loads the model whole (bfloat16), compressed-tensors'
  ``apply_quantization_config`` with its W4A16 preset (``lm_head`` ignored), each weight's
  scales by its ``calculate_qparams`` from the groups' min and max (what llm-compressor's
  min-max observer gives it), ``ModelCompressor.compress_model``, the state dict saved with
  ``safetensors.torch.save_file`` and ``update_config`` writing the ``quantization_config``.
  (llm-compressor's ``oneshot`` does these steps; it cannot be installed beside transformers
  5.24: its releases pin transformers <= 5.17.)

Every tensor of the two outputs is compared byte for byte after the runs. Wall time, CPU
time (user + system) and peak RSS are the worker's own. Everything made is deleted at the
end. Run from the repository root: ``.venv/bin/python -m bench.quant_export [--layers N]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import time

from bench._common import DATA_DIR, REPO_ROOT, drop_caches, machine, peak_rss_bytes, write_section

HIDDEN, INTERMEDIATE, HEADS, VOCAB = 4096, 11008, 32, 32000
ROOT = DATA_DIR / "quant_export"
SOURCE, SUTURE_OUT, PEER_OUT = ROOT / "bf16", ROOT / "suture", ROOT / "compressed_tensors"
GiB = 1 << 30


def config(layers: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "num_hidden_layers": layers,
        "vocab_size": VOCAB,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }


def write_source(layers: int) -> None:
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    if (SOURCE / "config.json").exists():
        return
    SOURCE.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, np.float32) * 0.02).astype(ml_dtypes.bfloat16)

    ones = np.ones(HIDDEN, ml_dtypes.bfloat16)
    save_file(
        {"model.embed_tokens.weight": normal(VOCAB, HIDDEN), "model.norm.weight": ones},
        SOURCE / "model-embed.safetensors",
    )
    weight_map = dict.fromkeys(
        ["model.embed_tokens.weight", "model.norm.weight"], "model-embed.safetensors"
    )
    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        tensors = {
            f"{prefix}.input_layernorm.weight": ones,
            f"{prefix}.post_attention_layernorm.weight": ones,
        }
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            tensors[f"{prefix}.self_attn.{name}.weight"] = normal(HIDDEN, HIDDEN)
        tensors[f"{prefix}.mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[f"{prefix}.mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[f"{prefix}.mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
        file = f"model-layer{layer}.safetensors"
        save_file(tensors, SOURCE / file)
        weight_map.update(dict.fromkeys(tensors, file))
    save_file({"lm_head.weight": normal(VOCAB, HIDDEN)}, SOURCE / "model-head.safetensors")
    weight_map["lm_head.weight"] = "model-head.safetensors"
    index = {"metadata": {}, "weight_map": weight_map}
    (SOURCE / "model.safetensors.index.json").write_text(json.dumps(index))
    (SOURCE / "config.json").write_text(json.dumps(config(layers)))


def suture_route() -> None:
    import suture

    suture.convert(SOURCE, SUTURE_OUT, quantize="W4A16", progress=False)


def peer_route() -> None:
    import torch
    import transformers
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils import calculate_qparams
    from safetensors.torch import save_file

    model = transformers.AutoModelForCausalLM.from_pretrained(SOURCE, dtype=torch.bfloat16)
    scheme = preset_name_to_scheme("W4A16", ["Linear"])
    quantization = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    apply_quantization_config(model, quantization, show_progress=False)
    with torch.no_grad():
        for module in model.modules():
            found = getattr(module, "quantization_scheme", None)
            if found is None:
                continue
            args, weight = found.weights, module.weight
            groups = weight.unflatten(-1, (weight.shape[-1] // args.group_size, args.group_size))
            scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
            module.weight_scale.copy_(scale)
            module.weight_zero_point.copy_(zero)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    PEER_OUT.mkdir(parents=True)
    save_file(model.state_dict(), PEER_OUT / "model.safetensors")
    shutil.copy(SOURCE / "config.json", PEER_OUT / "config.json")
    compressor.update_config(str(PEER_OUT))


def worker(route: str) -> None:
    output = {"suture": SUTURE_OUT, "compressed-tensors": PEER_OUT}[route]
    shutil.rmtree(output, ignore_errors=True)
    started = time.perf_counter()
    {"suture": suture_route, "compressed-tensors": peer_route}[route]()
    wall = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result = {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime}
    print(json.dumps({**result, "peak_rss_bytes": peak_rss_bytes()}))


def run(route: str) -> dict:
    cold = drop_caches()
    done = subprocess.run(
        [sys.executable, "-m", "bench.quant_export", "--worker", route],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    if done.returncode:
        raise RuntimeError(f"{route} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "cold": cold}


def compare_outputs() -> tuple[int, int]:
    """(tensors compared, bytes compared); raises if any tensor differs."""
    import torch
    from safetensors import safe_open

    theirs = safe_open(PEER_OUT / "model.safetensors", "pt")
    ours: dict = {}
    for file in SUTURE_OUT.glob("*.safetensors"):
        handle = safe_open(file, "pt")
        ours.update({name: handle for name in handle.keys()})  # noqa: SIM118
    if sorted(ours) != sorted(theirs.keys()):
        raise AssertionError(f"tensor names differ: {sorted(set(ours) ^ set(theirs.keys()))[:5]}")
    total = 0
    for name in theirs.keys():  # noqa: SIM118
        a, b = ours[name].get_tensor(name), theirs.get_tensor(name)
        same = a.dtype == b.dtype and a.shape == b.shape
        if not same or not torch.equal(
            a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
        ):
            raise AssertionError(f"{name} differs")
        total += a.numel() * a.element_size()
    ours_config = json.loads((SUTURE_OUT / "config.json").read_text())["quantization_config"]
    theirs_config = json.loads((PEER_OUT / "config.json").read_text())["quantization_config"]
    ours_config.pop("ignore"), theirs_config.pop("ignore")
    if ours_config != theirs_config:
        raise AssertionError("quantization_config differs")
    return len(ours), total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    try:
        write_source(args.layers)
        source_bytes = sum(f.stat().st_size for f in SOURCE.glob("*.safetensors"))
        runs: dict[str, list[dict]] = {}
        for route in ("suture", "compressed-tensors"):
            runs[route] = [run(route) for _ in range(args.repeats)]
        tensors, compared = compare_outputs()
        body = report(args, runs, source_bytes, tensors, compared)
        write_section("quant_export", body)
        print(body)
    finally:
        shutil.rmtree(ROOT, ignore_errors=True)


def report(args, runs, source_bytes: int, tensors: int, compared: int) -> str:
    def median(route: str, key: str) -> float:
        return statistics.median(run[key] for run in runs[route])

    cold = all(run["cold"] for found in runs.values() for run in found)
    cache = (
        "page cache dropped before every run"
        if cold
        else "**warm page cache** (dropping it was not permitted here)"
    )
    ours, peer = "suture", "compressed-tensors"
    rows = []
    for route, how in (
        (ours, '`suture.convert(SRC, OUT, quantize="W4A16")`, one streamed pass'),
        (peer, "transformers load + compressed-tensors qparams + `compress_model` + `save_file`"),
    ):
        rows.append(
            f"| {how} | {median(route, 'wall_s'):.1f} s | {median(route, 'cpu_s'):.1f} s "
            f"| {median(route, 'peak_rss_bytes') / GiB:.2f} GiB |"
        )
    table = "\n".join(rows)
    runs_text = ", ".join(
        f"{route} {[round(run['wall_s'], 1) for run in found]}" for route, found in runs.items()
    )
    how_many = f"median of {args.repeats} runs" if args.repeats > 1 else "one run"
    wall = median(ours, "wall_s") / median(peer, "wall_s")
    cpu = median(ours, "cpu_s") / median(peer, "cpu_s")
    rss = median(ours, "peak_rss_bytes") / median(peer, "peak_rss_bytes")
    return f"""## quant_export: a 7B-shaped model exported as W4A16, beside compressed-tensors (issue 40)

`python -m bench.quant_export --layers {args.layers} --repeats {args.repeats}` — {machine()};
{how_many} per route, each a fresh process, {cache}. Source: Llama-2-7B's widths (hidden
{HIDDEN}, intermediate {INTERMEDIATE}, vocabulary {VOCAB}) with {args.layers} of its 32
layers, bfloat16, {source_bytes / GiB:.2f} GiB of safetensors.

| route | wall time | CPU time | peak RSS |
| --- | --- | --- | --- |
{table}

- Same output: all {tensors} tensors ({compared / GiB:.2f} GiB) equal byte for byte, and the
  `quantization_config` equal but for `ignore` (suture lists every kept linear module,
  `model.embed_tokens` and `lm_head`; the peer's recipe listed `lm_head`).
- suture against the peer: wall time {wall:.2f}x, CPU time {cpu:.2f}x, peak RSS {rss:.2f}x.
  The peer holds the whole bfloat16 model in memory (and the packed copy); suture holds a
  block of rows at a time under its default 1 GiB budget, so its peak does not grow with
  the layer count. Wall time well above CPU time: both routes wait on the disk (shared with
  other work on this machine), so the wall times are noisy.
- Runs (wall s): {runs_text}.
"""


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
