"""Shared by the benchmarks: fresh-process measurements and RESULTS.md sections."""

from __future__ import annotations

import json
import math
import platform
import re
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DATA_DIR = BENCH_DIR / "_data"
RESULTS = BENCH_DIR / "RESULTS.md"

# Runs a command in a child and reports its wall time and peak RSS (the child's own).
_MEASURE = r"""
import json, resource, subprocess, sys, time
started = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
wall = time.perf_counter() - started
if done.returncode:
    sys.stderr.write(done.stderr.decode()[-2000:]); sys.exit(done.returncode)
print(json.dumps({"wall_s": wall, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}))
"""


def measure(command: list[str], repeats: int = 5) -> dict:
    """Median wall time and peak RSS of `command`, each run in a fresh process."""
    runs = []
    for _ in range(repeats):
        done = subprocess.run(
            [sys.executable, "-c", _MEASURE, *command], capture_output=True, text=True
        )
        if done.returncode:
            raise RuntimeError(f"{command} failed:\n{done.stderr}")
        runs.append(json.loads(done.stdout))
    return {
        "wall_s": statistics.median(run["wall_s"] for run in runs),
        "wall_s_min": min(run["wall_s"] for run in runs),
        "peak_rss_bytes": max(run["peak_rss_bytes"] for run in runs),
        "repeats": repeats,
    }


def machine() -> str:
    cores = len(__import__("os").sched_getaffinity(0))
    return f"{platform.machine()}, {cores} cores, Python {platform.python_version()}"


def write_section(name: str, body: str) -> None:
    """Replaces (or appends) the section of RESULTS.md between this benchmark's markers."""
    text = (
        RESULTS.read_text()
        if RESULTS.exists()
        else "# Benchmark results\n\nWritten by the scripts in `bench/`; each section is replaced when its script runs.\n"
    )
    try:
        RESULTS.write_text(with_section(text, name, body))
    except ValueError as error:  # nothing written: the new body is printed to be kept
        sys.stderr.write(body + "\n")
        raise RuntimeError(f"RESULTS.md: {error}; the new body is printed above.") from None


def with_section(text: str, name: str, body: str) -> str:
    r"""`text` with the section `name` (between its markers) replaced by `body`, or appended.

    Raises ValueError, changing nothing, where the markers are not one pair around the
    section's own text: a section opened twice, or enclosing another section's markers
    (replacing it would delete the other's results).

    Example:
        >>> with_section("<!-- bench:a -->\nold\n<!-- /bench:a -->\n", "a", "new")
        '<!-- bench:a -->\nnew\n<!-- /bench:a -->\n'
    """
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    if "<!-- bench:" in body or "<!-- /bench:" in body:
        raise ValueError(f"the new body of {name!r} holds a section marker")
    opened, closed = text.count(start), text.count(end)
    if opened > 1 or closed > 1:
        raise ValueError(f"the section {name!r} appears more than once; keep one")
    if opened != closed:
        raise ValueError(f"the section {name!r} is opened or closed without the other marker")
    section = f"{start}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    found = pattern.search(text)
    if opened and not found:
        raise ValueError(f"the section {name!r} closes before it opens")
    inner = found.group(0)[len(start) : -len(end)] if found else ""
    if "<!-- bench:" in inner or "<!-- /bench:" in inner:
        raise ValueError(
            f"the section {name!r} encloses another section's markers; put each section's "
            f"markers around its own text"
        )
    if found:
        return pattern.sub(lambda _: section, text)
    return text.rstrip() + "\n\n" + section + "\n"


def disk_bytes_read() -> int:
    """Bytes this process has read from storage (page-cache hits excluded)."""
    with open("/proc/self/io") as io:
        return int(next(line for line in io if line.startswith("read_bytes:")).split()[1])


def folder_bytes(folder: Path) -> int:
    """The bytes of every file under `folder`."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def peak_rss_bytes() -> int:
    """This process's peak RSS. (ru_maxrss would carry over the parent's peak across fork+exec.)"""
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) * 1024


def drop_caches() -> bool:
    """Empties the page cache (root only); False where that is not permitted."""
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def run_cold_worker(module: str, route: str, *arguments: str) -> dict:
    """Drops the page cache, runs ``python -m MODULE --worker ROUTE ...`` fresh, returns its JSON."""
    cold = drop_caches()
    done = subprocess.run(
        [sys.executable, "-m", module, "--worker", route, *arguments],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    if done.returncode:
        raise RuntimeError(f"{module} {route} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["cold"] = cold
    return result


def run_routes(
    module: str, routes: Sequence[str], repeats: int, check: Callable[[], None] | None = None
) -> dict[str, list[dict]]:
    """Each route in a block of cold fresh-process runs, the block's first run discarded.

    Runs go in blocks per route because a run that directly follows the other route's
    process was measured up to 0.6 s slower on this machine (bench/partial_load.py).
    `check` runs after each block (to verify the route's output).
    """
    runs: dict[str, list[dict]] = {}
    for route in routes:
        run_cold_worker(module, route)  # discarded
        runs[route] = [run_cold_worker(module, route) for _ in range(repeats)]
        if check is not None:
            check()
    return runs


def medians(runs: dict[str, list[dict]], keys: Sequence[str]) -> dict[str, dict[str, float]]:
    return {
        route: {key: statistics.median(r[key] for r in results) for key in keys}
        for route, results in runs.items()
    }


def cache_note(runs: dict[str, list[dict]]) -> str:
    if all(r["cold"] for results in runs.values() for r in results):
        return "page cache dropped before every run"
    return "**warm page cache: dropping caches was not permitted here**"


def timed_route(route: Callable[[], None], output: Path) -> None:
    """A worker's body: clears `output`, runs `route`, prints its wall time and peak RSS as JSON."""
    import shutil
    import time

    shutil.rmtree(output, ignore_errors=True)
    started = time.perf_counter()
    route()
    print(json.dumps({"wall_s": time.perf_counter() - started, "peak_rss_bytes": peak_rss_bytes()}))


def write_adam_checkpoint(path: Path, layers: int, width: int) -> None:
    """A stock Orbax checkpoint of params plus Adam's mu and nu (random float32), once."""
    import shutil

    import numpy as np
    import orbax.checkpoint as ocp

    if (path / "_METADATA").exists():
        return
    shutil.rmtree(path, ignore_errors=True)
    rng = np.random.default_rng(0)

    def layered() -> dict:
        return {
            f"layer{i}": {
                "kernel": rng.standard_normal((width, width), dtype=np.float32),
                "bias": rng.standard_normal(width, dtype=np.float32),
            }
            for i in range(layers)
        }

    state = {
        "params": layered(),
        "opt_state": {"mu": layered(), "nu": layered()},
        "step": np.int32(1000),
    }
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path, state)
    checkpointer.wait_until_finished()


def runs_line(runs: dict[str, list[dict]], key: str = "wall_s") -> str:
    """``suture 5.1, 4.9; peer 10.2, 10.6``: every run's figure, route by route."""
    return "; ".join(
        f"{route} " + ", ".join(f"{r[key]:.1f}" for r in results) for route, results in runs.items()
    )


def orbax_load_params_only(path: object) -> dict:
    """Orbax v1's partial load: `ocp.load` with PLACEHOLDER under opt_state (its guide's way)."""
    import jax
    from orbax.checkpoint import v1 as ocp

    def placeholder(key_path, leaf):  # noqa: ANN001, ANN202
        name = jax.tree_util.keystr(key_path, simple=True, separator="/")
        return ocp.PLACEHOLDER if name.startswith("opt_state") else leaf

    tree = jax.tree.map_with_path(placeholder, ocp.metadata(path).metadata)
    return ocp.load(path, tree)


def write_hf_shards(
    folder: Path, shards: list[dict[str, tuple[int, ...]]], config: dict, dtype: str
) -> int:
    """Writes a sharded Hugging Face folder of random weights, one shard in memory at a time:
    each dict of `shards` (tensor name -> shape) is one safetensors file, beside the index and
    `config` (its ``torch_dtype`` set to `dtype`). Returns the tensors' size in bytes.

    One random block, tiled into every tensor: generation runs at memory speed, and no two
    rows of a tensor are equal (the block's length is not a multiple of any row length), so
    a wrong transpose or permutation shows in a value check.
    """
    # loaded here, as the other data makers load them: this module's timing helpers import
    # nothing beyond the standard library
    import ml_dtypes  # noqa: F401  (registers "bfloat16" as a numpy dtype name)
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    block = np.random.default_rng(0).standard_normal(1_000_003, dtype=np.float32) * 0.02
    block = block.astype(np.dtype(dtype))
    weight_map, total = {}, 0
    for number, shapes in enumerate(shards, start=1):
        tensors = {
            name: np.resize(np.roll(block, 7919 * k), shape)
            for k, (name, shape) in enumerate(shapes.items())
        }
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, folder / name, metadata={"format": "pt"})
        weight_map.update({tensor: name for tensor in tensors})
        total += sum(t.nbytes for t in tensors.values())
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (folder / "config.json").write_text(json.dumps({**config, "torch_dtype": dtype}, indent=2))
    return total


def write_safetensors_shards(
    folder: Path,
    entries: Iterable[tuple[str, tuple[int, ...], str]],
    itemsize: Mapping[str, int],
    shard_bytes: int,
    values: Callable[[str, tuple[int, ...], str, int], Any],
    config: dict,
) -> None:
    """Writes a sharded Hugging Face folder a tensor at a time with the safetensors layout
    (header, then bytes), tensors of any dtypes: `entries` are ``(name, shape, dtype)`` in
    safetensors' dtype names, a new shard starts where the next tensor would take one past
    `shard_bytes`, and ``values(name, shape, dtype, seed)`` gives each tensor's array (the
    seed is its place in the shard plus 1000 times the shard's number). The folder is
    replaced; the index and `config` are written beside the shards."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    shards: list[list[tuple[str, tuple[int, ...], str]]] = [[]]
    size = 0
    for entry in entries:
        nbytes = math.prod(entry[1]) * itemsize[entry[2]]
        if size + nbytes > shard_bytes and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append(entry)
        size += nbytes
    weight_map, total = {}, 0
    for number, shard in enumerate(shards, 1):
        filename = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape, dtype in shard:
            nbytes = math.prod(shape) * itemsize[dtype]
            header[name] = {
                "dtype": dtype,
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            offset += nbytes
            weight_map[name] = filename
        total += offset
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(folder / filename, "wb") as file:
            file.write(len(text).to_bytes(8, "little") + text)
            for seed, (name, shape, dtype) in enumerate(shard):
                file.write(values(name, shape, dtype, seed + 1000 * number).tobytes())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
