"""MaxText's own HF -> MaxText converter beside suture's, for bench/families.py.

MaxText (``maxtext==0.2.5``, Python >= 3.12) lives in a virtual environment of its own that
:func:`ensure_venv` makes when missing: never a suture dependency. :func:`compare` converts one
random Llama 3.1 folder with both and writes the ``families-maxtext`` section of RESULTS.md.
"""

from __future__ import annotations

import glob
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench._common import BENCH_DIR, DATA_DIR, machine, write_section

WORK = DATA_DIR / "families-maxtext"
GIB = 1024**3
# maxtext's base install pulls no dependencies; these are the modules its conversion imports
# (versions: the ones this benchmark was run with).
MAXTEXT_RUNTIME = [
    "jax==0.12.0.1",
    "jaxlib==0.12.0.1",
    "flax==0.12.12",
    "orbax-checkpoint==0.12.8",
    "transformers==5.23.0",
    "omegaconf",
    "grain",
    "aqtp",
    "safetensors",
    "psutil",
    "huggingface-hub",
    "tqdm",
    "pydantic",
    "tensorboardx",
    "sentencepiece",
    "tiktoken",
    "pathwaysutils",
    "jaxtyping",
    "drjax",
    "qwix",
    "jinja2",
    "tokamax",
    "gcsfs",
    "xprof",
    "einshape",
    "fire",
    "immutabledict",
    "pillow",
    "sympy",
]
# MaxText's converter takes head_dim and the layer count from its built-in Llama-3.1-8B config
# (checkpoint_conversion/utils/hf_model_configs.py), so those stay; the width shrinks.
SMALL_LLAMA31 = dict(
    hidden_size=1024,
    intermediate_size=3584,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
    num_hidden_layers=32,
    vocab_size=32000,
    rms_norm_eps=1e-5,
    max_position_embeddings=8192,
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    tie_word_embeddings=False,
    rope_theta=500000.0,
    rope_scaling={
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
)


def _python312() -> str:
    """A working Python 3.12: pyenv's own build first (its shims fail when 3.12 is not selected), then PATH."""
    candidates = [
        *sorted(glob.glob(str(Path.home() / ".pyenv/versions/3.12*/bin/python"))),
        shutil.which("python3.12"),
    ]
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "--version"], capture_output=True).returncode == 0:
            return candidate
    raise SystemExit(
        "maxtext 0.2.5 needs Python >= 3.12: put python3.12 on PATH (pyenv install 3.12)."
    )


def ensure_venv(venv: Path) -> Path:
    """The Python of `venv`, made with Python 3.12, maxtext 0.2.5 (--no-deps) and its runtime modules when missing."""
    python = venv / "bin" / "python"
    if python.exists():
        return python
    subprocess.run([_python312(), "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, *MAXTEXT_RUNTIME], check=True)
    subprocess.run([*pip, "--no-deps", "maxtext==0.2.5"], check=True)
    return python


def model_overrides(config: dict) -> list[str]:
    """MaxText config overrides that shrink its llama3.1-8b model to the HF `config`."""
    return [
        "model_name=llama3.1-8b",
        "override_model_config=True",
        f"base_emb_dim={config['hidden_size']}",
        f"base_num_query_heads={config['num_attention_heads']}",
        f"base_num_kv_heads={config['num_key_value_heads']}",
        f"head_dim={config['head_dim']}",
        f"base_mlp_dim={config['intermediate_size']}",
        f"vocab_size={config['vocab_size']}",
        f"base_num_decoder_layers={config['num_hidden_layers']}",
        "scan_layers=True",
    ]


def maxtext_command(
    python: Path, settings: list[str], hf: Path, out: Path, save_dtype: str = "bfloat16"
) -> list[str]:
    """MaxText's converter (through `_maxtext_convert.py`) on a local HF folder, with the
    model's `settings` (its MaxText overrides), on the CPU, one device, lazy tensor loading."""
    return [
        str(python),
        "-P",
        str(BENCH_DIR / "_maxtext_convert.py"),
        *settings,
        "hardware=cpu",
        "skip_jax_distributed_system=True",
        f"base_output_directory={out}",
        "run_name=bench",
        f"hf_model_path={hf}",
        "lazy_load_tensors=True",
        "simulated_cpu_devices_count=1",
        f"save_dtype={save_dtype}",
    ]


def logits_difference(python: Path, config: dict, hf: Path, work: Path) -> tuple[float, float]:
    """Max abs difference of MaxText's logits on suture's float32 output and transformers' logits, and their scale.

    MaxText's model (its own code, float32, on the CPU) restores suture's output through its
    ``load_parameters_path``; transformers' ``LlamaForCausalLM`` reads the HF folder. Both see the
    same random tokens.
    """
    import torch
    import transformers

    converted, tokens_file, logits_file = (
        work / "suture-float32",
        work / "tokens.npy",
        work / "logits.npy",
    )
    suture_cli = str(Path(sys.executable).with_name("suture"))
    subprocess.run(
        [
            suture_cli,
            "convert",
            str(hf),
            str(converted),
            "--recipe",
            "llama3.1:maxtext",
            "--no-progress",
        ],
        check=True,
        capture_output=True,
    )
    tokens = np.random.default_rng(1).integers(0, config["vocab_size"], (2, 16)).astype(np.int32)
    np.save(tokens_file, tokens)
    done = subprocess.run(
        [
            str(python),
            "-P",
            str(BENCH_DIR / "_maxtext_logits.py"),
            str(tokens_file),
            str(logits_file),
            *model_overrides(config),
            f"load_parameters_path={converted}",
            f"base_output_directory={work / 'run'}",
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"MaxText's forward pass failed:\n{done.stderr[-3000:]}")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model(torch.from_numpy(tokens).long()).logits.numpy()
    del model
    got = np.load(logits_file)
    return float(np.max(np.abs(got - expected))), float(np.max(np.abs(expected)))


def compare_trees(maxtext_items: Path, suture_out: Path) -> tuple[list[str], set[str]]:
    """One line per difference between the two MaxText trees (after a summary line), and the bit-identical paths."""
    import suture

    theirs, ours = suture.open(maxtext_items).flat(), suture.open(suture_out).flat()
    lines = [
        f"only in MaxText's output: `{path}` ({theirs[path]!r})"
        for path in sorted(set(theirs) - set(ours))
    ]
    lines += [f"only in suture's output: `{path}`" for path in sorted(set(ours) - set(theirs))]
    identical: set[str] = set()
    for path in sorted(set(theirs) & set(ours)):
        a, b = theirs[path], ours[path]
        a, b = (a.read(), b.read()) if hasattr(a, "read") else (np.asarray(a), np.asarray(b))
        if a.shape != b.shape or a.dtype != b.dtype:
            lines.append(f"`{path}`: MaxText {a.shape} {a.dtype}, suture {b.shape} {b.dtype}")
        elif np.array_equal(a, b):
            identical.add(path)
        else:
            differing = int(np.sum(a != b))
            worst = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            lines.append(f"`{path}`: {differing} of {a.size} values differ (max abs {worst:g})")
    both = len(set(theirs) & set(ours))
    lines.insert(
        0,
        f"{len(identical)} of the {both} arrays in both are bit-identical (same path, shape, dtype, bytes)",
    )
    return lines, identical


def compare(
    python: Path, *, timed: Callable[[list[str]], dict], generate: Callable[..., int]
) -> None:
    """Converts one random Llama 3.1 folder with MaxText's converter and with suture; writes the section."""
    shutil.rmtree(WORK, ignore_errors=True)
    hf, theirs, ours = WORK / "hf", WORK / "maxtext", WORK / "suture"
    config = SMALL_LLAMA31
    try:
        size = generate(hf, config, "float32")
        suture_cli = str(Path(sys.executable).with_name("suture"))
        suture_run = timed(
            [
                suture_cli,
                "convert",
                str(hf),
                str(ours),
                "--recipe",
                "llama3.1:maxtext",
                "--dtype",
                "bfloat16",
                "--no-progress",
            ]
        )
        maxtext_run = timed(maxtext_command(python, model_overrides(config), hf, theirs))
        lines, identical = compare_trees(theirs / "0" / "items", ours)
        shutil.rmtree(theirs)
        shutil.rmtree(ours)
        logits = logits_difference(python, config, hf, WORK)
        report(config, size, suture_run, maxtext_run, (lines, identical), logits)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


def report(
    config: dict,
    size: int,
    suture_run: dict,
    maxtext_run: dict,
    trees: tuple[list[str], set[str]],
    logits: tuple[float, float],
) -> None:
    def row(name: str, run: dict) -> str:
        return f"| {name} | {run['wall_s']:.1f} s | {run['cpu_s']:.1f} | {run['peak_rss_bytes'] / GIB:.2f} GiB |"

    ratio = maxtext_run["peak_rss_bytes"] / suture_run["peak_rss_bytes"]
    lines, identical = trees
    findings = "\n".join(f"- {line}" for line in lines)
    query = "params/params/decoder/layers/self_attention/query/kernel"
    query_note = (
        "The query kernels match bit for bit: both scale by float32 1/sqrt(head_dim) in float32 "
        "before the bfloat16 cast (the 1-ulp difference is MaxText's way back to HF, not this direction). "
        if query in identical
        else ""
    )
    body = f"""## Model families: suture beside MaxText's own converter (`python -m bench.families --maxtext-venv DIR --maxtext-only`)

{machine()}. One random Llama-3.1-shaped HF folder, float32, {size / GIB:.2f} GiB:
{config["num_hidden_layers"]} layers, hidden {config["hidden_size"]}, {config["num_attention_heads"]} query and {config["num_key_value_heads"]} KV heads of {config["head_dim"]},
MLP {config["intermediate_size"]}, vocab {config["vocab_size"]} (MaxText's converter takes the layer count and head_dim from its built-in Llama-3.1-8B config, so
only the width is shrunk), converted cold into MaxText's scanned layout in bfloat16 by each:

- suture: `suture convert HF OUT --recipe llama3.1:maxtext --dtype bfloat16`
- MaxText 0.2.5: `python -m maxtext.checkpoint_conversion.to_maxtext model_name=llama3.1-8b
  override_model_config=True base_emb_dim=... (the shrunk sizes) scan_layers=True hardware=cpu
  skip_jax_distributed_system=True hf_model_path=HF lazy_load_tensors=True
  simulated_cpu_devices_count=1 save_dtype=bfloat16`, JAX on the CPU, in its own Python 3.12
  environment. Run through `bench/_maxtext_convert.py`: maxtext 0.2.5 saves with Orbax's v1
  checkpointer but registers its lazy-loading `LazyTensor` leaf only with Orbax's v0 handlers,
  so unpatched it stops with "Could not identify a valid handler for the checkpointable: items";
  its eager mode needs torch, which its environment does not have. The launcher resolves
  `LazyTensor` to Orbax's numpy handler and runs the module unchanged.

| route | wall | CPU s | peak RSS |
| --- | --- | --- | --- |
{row("suture convert --recipe llama3.1:maxtext", suture_run)}
{row("MaxText `to_maxtext` (lazy_load_tensors)", maxtext_run)}

MaxText takes {maxtext_run["wall_s"] / suture_run["wall_s"]:.1f}x suture's wall and {maxtext_run["cpu_s"] / suture_run["cpu_s"]:.1f}x its CPU seconds; its
peak RSS is {ratio:.1f}x suture's (its lazy mode reads one HF tensor at a time but
builds each stacked MaxText array whole; its eager mode, which the issue measured at about
0.8 GB + 1.7x the model, holds the whole model). Output trees compared leaf by leaf:

{findings}

{query_note}MaxText's converter also saves an empty `opt_state`, which suture's Orbax writer leaves out; MaxText's
`load_parameters_path` reads only `params`, as the run below shows.

MaxText's own model (its Llama decoder, float32, highest matmul precision, dot-product attention,
on the CPU; `bench/_maxtext_logits.py`) restores suture's float32 conversion of the same folder
through `load_parameters_path` and runs 2 x 16 random tokens; transformers' `LlamaForCausalLM`
runs the HF folder on the same tokens: max abs logit difference {logits[0]:.3g} (largest logit
{logits[1]:.3g}).
"""
    write_section("families-maxtext", body)
    print(body)
