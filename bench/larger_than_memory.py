"""Surgery on a checkpoint larger than memory, against the floors of the disk it runs on.

The source: a float32 Llama-like model (hidden 4096, intermediate 11008, vocab 32000; as
many layers as make the size asked for, default 30 GiB) in Hugging Face safetensors
shards, generated shard by shard (never more than one shard in memory).

Routes, each in a fresh process after dropping the page cache:
- plain: stack the layers for scan and cast to bfloat16, into Orbax (default budget; then
  again with ``max_memory`` of 256 MiB and 4 GiB);
- transposed: the same in MaxText's kernel layout (every matrix transposed);
- reverse: the transposed Orbax output back to Hugging Face shards (unstacked, transposed
  back, bfloat16).

Floors, in the same run: ``cp -r`` of the source (of its first shards, scaled, when the
whole copy would leave less than 15 GiB free), a cold read of the source, and an fsync'd
write of the plain output's size. Values are checked with stock Orbax and safetensors.
Everything made is deleted at the end. Run from the repository root:
``.venv/bin/python -m bench.larger_than_memory [GiB [ROUNDS]]`` (30 GiB and 2 rounds by
default: each round measures the floors and every route once; the report takes medians).
The worker sets SUTURE_TUNE_ALLOCATOR=1 (one malloc arena, as `import suture` once did).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench._common import DATA_DIR, drop_caches, machine, peak_rss_bytes, write_section

HIDDEN, INTERMEDIATE, VOCAB = 4096, 11008, 32000
SHARD_BYTES = 5 << 29  # 2.5 GiB of tensors per shard, as Hugging Face writes 7B models
FREE_MARGIN = 15 << 30  # never leave less free disk than this
ROOT = DATA_DIR / "larger_than_memory"
SOURCE, OUTPUT, REVERSE = ROOT / "source", ROOT / "orbax", ROOT / "reverse"
MATRICES = {  # name: (rows, columns) as Hugging Face stores them (out, in)
    "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
    "self_attn.k_proj.weight": (HIDDEN, HIDDEN),
    "self_attn.v_proj.weight": (HIDDEN, HIDDEN),
    "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
    "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
    "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
    "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
}
NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")
GiB = 1 << 30


def layer_count(size_gib: float) -> int:
    per_layer = 4 * (sum(r * c for r, c in MATRICES.values()) + len(NORMS) * HIDDEN)
    outer = 4 * (2 * VOCAB * HIDDEN + HIDDEN)
    return max(1, round((size_gib * GiB - outer) / per_layer))


def tensor_shapes(layers: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(layers):
        for name, shape in MATRICES.items():
            shapes[f"model.layers.{i}.{name}"] = shape
        for name in NORMS:
            shapes[f"model.layers.{i}.{name}"] = (HIDDEN,)
    shapes["model.norm.weight"] = (HIDDEN,)
    shapes["lm_head.weight"] = (VOCAB, HIDDEN)
    return shapes


def generate(layers: int) -> None:
    """Writes the shards one at a time; values: a random block, scaled per tensor."""
    import numpy as np
    from safetensors.numpy import save_file

    SOURCE.mkdir(parents=True)
    # longer than any tensor, so no tensor repeats part of itself (zstd would find it)
    block = np.random.default_rng(0).standard_normal(VOCAB * HIDDEN + 1, dtype=np.float32)
    shapes = tensor_shapes(layers)
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = 4 * int(np.prod(shape))
        if groups[-1] and size + nbytes > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    weight_map = {}
    for number, names in enumerate(groups, 1):
        filename = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        tensors = {}
        for index, name in enumerate(names):
            count = int(np.prod(shapes[name]))
            repeats = -(-count // block.size)
            values = np.tile(block, repeats)[:count] if repeats > 1 else block[:count].copy()
            values *= np.float32(1 + (number * 100 + index) / 1000)
            tensors[name] = values.reshape(shapes[name])
        save_file(tensors, str(SOURCE / filename), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, filename))
        del tensors
    total = 4 * sum(int(np.prod(shape)) for shape in shapes.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (SOURCE / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    subprocess.run(["sync"], check=True)


# ---- the routes (run in fresh processes) ----


def surgery(transposed: bool) -> dict:
    import suture

    ckpt = suture.open(SOURCE)
    layers = len(ckpt["model/layers"])

    def oriented(leaf: suture.LazyArray) -> suture.LazyArray:
        return leaf.T if transposed and leaf.ndim == 2 else leaf

    stacked = {
        name: suture.stack(
            [oriented(ckpt[f"model/layers/{i}/{name.replace('.', '/')}"]) for i in range(layers)]
        ).astype("bfloat16")
        for name in (*MATRICES, *NORMS)
    }
    return {
        "embed": ckpt["model/embed_tokens/weight"].astype("bfloat16"),
        "layers": stacked,
        "norm": ckpt["model/norm/weight"].astype("bfloat16"),
        "lm_head": oriented(ckpt["lm_head/weight"]).astype("bfloat16"),
    }


def reverse_tree() -> dict:
    import suture

    ckpt = suture.open(OUTPUT)
    layers = ckpt["layers/input_layernorm.weight"].shape[0]
    tensors = {
        "model.embed_tokens.weight": ckpt["embed"],
        "model.norm.weight": ckpt["norm"],
        "lm_head.weight": ckpt["lm_head"].T,
    }
    for i in range(layers):
        for name in (*MATRICES, *NORMS):
            leaf = ckpt[f"layers/{name}"][i]
            tensors[f"model.layers.{i}.{name}"] = leaf.T if leaf.ndim == 2 else leaf
    return tensors


def worker(route: str, max_memory: str) -> None:
    """Runs one route; prints wall, CPU seconds, baseline and peak RSS as JSON."""
    import ml_dtypes  # noqa: F401 (the libraries a save loads, loaded before the baseline)
    import tensorstore  # noqa: F401

    os.environ["SUTURE_TUNE_ALLOCATOR"] = "1"  # read when suture is imported
    import suture

    baseline = _rss_now()
    started, cpu = time.perf_counter(), _cpu_seconds()
    budget = {"max_memory": max_memory} if max_memory else {}
    if route == "reverse":
        suture.save(
            reverse_tree(),
            REVERSE,
            format="safetensors",
            max_shard_size="5GB",
            progress=False,
            **budget,
        )
        written = REVERSE
    else:
        result = suture.save(surgery(route == "transposed"), OUTPUT, progress=False, **budget)
        written = result.path
        print(f"in flight at most {result.peak_in_flight >> 20} MiB", file=sys.stderr)
    print(
        json.dumps(
            {
                "wall_s": time.perf_counter() - started,
                "cpu_s": _cpu_seconds() - cpu,
                "baseline_rss": baseline,
                "peak_rss": peak_rss_bytes(),
                "written": _size(written),
            }
        )
    )


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_now() -> int:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) * 1024


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_route(route: str, max_memory: str = "") -> dict:
    shutil.rmtree(REVERSE if route == "reverse" else OUTPUT, ignore_errors=True)
    drop_caches()
    done = subprocess.run(
        [sys.executable, "-m", "bench.larger_than_memory", "--worker", route, max_memory],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise RuntimeError(f"{route} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(route, max_memory or "default", json.dumps(result), flush=True)
    return result


# ---- floors ----


def timed(command: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (the child's) of `command`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return time.perf_counter() - started, cpu


def cp_floor(source_bytes: int) -> dict:
    """``cp -r`` of the source, or of its first shards (scaled) if the copy would not fit."""
    shards = sorted(SOURCE.glob("*.safetensors"))
    room = shutil.disk_usage(ROOT).free - FREE_MARGIN - source_bytes // 2  # the output's room
    chosen, size = [], 0
    for shard in shards:
        if size + shard.stat().st_size > room:
            break
        chosen.append(shard)
        size += shard.stat().st_size
    if not chosen:
        raise RuntimeError("no room on the disk to measure the cp floor")
    part = ROOT / "cp_part"
    if len(chosen) == len(shards):
        source = SOURCE
    else:
        part.mkdir()
        for shard in chosen:  # hard links: the same blocks on disk, no space taken
            os.link(shard, part / shard.name)
        source = part
    copy = ROOT / "cp_copy"
    drop_caches()
    wall, cpu = timed(["cp", "-r", str(source), str(copy)])
    sync_wall, _ = timed(["sync"])
    shutil.rmtree(copy)
    shutil.rmtree(part, ignore_errors=True)
    scale = source_bytes / size
    return {
        "wall_s": wall * scale,
        "cpu_s": cpu * scale,
        "sync_s": sync_wall * scale,
        "shards": len(chosen),
        "of": len(shards),
        "scaled": len(chosen) != len(shards),
    }


def cold_read() -> float:
    drop_caches()
    files = [str(p) for p in sorted(SOURCE.glob("*.safetensors"))]
    return timed(["sh", "-c", 'cat "$@" > /dev/null', "cat", *files])[0]


def fsynced_write(size: int) -> float:
    target = ROOT / "write_floor.bin"
    count = max(1, size // (64 << 20))
    wall, _ = timed(
        [
            "dd",
            "if=/dev/zero",
            f"of={target}",
            "bs=64M",
            f"count={count}",
            "conv=fsync",
            "status=none",
        ]
    )
    target.unlink()
    return wall * size / (count * (64 << 20))


# ---- checks with the stock tools ----


def check_orbax(transposed: bool) -> None:
    """Stock Orbax restores leaves of the output; they equal the source, cast."""
    import jax
    import ml_dtypes
    import numpy as np
    from orbax.checkpoint import v1 as ocp
    from safetensors import safe_open

    wanted = {"embed", "lm_head", "layers/mlp.down_proj.weight", "layers/input_layernorm.weight"}

    def pick(path, leaf):
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        return leaf if name in wanted else ocp.PLACEHOLDER

    restored = ocp.load(OUTPUT, jax.tree.map_with_path(pick, ocp.metadata(OUTPUT).metadata))
    index = json.loads((SOURCE / "model.safetensors.index.json").read_text())["weight_map"]

    def source(name: str) -> np.ndarray:
        with safe_open(str(SOURCE / index[name]), framework="numpy") as stock:
            return stock.get_tensor(name)

    def same(got: object, name: str) -> None:
        expected = source(name)
        expected = expected.T if transposed and expected.ndim == 2 else expected
        assert np.array_equal(np.asarray(got), expected.astype(ml_dtypes.bfloat16)), name

    embed = source("model.embed_tokens.weight").astype(ml_dtypes.bfloat16)
    assert np.array_equal(np.asarray(restored["embed"]), embed)
    lm_head = source("lm_head.weight")
    assert np.array_equal(
        np.asarray(restored["lm_head"]),
        (lm_head.T if transposed else lm_head).astype(ml_dtypes.bfloat16),
    )
    down = np.asarray(restored["layers"]["mlp.down_proj.weight"])
    for i in (0, down.shape[0] - 1):
        same(down[i], f"model.layers.{i}.mlp.down_proj.weight")
    same(
        restored["layers"]["input_layernorm.weight"][1 % down.shape[0]],
        f"model.layers.{1 % down.shape[0]}.input_layernorm.weight",
    )


def check_reverse() -> None:
    """The safetensors library reads the reverse output; it equals stock Orbax's restore."""
    import jax
    import numpy as np
    from orbax.checkpoint import v1 as ocp
    from safetensors import safe_open

    def pick(path, leaf):
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        return leaf if name in ("lm_head", "layers/mlp.up_proj.weight") else ocp.PLACEHOLDER

    restored = ocp.load(OUTPUT, jax.tree.map_with_path(pick, ocp.metadata(OUTPUT).metadata))
    index_file = REVERSE / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())["weight_map"] if index_file.exists() else {}

    def tensor(name: str) -> np.ndarray:
        with safe_open(str(REVERSE / index.get(name, "model.safetensors")), "numpy") as stock:
            return stock.get_tensor(name)

    assert np.array_equal(tensor("lm_head.weight"), np.asarray(restored["lm_head"]).T)
    up = np.asarray(restored["layers"]["mlp.up_proj.weight"])
    last = up.shape[0] - 1
    assert np.array_equal(tensor(f"model.layers.{last}.mlp.up_proj.weight"), up[last].T)


# ---- the run ----


def main(size_gib: float, repeats: int) -> None:
    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    layers = layer_count(size_gib)
    source_bytes = 4 * sum(int(__import__("math").prod(s)) for s in tensor_shapes(layers).values())
    free = shutil.disk_usage(ROOT).free
    if free - source_bytes * 1.55 < FREE_MARGIN:
        raise SystemExit(
            f"{source_bytes / GiB:.1f} GiB of source plus its output would leave less than "
            f"15 GiB free ({free / GiB:.1f} GiB free now); choose a smaller size."
        )
    try:
        started = time.perf_counter()
        generate(layers)
        print(
            f"generated {source_bytes / GiB:.1f} GiB in {time.perf_counter() - started:.0f} s",
            flush=True,
        )
        # The disk's speed drifts on a shared machine: each round measures the floors and
        # then every route once, and the report takes the medians of the rounds.
        rounds: list[tuple[dict, dict]] = []
        for number in range(repeats):
            shutil.rmtree(OUTPUT, ignore_errors=True)  # the last round's: room for the copy
            floors = {"cp": cp_floor(source_bytes), "read_s": cold_read()}
            print("floors", json.dumps(floors), flush=True)
            runs = {"plain": run_route("plain")}
            if number == 0:
                check_orbax(transposed=False)
            floors["write_s"] = fsynced_write(runs["plain"]["written"])
            for budget in ("256MiB", "4GiB"):
                runs[f"plain, max_memory {budget}"] = run_route("plain", budget)
            runs["transposed"] = run_route("transposed")
            if number == 0:
                check_orbax(transposed=True)
            rounds.append((floors, runs))
        shutil.rmtree(SOURCE)  # room for the reverse output (written from the transposed one)
        reverse = [run_route("reverse") for _ in range(repeats)]
        check_reverse()
        print("checked with stock Orbax and safetensors", flush=True)
        floors, runs = _medians(rounds)
        runs["reverse"] = _median_run(reverse)
        write_section(
            "larger_than_memory", report(size_gib, layers, source_bytes, floors, runs, repeats)
        )
    finally:
        shutil.rmtree(ROOT, ignore_errors=True)


def _medians(rounds: list[tuple[dict, dict]]) -> tuple[dict, dict]:
    """The floors and each route's run, as medians over the rounds (peak RSS: the largest)."""
    floors = {
        "cp": {
            **rounds[0][0]["cp"],
            **{
                key: statistics.median(r[0]["cp"][key] for r in rounds)
                for key in ("wall_s", "cpu_s", "sync_s")
            },
        },
        **{key: statistics.median(r[0][key] for r in rounds) for key in ("read_s", "write_s")},
    }
    runs = {name: _median_run([r[1][name] for r in rounds]) for name in rounds[0][1]}
    return floors, runs


def _median_run(runs: list[dict]) -> dict:
    return {
        "wall_s": statistics.median(run["wall_s"] for run in runs),
        "cpu_s": statistics.median(run["cpu_s"] for run in runs),
        "peak_rss": max(run["peak_rss"] for run in runs),
        "baseline_rss": min(run["baseline_rss"] for run in runs),
        "walls": [run["wall_s"] for run in runs],
    }


def report(
    size: float, layers: int, source_bytes: int, floors: dict, runs: dict, repeats: int
) -> str:
    cp = floors["cp"]
    gib = source_bytes / GiB
    lines = [
        f"## Larger than memory ({gib:.1f} GiB float32 Llama-like, {layers} layers)",
        "",
        f"`python -m bench.larger_than_memory {size:g}` on {machine()}, "
        f"{os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / GiB:.0f} GiB RAM; "
        f"page cache dropped before every route; medians of {repeats} "
        f"round{'s' if repeats != 1 else ''}, each measuring "
        "the floors and then every route once (the shared disk's speed drifts between runs).",
        "",
        "Floors: `cp -r` of the source "
        + (f"(measured on {cp['shards']} of {cp['of']} shards, scaled) " if cp["scaled"] else "")
        + f"{cp['wall_s']:.1f} s, {cp['cpu_s']:.1f} CPU s (+ {cp['sync_s']:.1f} s `sync`); "
        f"cold read "
        f"{floors['read_s']:.1f} s ({gib / floors['read_s']:.2f} GiB/s); fsync'd write of the "
        f"plain output's size {floors['write_s']:.1f} s.",
        "",
        "| route | wall s | vs cp -r | CPU s | CPU s / GiB | peak RSS | RSS over baseline "
        "| wall s, each run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        lines.append(
            f"| {name} | {run['wall_s']:.1f} | {run['wall_s'] / cp['wall_s']:.2f}x | "
            f"{run['cpu_s']:.1f} | {run['cpu_s'] / gib:.2f} | {run['peak_rss'] / GiB:.2f} GiB | "
            f"{(run['peak_rss'] - run['baseline_rss']) / GiB:.2f} GiB | "
            f"{', '.join(f'{wall:.1f}' for wall in run['walls'])} |"
        )
    lines += [
        "",
        "plain: stack the layers for scan + bfloat16 into Orbax; transposed: the same in "
        "MaxText's kernel layout; reverse: that Orbax output back to Hugging Face shards "
        "(bfloat16). CPU per GiB is per GiB of the float32 source. Values checked with stock "
        "Orbax (`ocp.load`) and `safetensors.safe_open`.",
        "",
        _against_goals(runs, cp["wall_s"], gib),
    ]
    return "\n".join(lines)


def _against_goals(runs: dict, cp_wall: float, gib: float) -> str:
    """Issue 18's goals, each with this run's figure and whether it was met."""

    def check(met: bool) -> str:
        return "met" if met else "NOT met"

    def over(name: str) -> float:
        return (runs[name]["peak_rss"] - runs[name]["baseline_rss"]) / GiB

    plain, transposed = runs["plain"], runs["transposed"]
    small, large = over("plain, max_memory 256MiB"), over("plain, max_memory 4GiB")
    return (
        "Against the goals of issue 18: wall within 1.0x of `cp -r`: plain "
        f"{plain['wall_s'] / cp_wall:.2f}x, transposed {transposed['wall_s'] / cp_wall:.2f}x "
        f"({check(max(plain['wall_s'], transposed['wall_s']) <= cp_wall)}); CPU s per GiB at "
        f"most 1.0 plain and 1.5 transposed: {plain['cpu_s'] / gib:.2f} and "
        f"{transposed['cpu_s'] / gib:.2f} "
        f"({check(plain['cpu_s'] / gib <= 1.0 and transposed['cpu_s'] / gib <= 1.5)}); peak "
        f"RSS under 1.5 GiB at the default budget: {plain['peak_rss'] / GiB:.2f} GiB "
        f"({check(plain['peak_rss'] < 1.5 * GiB)}); growth within the budget plus 64 MiB at "
        f"256 MiB and 4 GiB: {small * 1024:.0f} MiB and {large:.2f} GiB "
        f"({check(small <= 0.3125 and large <= 4 + 1 / 16)})."
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "")
    else:
        arguments = sys.argv[1:]
        main(
            float(arguments[0]) if arguments else 30.0,
            int(arguments[1]) if len(arguments) > 1 else 2,
        )
