"""suture against mergekit on the same mergekit configs and Hugging Face models (issue 17).

Run from the repository root: `.venv/bin/python -m bench.merge mergekit`. Each route runs
`REPEATS` times in fresh processes (warm page cache, alternating blocks per method); wall
time and peak RSS are the child process's own. Outputs are compared tensor by tensor.
"""

from __future__ import annotations

import shutil
import statistics
import sys

from bench._common import DATA_DIR, machine, measure, write_section
from bench._mergekit_peer import (
    LLAMA,
    MERGEKIT_YAML,
    compare,
    ensure_mergekit,
    model_path,
    write_models,
)

REPEATS = 3
CONFIGS = {
    "linear": """merge_method: linear
models:
  - model: {m0}
    parameters: {{weight: 0.5}}
  - model: {m1}
    parameters: {{weight: 0.3}}
  - model: {m2}
    parameters: {{weight: 0.2}}
dtype: float32
""",
    "ties": """merge_method: ties
base_model: {m0}
models:
  - model: {m1}
    parameters: {{weight: 0.6, density: 0.5}}
  - model: {m2}
    parameters: {{weight: 0.4, density: 0.5}}
dtype: float32
""",
}


def routes(method: str) -> dict[str, list[str]]:
    config = DATA_DIR / f"mergekit_{method}.yml"
    config.write_text(CONFIGS[method].format(**{f"m{i}": model_path(i) for i in range(3)}))
    return {
        "suture": [
            sys.executable,
            "-m",
            "suture",
            "merge",
            str(config),
            "-o",
            str(output("suture", method)),
            "--no-progress",
        ],
        "mergekit": [str(MERGEKIT_YAML), str(config), str(output("mergekit", method))],
    }


def output(route: str, method: str):
    return DATA_DIR / f"merged_{route}_{method}"


def run(method: str) -> dict:
    results: dict[str, list[dict]] = {}
    for route, command in routes(method).items():
        results[route] = []
        for _ in range(REPEATS):
            shutil.rmtree(output(route, method), ignore_errors=True)
            results[route].append(measure(command, repeats=1))
    difference = compare(output("suture", method), output("mergekit", method))
    return {"runs": results, "difference": difference}


def main() -> None:
    version = ensure_mergekit()
    write_models(3)
    measured = {method: run(method) for method in CONFIGS}
    gib = 2**30
    rows, notes = [], []
    for method, result in measured.items():
        runs = result["runs"]
        wall = {r: statistics.median(x["wall_s"] for x in runs[r]) for r in runs}
        rss = {r: max(x["peak_rss_bytes"] for x in runs[r]) for r in runs}
        diff = result["difference"]
        for route in ("suture", "mergekit"):
            rows.append(
                f"| {method} | {route} | {wall[route]:.1f} s | {rss[route] / gib:.2f} GiB |"
            )
        notes.append(
            f"- {method}: suture takes **{wall['suture'] / wall['mergekit']:.2f}x** mergekit's "
            f"wall time in **{rss['suture'] / rss['mergekit']:.2f}x** its peak RSS; outputs "
            f"differ by at most {diff['max_abs']:.2e} absolute, {diff['max_rel']:.2e} relative to "
            f"each tensor's largest magnitude ({diff['tensors']} tensors); "
            f"**{diff['over']}** of {diff['elements']:,} elements differ by more than 1e-6 "
            f"relative, the rest by at most **{diff['rest_rel']:.2e}**. Runs (wall s): "
            + "; ".join(
                f"{route} " + ", ".join(f"{x['wall_s']:.1f}" for x in runs[route]) for route in runs
            )
            + "."
        )
    params = 2 * LLAMA["vocab_size"] * LLAMA["hidden_size"] + LLAMA["num_hidden_layers"] * (
        4 * LLAMA["hidden_size"] ** 2 + 3 * LLAMA["hidden_size"] * LLAMA["intermediate_size"]
    )
    body = f"""## merge against mergekit: the same configs, three small Llama models (issue 17)

`python -m bench.merge mergekit` — {machine()}; {version} in its own venv; median wall of
{REPEATS} fresh processes per route (warm page cache), peak RSS the largest of them.
Models: three Llama-shaped Hugging Face folders (float32, {LLAMA["num_hidden_layers"]} layers,
hidden {LLAMA["hidden_size"]}, {params / 1e6:.0f} M parameters, {params * 4 / 1e9:.2f} GB each);
model 0 the base, models 1 and 2 fine-tunes of it. Each route reads the same mergekit YAML:
`suture merge CONFIG -o OUT` and `mergekit-yaml CONFIG OUT`. linear: weights 0.5/0.3/0.2 of
the three; ties: base model 0, models 1 and 2 with weights 0.6/0.4 and density 0.5.

| method | route | wall time | peak RSS |
| --- | --- | --- | --- |
{chr(10).join(rows)}

{chr(10).join(notes)}
- Goal: at most 1e-6 relative difference on float32 (deterministic methods), faster and
  leaner than mergekit.
- TIES keeps the `int(density * n)` largest magnitudes of each task vector. Task vectors of
  float32 models (`x - b`, rounded to the ulp of `b`) hold many exactly equal magnitudes,
  and where they straddle the cut mergekit keeps whichever torch's unstable `argsort`
  happens to put first; suture keeps the first by position. The elements over 1e-6 above
  are a few per tensor, each off by about the magnitude at the cut: the mark of a different
  choice among equal magnitudes. No other element differs by more than the figure given.
"""
    write_section("merge_mergekit", body)
    print(body)
    for method in CONFIGS:
        for route in ("suture", "mergekit"):
            shutil.rmtree(output(route, method), ignore_errors=True)


if __name__ == "__main__":
    main()
