"""mergekit as a benchmark peer: its own virtual environment and three small Llama models.

mergekit is never a dependency of suture: the benchmark installs it (with torch) into
``bench/_data/mergekit-venv`` from PyPI the first time it runs, and reuses it afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench._common import DATA_DIR

VENV = DATA_DIR / "mergekit-venv"
MERGEKIT_YAML = VENV / "bin" / "mergekit-yaml"
# A small Llama (float32): 8 layers, hidden 1024, vocabulary 32000: 168 M parameters, 0.67 GB.
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "num_hidden_layers": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}


def ensure_mergekit() -> str:
    """Installs mergekit into its own venv (once); returns its version."""
    if not MERGEKIT_YAML.exists():
        DATA_DIR.mkdir(exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "--quiet", "mergekit"], check=True)
    done = subprocess.run(
        [
            str(VENV / "bin" / "python"),
            "-c",
            "import importlib.metadata as m; print(m.version('mergekit'), m.version('torch'))",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    mergekit, torch = done.stdout.split()
    return f"mergekit {mergekit} (torch {torch})"


def model_path(index: int) -> Path:
    return DATA_DIR / f"llama_{index}"


def llama_tensors(rng, base: dict | None = None) -> dict:
    """Llama tensor names and shapes; a fine-tune is the base plus small noise."""
    import numpy as np

    hidden, inner, vocab = LLAMA["hidden_size"], LLAMA["intermediate_size"], LLAMA["vocab_size"]
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(LLAMA["num_hidden_layers"]):
        prefix = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[f"{prefix}self_attn.{name}.weight"] = (hidden, hidden)
        shapes[f"{prefix}mlp.gate_proj.weight"] = (inner, hidden)
        shapes[f"{prefix}mlp.up_proj.weight"] = (inner, hidden)
        shapes[f"{prefix}mlp.down_proj.weight"] = (hidden, inner)
        shapes[f"{prefix}input_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    tensors = {}
    for name, shape in shapes.items():
        noise = rng.standard_normal(shape, dtype=np.float32)
        if base is None:
            tensors[name] = noise * np.float32(0.02)
        else:
            tensors[name] = base[name] + noise * np.float32(0.002)
    return tensors


def write_models(count: int) -> None:
    """Model 0 is a base; the others are fine-tunes of it (HF folders with config.json)."""
    import numpy as np
    from safetensors.numpy import save_file

    if all((model_path(i) / "model.safetensors").exists() for i in range(count)):
        return
    rng = np.random.default_rng(0)
    base = llama_tensors(rng)
    for index in range(count):
        folder = model_path(index)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = base if index == 0 else llama_tensors(rng, base)
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(LLAMA, indent=2))


def compare(ours: Path, theirs: Path, tolerance: float = 1e-6) -> dict[str, float]:
    """How far apart two outputs are, relative to each tensor's largest magnitude.

    Returns the largest absolute and relative difference, the number of elements whose
    relative difference exceeds `tolerance` (and of all elements), and the largest relative
    difference among the other elements.
    """
    import numpy as np
    from safetensors import safe_open

    def tensors(folder: Path) -> dict[str, Path]:
        found = {}
        for file in sorted(folder.glob("*.safetensors")):
            with safe_open(file, "np") as handle:
                found.update(dict.fromkeys(handle.keys(), file))
        return found

    mine, peer = tensors(ours), tensors(theirs)
    if sorted(mine) != sorted(peer):
        raise AssertionError(f"different tensors: {sorted(set(mine) ^ set(peer))[:5]}")
    result = {"max_abs": 0.0, "max_rel": 0.0, "over": 0, "elements": 0, "rest_rel": 0.0}
    for name, file in mine.items():
        with safe_open(file, "np") as a, safe_open(peer[name], "np") as b:
            x, y = a.get_tensor(name), b.get_tensor(name)
        if x.dtype != y.dtype or x.shape != y.shape:
            raise AssertionError(f"{name}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}")
        relative = np.abs(x.astype(np.float64) - y) / (float(np.abs(y).max()) or 1.0)
        over = relative > tolerance
        result["max_abs"] = max(result["max_abs"], float(np.abs(x.astype(np.float64) - y).max()))
        result["max_rel"] = max(result["max_rel"], float(relative.max()))
        result["over"] += int(over.sum())
        result["elements"] += x.size
        result["rest_rel"] = max(result["rest_rel"], float(np.where(over, 0, relative).max()))
    result["tensors"] = len(mine)
    return result
