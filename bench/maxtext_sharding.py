"""MaxText's own sharding of a model's parameters beside suture's reading of the same rules.

MaxText (in its own venv, `--maxtext-venv`) builds a small model of each family abstractly
and reports, per parameter, the logical axes its code annotates, its config's
``logical_axis_rules`` and mesh, and the shard shape of its training sharding
(``nn.logical_to_mesh_sharding``). From the logical axes and the rules, written as a suture
rules file (``bench/_data/maxtext-sharding/MODEL.json``, which `--sharding` takes), suture
works out each parameter's shard on the same mesh; they must be MaxText's, every one.

Run from the repository root: `.venv/bin/python -m bench.maxtext_sharding --maxtext-venv
/tmp/mtvenv`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path

from bench._common import BENCH_DIR, DATA_DIR, machine, write_section

WORK = DATA_DIR / "maxtext-sharding"
MESH = ["ici_fsdp_parallelism=4", "ici_tensor_parallelism=2"]
SMALL = [
    "override_model_config=True",
    "base_emb_dim=256",
    "base_mlp_dim=512",
    "base_num_decoder_layers=2",
    "base_num_query_heads=4",
    "base_num_kv_heads=2",
    "head_dim=64",
    "vocab_size=128",
]
MODELS = {
    "llama3.1-8b": SMALL,
    "qwen3-8b": SMALL,
}


def maxtext_axes(python: Path, model: str, overrides: list[str]) -> dict:
    command = [
        str(python), "-P", str(BENCH_DIR / "_maxtext_axes.py"), f"model_name={model}",
        *overrides, *MESH, "hardware=cpu", "skip_jax_distributed_system=True",
        "per_device_batch_size=1", "max_target_length=16", "run_name=axes",
    ]  # fmt: skip
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("AXES ")), None)
    if line is None:
        raise RuntimeError(f"MaxText's {model} failed:\n{done.stderr[-3000:]}")
    return json.loads(line.removeprefix("AXES "))


def rules_file(found: dict) -> dict:
    """A suture rules file: each parameter's path (any prefix: Orbax states nest 'params')
    to MaxText's logical axes, and MaxText's logical_axis_rules."""
    leaves = {f"(.*/)?{re.escape(path)}": axes for path, axes in found["leaves"].items()}
    return {"logical_axis_rules": found["logical_axis_rules"], "leaves": leaves}


def compare(model: str, found: dict) -> tuple[int, list[str]]:
    import jax
    import numpy as np

    import suture
    from suture._save.mesh import shards_of

    rules = rules_file(found)
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / f"{model}.json").write_text(json.dumps(rules, indent=1))
    tree = {
        path: jax.ShapeDtypeStruct(tuple(shape), np.float32)
        for path, shape in found["shapes"].items()
    }
    shards = shards_of(suture.TargetSharding(found["mesh"], WORK / f"{model}.json"), tree)
    differ = [
        f"{path}: suture {shards.get(path, tuple(found['shapes'][path]))}, MaxText {tuple(shard)}"
        for path, shard in found["shards"].items()
        if tuple(shards.get(path, tuple(found["shapes"][path]))) != tuple(shard)
    ]
    return len(found["shards"]), differ


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--maxtext-venv", type=Path, default=Path("/tmp/mtvenv"))
    arguments = parser.parse_args()
    python = arguments.maxtext_venv / "bin" / "python"
    rows, notes = [], []
    for model, overrides in MODELS.items():
        found = maxtext_axes(python, model, overrides)
        count, differ = compare(model, found)
        sharded = sum(
            1 for path, shard in found["shards"].items() if shard != found["shapes"][path]
        )
        rows.append(
            f"| `{model}` (small) | {count} | {sharded} | {count - len(differ)} of {count} |"
        )
        notes += [f"- `{model}`: {line}" for line in differ]
    mesh = ", ".join(MESH)
    body = "\n".join(
        [
            "## maxtext_sharding: MaxText's logical axis rules read by suture (issue 42)",
            "",
            f"`python -m bench.maxtext_sharding --maxtext-venv /tmp/mtvenv` — {machine()}; "
            f"MaxText 0.2.5 builds each model abstractly (2 layers, widths 256/512, 8 CPU "
            f"devices, {mesh}) and reports each parameter's logical axes, its config's "
            f"`logical_axis_rules`, and the shard of its training sharding. suture reads the "
            f"axes and rules as a `--sharding` file and works out each shard on the same mesh.",
            "",
            "| model | parameters | sharded by MaxText | suture's shard = MaxText's |",
            "| --- | --- | --- | --- |",
            *rows,
            "",
            *(notes or ["- Every parameter's shard is MaxText's own."]),
            "- The rules files (`bench/_data/maxtext-sharding/MODEL.json`) are what "
            "`suture convert --recipe FAMILY:maxtext --mesh ... --sharding FILE` takes.",
        ]
    )
    write_section("maxtext-sharding", body)
    print(body)


if __name__ == "__main__":
    main()
