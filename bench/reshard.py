"""A stacked MaxText checkpoint restored onto an 8-device CPU mesh (fsdp=8): from suture's
default layout, and from the layouts `suture reshard` and MaxText's own
`reshard_checkpoint.py` write for that mesh (issue 42).

The checkpoint: a MaxText Llama 3.1 model's parameters (scanned, ``params/params/...``), random
float32, of the shapes MaxText's ``llama3.1-8b`` builds with the widths below (`--layers`
sets the size: 18 layers, 3.03 GiB; 4 layers, 1.06 GiB), written by `suture.save` (its default
chunks: one layer per chunk). The target: each parameter's sharding in MaxText's training
state on ``fsdp=8`` (its logical axes, as the llama3.1 table's ``logical_axes`` records them,
under MaxText's default rules: embed over fsdp, the rest replicated).

Routes, each a fresh process (page cache dropped before each where permitted):
- restore: stock Orbax `StandardCheckpointer().restore` onto the mesh, from each layout, by 4
  processes of 2 CPU devices each under `jax.distributed` (as 4 hosts would); bytes read are
  TensorStore's own count of the file bytes each process read, wall the slowest process's.
- reshard: `suture reshard SRC OUT --mesh fsdp=8 --sharding RULES`, streamed under the default
  1 GiB budget; beside it MaxText 0.2.5's `reshard_checkpoint.py` (in `--maxtext-venv`, 8
  simulated CPU devices, ``ici_fsdp_parallelism=8``, float32) on the same checkpoint.

Run from the repository root: `.venv/bin/python -m bench.reshard --layers 18 --maxtext-venv
/tmp/mtvenv` (`--repeats N`; `--keep` keeps the data in bench/_data).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench._common import DATA_DIR, drop_caches, machine, measure, write_section

EMBED, MLP, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 2048, 4096, 16, 8, 128, 32768
SOURCE = DATA_DIR / "reshard_source"
RESHARDED = DATA_DIR / "reshard_output"
PEER_OUTPUT = DATA_DIR / "reshard_peer_output"  # reshard_checkpoint.py writes OUT/0/items
RULES_FILE = DATA_DIR / "reshard_rules.json"
MESH = "fsdp=8"
DEVICES = 8
PROCESSES = 4
ROOT = "params/params/"


def shapes(layers: int) -> dict[str, tuple[int, ...]]:
    """MaxText's scanned Llama 3.1 parameters (below params/params) at these widths."""
    return {
        "token_embedder/embedding": (VOCAB, EMBED),
        "decoder/decoder_norm/scale": (EMBED,),
        "decoder/logits_dense/kernel": (EMBED, VOCAB),
        "decoder/layers/self_attention/query/kernel": (EMBED, layers, HEADS, HEAD_DIM),
        "decoder/layers/self_attention/key/kernel": (EMBED, layers, KV_HEADS, HEAD_DIM),
        "decoder/layers/self_attention/value/kernel": (EMBED, layers, KV_HEADS, HEAD_DIM),
        "decoder/layers/self_attention/out/kernel": (HEADS, layers, HEAD_DIM, EMBED),
        "decoder/layers/mlp/wi_0/kernel": (EMBED, layers, MLP),
        "decoder/layers/mlp/wi_1/kernel": (EMBED, layers, MLP),
        "decoder/layers/mlp/wo/kernel": (MLP, layers, EMBED),
        "decoder/layers/pre_self_attention_layer_norm/scale": (EMBED, layers),
        "decoder/layers/post_self_attention_layer_norm/scale": (EMBED, layers),
    }


def rules() -> dict:
    """A --sharding file: the llama3.1 table's logical axes under MaxText's default rules."""
    from suture.families import get_recipe
    from suture.families._logical_axes import MAXTEXT_AXIS_RULES

    axes = dict(get_recipe("llama3.1:maxtext").logical_axes)
    return {
        "logical_axis_rules": [[name, mesh] for name, mesh in MAXTEXT_AXIS_RULES],
        "leaves": {re.escape(ROOT + path): list(axes[path]) for path in shapes(1)},
    }


def specs(layers: int) -> dict[str, tuple]:
    """Each parameter's mesh-axis spec on `MESH` (suture's reading of `rules`)."""
    from suture._sharding import ShardingRules

    def on_mesh(entry):  # the rules' mesh axes the mesh lacks have size 1: left out
        axes = [a for a in ((entry,) if isinstance(entry, str) else entry or ()) if a == "fsdp"]
        return tuple(axes) if axes else None

    read = ShardingRules.from_data(rules())
    return {
        path: tuple(on_mesh(entry) for entry in read.spec_for(ROOT + path, len(shape)))
        for path, shape in shapes(layers).items()
    }


def write_source(layers: int) -> None:
    marker = SOURCE / "bench-layers.txt"
    if marker.exists() and marker.read_text() == str(layers):
        return
    shutil.rmtree(SOURCE, ignore_errors=True)
    DATA_DIR.mkdir(exist_ok=True)
    import numpy as np

    import suture

    rng = np.random.default_rng(0)
    flat = {}
    for path, shape in shapes(layers).items():
        if "/layers/" in path:  # one random member per layer, stacked lazily on axis 1
            member = shape[:1] + shape[2:]
            flat[ROOT + path] = suture.stack(
                [rng.standard_normal(member, dtype=np.float32) for _ in range(layers)], axis=1
            )
        else:
            flat[ROOT + path] = rng.standard_normal(shape, dtype=np.float32)
    tree = suture.unflatten({**flat, "step": 0})
    suture.save(tree, SOURCE, progress=False)
    marker.write_text(str(layers))


def _target(layers: int) -> dict:
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import suture

    mesh = jax.make_mesh((DEVICES,), ("fsdp",))
    flat = {
        ROOT + path: jax.ShapeDtypeStruct(
            shape, np.float32, sharding=NamedSharding(mesh, P(*specs(layers)[path]))
        )
        for path, shape in shapes(layers).items()
    }
    return suture.unflatten(flat)


def _tensorstore_bytes_read() -> int:
    import tensorstore as ts

    name = "/tensorstore/kvstore/file/bytes_read"
    found = ts.experimental_collect_matching_metrics(name)
    return sum(v.get("value", 0) for m in found if m["name"] == name for v in m.get("values", []))


def restore_worker(index: str, port: str, path: str, layers: str) -> None:
    """One of `PROCESSES` processes restoring `path`'s parameters onto the fsdp=8 mesh."""
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=PROCESSES,
        process_id=int(index),
        initialization_timeout=120,
    )
    import orbax.checkpoint as ocp

    import suture

    target = _target(int(layers))
    before, started = _tensorstore_bytes_read(), time.perf_counter()
    restored = ocp.PyTreeCheckpointer().restore(
        Path(path).absolute(),
        args=ocp.args.PyTreeRestore(
            item=target,
            restore_args=jax.tree.map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding), target),
            partial_restore=True,  # the parameters (not the step)
        ),
    )
    arrays = list(suture.flatten(restored).values())
    for array in arrays:
        array.block_until_ready()
    wall = time.perf_counter() - started
    needed = 0
    for array in arrays:  # a shard two local devices hold is needed once
        shards = {str(shard.index): shard.data.nbytes for shard in array.addressable_shards}
        needed += sum(shards.values())
    read = _tensorstore_bytes_read() - before
    print("RESULT", json.dumps({"wall_s": wall, "read": read, "needed": needed}), flush=True)


def restore(path: Path, layers: int) -> dict:
    """The restore by `PROCESSES` processes: the slowest wall, the most bytes one read."""
    cold = drop_caches()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES // PROCESSES}",
        "JAX_PLATFORMS": "cpu",
    }
    command = [sys.executable, "-m", "bench.reshard", "--restore-worker"]
    processes = [
        subprocess.Popen(
            [*command, str(i), str(port), str(path), str(layers)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for i in range(PROCESSES)
    ]
    reports = []
    for process in processes:
        output, _ = process.communicate(timeout=1800)
        if process.returncode != 0:
            raise RuntimeError(output[-3000:])
        line = next(line for line in output.splitlines() if line.startswith("RESULT "))
        reports.append(json.loads(line.removeprefix("RESULT ")))
    return {
        "wall_s": max(r["wall_s"] for r in reports),
        "read": max(r["read"] for r in reports),
        "needed": max(r["needed"] for r in reports),
        "cold": cold,
    }


def reshard_suture() -> dict:
    shutil.rmtree(RESHARDED, ignore_errors=True)
    RULES_FILE.write_text(json.dumps(rules()))
    cold = drop_caches()
    command = [sys.executable, "-m", "suture", "reshard", str(SOURCE), str(RESHARDED),
               "--mesh", MESH, "--sharding", str(RULES_FILE), "--no-progress"]  # fmt: skip
    return {**measure(command, repeats=1), "cold": cold}


def reshard_maxtext(python: Path, layers: int) -> dict:
    shutil.rmtree(PEER_OUTPUT, ignore_errors=True)
    cold = drop_caches()
    command = [
        str(python), "-m", "maxtext.checkpoint_conversion.reshard_checkpoint",
        "model_name=llama3.1-8b", "override_model_config=True", f"base_emb_dim={EMBED}",
        f"base_mlp_dim={MLP}", f"base_num_query_heads={HEADS}", f"base_num_kv_heads={KV_HEADS}",
        f"head_dim={HEAD_DIM}", f"vocab_size={VOCAB}", f"base_num_decoder_layers={layers}",
        "scan_layers=True", f"load_parameters_path={SOURCE.absolute()}",
        f"base_output_directory={PEER_OUTPUT.absolute()}", "weight_dtype=float32",
        "skip_jax_distributed_system=True", f"ici_fsdp_parallelism={DEVICES}", "hardware=cpu",
        "run_name=reshard", f"--simulated_cpu_devices_count={DEVICES}",
    ]  # fmt: skip
    log = DATA_DIR / "reshard_peer.log"
    started = time.perf_counter()
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = code = os.waitstatus_to_exitcode(status)
    found = {"wall_s": time.perf_counter() - started, "peak_rss_bytes": usage.ru_maxrss * 1024}
    if code:  # recorded, and the other routes still run
        how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        found["failed"] = (
            f"{how} after {found['wall_s']:.0f} s, at {found['peak_rss_bytes'] / (1 << 30):.1f} GiB peak RSS"
        )
    return {**found, "cold": cold}


def chunk_of(folder: Path, path: str) -> tuple[int, ...]:
    import tensorstore as ts

    kvstore = {"driver": "ocdbt", "base": f"file://{folder.absolute()}", "path": path}
    try:  # suture writes zarr3; Orbax's default may be zarr v2
        metadata = ts.open({"driver": "zarr3", "kvstore": kvstore}).result().spec().to_json()
        return tuple(metadata["metadata"]["chunk_grid"]["configuration"]["chunk_shape"])
    except ValueError:
        metadata = ts.open({"driver": "zarr", "kvstore": kvstore}).result().spec().to_json()
        return tuple(metadata["metadata"]["chunks"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--layers", type=int, default=18)
    parser.add_argument("--maxtext-venv", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--section", default="reshard", help="RESULTS.md section to write")
    parser.add_argument("--restore-worker", nargs=4)
    arguments = parser.parse_args()
    if arguments.restore_worker:
        restore_worker(*arguments.restore_worker)
        return
    layers = arguments.layers
    write_source(layers)
    runs: dict[str, list[dict]] = {"reshard": [], "peer": [], "default": [], "resharded": []}
    peer = arguments.maxtext_venv is not None
    if peer:
        runs["peer_resharded"] = []
    for _ in range(arguments.repeats):  # alternated, so that drift hits every route alike
        runs["reshard"].append(reshard_suture())
        print("reshard", runs["reshard"][-1], flush=True)
        if peer:
            runs["peer"].append(reshard_maxtext(arguments.maxtext_venv / "bin" / "python", layers))
            print("peer", runs["peer"][-1], flush=True)
        runs["default"].append(restore(SOURCE, layers))
        print("default", runs["default"][-1], flush=True)
        runs["resharded"].append(restore(RESHARDED, layers))
        print("resharded", runs["resharded"][-1], flush=True)
        if peer and "failed" not in runs["peer"][-1]:
            runs["peer_resharded"].append(restore(PEER_OUTPUT / "0" / "items", layers))
            print("peer_resharded", runs["peer_resharded"][-1], flush=True)
    text = report({k: v for k, v in runs.items() if v}, layers)
    write_section(arguments.section, text)
    print(text)
    if not arguments.keep:
        for folder in (SOURCE, RESHARDED, PEER_OUTPUT):
            shutil.rmtree(folder, ignore_errors=True)


def report(runs: dict[str, list[dict]], layers: int) -> str:
    import math

    gib = 1 << 30
    failed = [r["failed"] for r in runs.get("peer", []) if "failed" in r]
    runs = {
        route: kept
        for route, results in runs.items()
        if (kept := [r for r in results if "failed" not in r])
    }
    median = {
        route: {key: statistics.median(r[key] for r in results) for key in results[0]}
        for route, results in runs.items()
    }
    cold = all(r["cold"] for results in runs.values() for r in results)
    size = sum(math.prod(shape) for shape in shapes(layers).values()) * 4
    kernel = "params.params.decoder.layers.mlp.wi_0.kernel"
    lines = [
        "## reshard: a stacked MaxText checkpoint restored onto an 8-device CPU mesh (issue 42)",
        "",
        f"`python -m bench.reshard --layers {layers} --maxtext-venv /tmp/mtvenv` — "
        f"{machine()}; fresh processes, "
        f"{'page cache dropped before each' if cold else '**warm page cache**'}, "
        f"{len(runs['default'])} run(s) of each route, alternated, medians. Input: MaxText "
        f"Llama 3.1's scanned parameters ({layers} layers, embed {EMBED}, mlp {MLP}, "
        f"{HEADS}/{KV_HEADS} heads of {HEAD_DIM}, vocab {VOCAB}), random float32, "
        f"{size / gib:.2f} GiB, in suture's default layout (one layer per chunk). Target: each "
        f"parameter's sharding in MaxText's training state on fsdp={DEVICES} (embed over "
        f"fsdp), restored by stock Orbax in {PROCESSES} `jax.distributed` processes of "
        f"{DEVICES // PROCESSES} CPU devices each (as {PROCESSES} hosts would); bytes read: "
        f"TensorStore's count of each process's file reads (the most one process read).",
        "",
        "| restore onto fsdp=8 (stock Orbax) | wi_0 chunk | read per process | per device "
        "| of what it needs | wall |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    layouts = [
        ("default", "suture's default layout", SOURCE),
        ("resharded", "after `suture reshard --mesh fsdp=8`", RESHARDED),
        ("peer_resharded", "after MaxText's `reshard_checkpoint.py`", PEER_OUTPUT / "0" / "items"),
    ]
    for route, label, folder in layouts:
        if route not in median:
            continue
        read, needed = median[route]["read"], median[route]["needed"]
        lines.append(
            f"| {label} | {chunk_of(folder, kernel)} | {read / gib:.3f} GiB | "
            f"{read / (DEVICES // PROCESSES) / gib:.3f} GiB | {read / needed:.2f}x | "
            f"{median[route]['wall_s']:.1f} s |"
        )
    lines += [
        "",
        "| reshard | wall | peak RSS |",
        "| --- | --- | --- |",
        f"| `suture reshard` (streamed, default 1 GiB budget) | {median['reshard']['wall_s']:.1f} s "
        f"| {median['reshard']['peak_rss_bytes'] / gib:.2f} GiB |",
    ]
    if failed:
        lines.append(
            f"| MaxText's `reshard_checkpoint.py` (8 simulated devices, float32) | {failed[-1]} | |"
        )
    if "peer" in median:
        lines.append(
            f"| MaxText's `reshard_checkpoint.py` (8 simulated devices, float32) | "
            f"{median['peer']['wall_s']:.1f} s | {median['peer']['peak_rss_bytes'] / gib:.2f} GiB |"
        )
    lines += [
        "",
        "- Bytes read are the stored (compressed) bytes, hence under 1x where a process "
        "reads only its shards; from the default layout (chunks of up to 16 MiB, across "
        "several processes' rows) each process reads whole chunks for its quarter of the rows.",
        "- Runs (wall s): "
        + "; ".join(
            f"{route} {[round(r['wall_s'], 1) for r in results]}" for route, results in runs.items()
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
