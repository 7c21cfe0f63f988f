"""A Qwen3-shaped model into Tunix's NNX Qwen3, by Tunix's loader and by suture, and back.

- tunix: ``tunix.models.qwen3.params.create_model_from_safe_tensors`` (its default,
  "optimized" mode: the files memory-mapped, then put on the device).
- suture: ``suture.nnx.load_into`` of the abstract model with the ``qwen3:tunix`` recipe.
- export: what Tunix's CheckpointManager saved of that model, back to a Hugging Face folder
  with ``suture convert --recipe qwen3:tunix --reverse --like``; Tunix has no way back but a
  LoRA merge that re-reads the base model.
- floor: reading every byte of the HF folder once (``read()`` in 64 MiB pieces).

Tunix runs in its own environment (`tests/tunix_env.py`, which makes it); each route runs in
a fresh process after the page cache is dropped, in blocks whose first run is discarded.
Run from the repository root: `.venv/bin/python -m bench.tunix`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

from bench._common import (
    DATA_DIR,
    REPO_ROOT,
    cache_note,
    drop_caches,
    machine,
    medians,
    peak_rss_bytes,
    runs_line,
    write_section,
)

WORK = DATA_DIR / "tunix"
HF = WORK / "hf"
CKPT = WORK / "run"
EXPORT = WORK / "export"
# Qwen3-1.7B's widths, 12 layers, bfloat16: 2.2 GiB
CONFIG = dict(
    architectures=["Qwen3ForCausalLM"],
    model_type="qwen3",
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=12,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    rms_norm_eps=1e-6,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
    torch_dtype="bfloat16",
)
REPEATS = 3


def write_model() -> None:
    """A random Qwen3 folder in bfloat16, one safetensors file per layer group, once."""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    if (HF / "config.json").exists():
        return
    HF.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    c = CONFIG
    d, f, h = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * h, c["num_key_value_heads"] * h

    def random(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)

    save_file(
        {"model.embed_tokens.weight": random(c["vocab_size"], d), "model.norm.weight": random(d)},
        HF / "model-embed.safetensors",
    )
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes = {
            "self_attn.q_proj.weight": (q, d),
            "self_attn.k_proj.weight": (kv, d),
            "self_attn.v_proj.weight": (kv, d),
            "self_attn.o_proj.weight": (d, q),
            "self_attn.q_norm.weight": (h,),
            "self_attn.k_norm.weight": (h,),
            "mlp.gate_proj.weight": (f, d),
            "mlp.up_proj.weight": (f, d),
            "mlp.down_proj.weight": (d, f),
            "input_layernorm.weight": (d,),
            "post_attention_layernorm.weight": (d,),
        }
        save_file(
            {p + name: random(*shape) for name, shape in shapes.items()},
            HF / f"model-layer{i:02d}.safetensors",
        )
    (HF / "config.json").write_text(json.dumps(CONFIG, indent=2))


def _model():
    import jax.numpy as jnp
    from tunix.models.qwen3 import model, params

    c = CONFIG
    cfg = model.ModelConfig(
        num_layers=c["num_hidden_layers"],
        vocab_size=c["vocab_size"],
        embed_dim=c["hidden_size"],
        hidden_dim=c["intermediate_size"],
        num_heads=c["num_attention_heads"],
        head_dim=c["head_dim"],
        num_kv_heads=c["num_key_value_heads"],
        rope_theta=int(c["rope_theta"]),
        norm_eps=c["rms_norm_eps"],
        use_tied_embedding=True,
        dtype=jnp.bfloat16,
        param_dtype=jnp.bfloat16,
    )
    return params, model.Qwen3, cfg


def _ready(module) -> None:
    import jax
    from flax import nnx

    jax.block_until_ready(jax.tree.leaves(nnx.state(module)))


def tunix_route() -> None:
    params, _, cfg = _model()
    _ready(params.create_model_from_safe_tensors(str(HF), cfg))


def suture_route(save: bool = False) -> None:
    from flax import nnx

    import suture

    _, model_class, cfg = _model()
    recipe = suture.families.get_recipe("qwen3:tunix")
    model = suture.nnx.load_into(
        nnx.eval_shape(lambda: model_class(cfg, rngs=nnx.Rngs(params=0))),
        str(HF),
        lambda tree: recipe.to_target(tree, CONFIG),
    )
    _ready(model)
    if save:
        from tunix.sft.checkpoint_manager import CheckpointManager

        manager = CheckpointManager(str(CKPT))
        manager.save(1, model, force=True)
        manager.close()


def floor_route() -> None:
    for path in sorted(HF.glob("*.safetensors")):
        with open(path, "rb", buffering=0) as file:
            while file.read(64 << 20):
                pass


def export_route() -> None:
    import suture

    shutil.rmtree(EXPORT, ignore_errors=True)
    suture.convert(CKPT, EXPORT, recipe="qwen3:tunix", reverse=True, like=HF, progress=False)


ROUTES = {"tunix": tunix_route, "suture": suture_route, "floor": floor_route}


def worker(route: str) -> None:
    started = time.perf_counter()
    (export_route if route == "export" else ROUTES[route])()
    print(json.dumps({"wall_s": time.perf_counter() - started, "peak_rss_bytes": peak_rss_bytes()}))


def _tunix_python() -> str:
    sys.path.insert(0, str(REPO_ROOT))
    from tests.tunix_env import ensure_venv

    return str(ensure_venv())


def _run(python: str, route: str) -> dict:
    cold = drop_caches()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [python, "-m", "bench.tunix", "--worker", route],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
    )
    if done.returncode:
        raise RuntimeError(f"bench.tunix {route} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["cold"] = cold
    return result


def main() -> None:
    write_model()
    tunix_python = _tunix_python()
    if not (CKPT / "1").exists():  # a checkpoint saved by Tunix's CheckpointManager
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "src"), "JAX_PLATFORMS": "cpu"}
        subprocess.run(
            [tunix_python, "-c", "from bench.tunix import suture_route; suture_route(save=True)"],
            check=True,
            cwd=REPO_ROOT,
            env=env,
        )
    pythons = {"floor": sys.executable, "tunix": tunix_python, "suture": tunix_python}
    pythons["export"] = sys.executable
    runs: dict[str, list[dict]] = {}
    for route, python in pythons.items():
        _run(python, route)  # discarded
        runs[route] = [_run(python, route) for _ in range(REPEATS)]
    summary = medians(runs, ("wall_s", "peak_rss_bytes"))
    size = sum(p.stat().st_size for p in HF.glob("*.safetensors"))
    gib, mib = 2**30, 2**20
    rows = {
        "floor": "cold read of the HF folder's files (the floor)",
        "tunix": "Tunix `create_model_from_safe_tensors` (optimized mode)",
        "suture": "`suture.nnx.load_into(abstract Qwen3, folder, qwen3:tunix)`",
        "export": "Tunix CheckpointManager step -> HF folder: `suture convert --recipe qwen3:tunix --reverse --like`",
    }
    table = "\n".join(
        f"| {rows[r]} | {summary[r]['wall_s']:.1f} s | {summary[r]['peak_rss_bytes'] / mib:.0f} MiB |"
        for r in rows
    )
    body = f"""## tunix: a Qwen3-shaped model into Tunix's NNX Qwen3 and back (issue 31)

`python -m bench.tunix` — {machine()}, CPU; median of {REPEATS} runs per route, each a fresh
process, {cache_note(runs)}; the routes run in blocks whose first run is discarded. The model:
Qwen3-1.7B's widths with {CONFIG["num_hidden_layers"]} layers, bfloat16, tied embedding,
{size / gib:.2f} GiB in {len(list(HF.glob("*.safetensors")))} safetensors files; google-tunix
0.1.7 in its own environment (jax 0.10.2, flax 0.12.8).

| route | wall time | peak RSS |
| --- | --- | --- |
{table}

- On the CPU a loaded model's arrays are host memory: {size / gib:.2f} GiB of each loader's
  peak RSS is the model itself. The export holds no model; it streams within suture's
  default budget (1 GiB, beside the interpreter and JAX).
- Runs (wall s): {runs_line(runs)}. The machine is shared: compare the runs, not one figure.
"""
    write_section("tunix", body)
    print(body)
    shutil.rmtree(WORK, ignore_errors=True)  # the model, the Tunix checkpoint, the export


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        main()
