"""A PEFT LoRA adapter merged into a ~0.6 GiB Llama-shaped HF folder, three ways.

- suture: ``suture convert BASE OUT --merge-adapter ADAPTER --max-memory 64MiB`` (Python
  ``suture.convert(base, out, merge_adapter=adapter, max_memory="64MiB")``), streamed by
  blocks of rows.
- peft: ``AutoModelForCausalLM.from_pretrained`` + ``PeftModel.from_pretrained`` +
  ``merge_and_unload()`` + ``save_pretrained`` (float32, on the CPU).
- plain: safetensors' ``load_file`` of base and adapter, a numpy merge
  ``w + scaling * (B @ A)``, ``save_file`` (bench/lora_merge.py's peer route, on this folder).

Each route runs in fresh processes after dropping the page cache, in blocks whose first run
is discarded. Run from the repository root: `.venv/bin/python -m bench.peft_merge`.
"""

from __future__ import annotations

import json
import shutil
import sys

from bench._common import (
    DATA_DIR,
    cache_note,
    machine,
    medians,
    run_routes,
    runs_line,
    timed_route,
    write_hf_shards,
    write_section,
)

HIDDEN, MLP, LAYERS, VOCAB, HEADS = 1024, 4096, 8, 8192, 8
RANK, ALPHA = 16, 32
BUDGET = "64MiB"
BASE = DATA_DIR / "peft_merge_base"
ADAPTER = DATA_DIR / "peft_merge_adapter"
OUTPUT = DATA_DIR / "peft_merge_out"
REPEATS = 3
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "intermediate_size": MLP,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": HEADS,
    "vocab_size": VOCAB,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
MODULES = {
    "self_attn.q_proj": (HIDDEN, HIDDEN),
    "self_attn.k_proj": (HIDDEN, HIDDEN),
    "self_attn.v_proj": (HIDDEN, HIDDEN),
    "self_attn.o_proj": (HIDDEN, HIDDEN),
    "mlp.gate_proj": (MLP, HIDDEN),
    "mlp.up_proj": (MLP, HIDDEN),
    "mlp.down_proj": (HIDDEN, MLP),
}


def write_inputs() -> None:
    import numpy as np
    from safetensors.numpy import save_file

    if BASE.exists() and ADAPTER.exists():
        return
    shutil.rmtree(BASE, ignore_errors=True)
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN), "lm_head.weight": (VOCAB, HIDDEN)}
    shapes["model.norm.weight"] = (HIDDEN,)
    for i in range(LAYERS):
        for module, shape in MODULES.items():
            shapes[f"model.layers.{i}.{module}.weight"] = shape
        shapes[f"model.layers.{i}.input_layernorm.weight"] = (HIDDEN,)
        shapes[f"model.layers.{i}.post_attention_layernorm.weight"] = (HIDDEN,)
    write_hf_shards(BASE, [shapes], CONFIG, "float32")
    rng = np.random.default_rng(1)
    tensors = {}
    for i in range(LAYERS):
        for module, (rows, cols) in MODULES.items():
            name = f"base_model.model.model.layers.{i}.{module}"
            tensors[f"{name}.lora_A.weight"] = rng.standard_normal((RANK, cols), np.float32) * 0.01
            tensors[f"{name}.lora_B.weight"] = rng.standard_normal((rows, RANK), np.float32) * 0.01
    ADAPTER.mkdir(parents=True, exist_ok=True)
    save_file(tensors, ADAPTER / "adapter_model.safetensors", metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": RANK,
        "lora_alpha": ALPHA,
        "target_modules": sorted({m.split(".")[-1] for m in MODULES}),
        "base_model_name_or_path": None,
        "bias": "none",
        "lora_dropout": 0.0,
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
    }
    (ADAPTER / "adapter_config.json").write_text(json.dumps(config, indent=2))


def suture_route() -> None:
    import suture

    suture.convert(BASE, OUTPUT, merge_adapter=ADAPTER, max_memory=BUDGET, progress=False)


def peft_route() -> None:
    import torch
    import transformers
    from peft import PeftModel

    model = transformers.AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, ADAPTER).merge_and_unload()
    merged.save_pretrained(OUTPUT)


def plain_route() -> None:
    from safetensors.numpy import load_file, save_file

    (shard,) = BASE.glob("model-*.safetensors")
    base, adapter = load_file(shard), load_file(ADAPTER / "adapter_model.safetensors")
    scaling = ALPHA / RANK
    for i in range(LAYERS):
        for module in MODULES:
            name = f"model.layers.{i}.{module}"
            a = adapter[f"base_model.model.{name}.lora_A.weight"]
            b = adapter[f"base_model.model.{name}.lora_B.weight"]
            base[f"{name}.weight"] += scaling * (b @ a)
    OUTPUT.mkdir()
    save_file(base, OUTPUT / shard.name, metadata={"format": "pt"})
    for side in ("config.json", "model.safetensors.index.json"):
        shutil.copy(BASE / side, OUTPUT / side)


def worker(route: str) -> None:
    routes = {"suture": suture_route, "peft": peft_route, "plain": plain_route}
    timed_route(routes[route], OUTPUT)


def verify_output() -> None:
    import numpy as np

    import suture

    base, adapter = suture.open(BASE), suture.open(ADAPTER / "adapter_model.safetensors")
    name = "model/layers/3/mlp/down_proj"
    a = adapter[f"base_model/model/{name}/lora_A/weight"].read()
    b = adapter[f"base_model/model/{name}/lora_B/weight"].read()
    expected = base[f"{name}/weight"][:64].read() + (b[:64] @ a) * np.float32(ALPHA / RANK)
    got = suture.open(OUTPUT)[f"{name}/weight"][:64].read()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def main() -> None:
    DATA_DIR.mkdir(exist_ok=True)
    write_inputs()
    routes = tuple(sys.argv[1:]) or ("suture", "plain", "peft")
    runs = run_routes("bench.peft_merge", routes, REPEATS, check=verify_output)
    summary = medians(runs, ("wall_s", "peak_rss_bytes"))
    mib = 2**20
    size = sum(p.stat().st_size for p in BASE.glob("*.safetensors")) / mib
    labels = {
        "suture": f"suture convert BASE OUT --merge-adapter ADAPTER --max-memory {BUDGET}",
        "plain": "safetensors load_file x2 + numpy merge + save_file",
        "peft": "transformers from_pretrained + PeftModel + merge_and_unload + save_pretrained",
    }
    rows = "\n".join(
        f"| {labels[r]} | {summary[r]['wall_s']:.1f} s | {summary[r]['peak_rss_bytes'] / mib:.0f} MiB |"
        for r in routes
    )
    ratios = ""
    if "suture" in summary:
        ours = summary["suture"]
        for peer in (r for r in routes if r != "suture"):
            theirs = summary[peer]
            ratios += (
                f"- Beside {peer}: wall {ours['wall_s'] / theirs['wall_s']:.2f}x, peak RSS "
                f"{ours['peak_rss_bytes'] / theirs['peak_rss_bytes']:.2f}x.\n"
            )
    body = f"""## peft_merge: a PEFT LoRA adapter merged into a {size:.0f} MiB Llama-shaped HF folder (issue 40)

`python -m bench.peft_merge` — {machine()}; median of {REPEATS} runs per route, each a fresh
process, {cache_note(runs)}; the routes run in blocks whose first run is discarded.
Base: float32, hidden {HIDDEN}, MLP {MLP}, {LAYERS} layers, vocabulary {VOCAB}, one shard;
adapter: rank {RANK}, lora_alpha {ALPHA}, on all seven projections of every layer.

| route | wall time | peak RSS |
| --- | --- | --- |
{rows}

{ratios}- Runs (wall s): {runs_line(runs)}.
"""
    write_section("peft_merge", body)
    print(body)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
