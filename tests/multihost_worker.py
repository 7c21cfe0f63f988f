"""One process of a multi-process JAX program, as tests/test_multihost.py and bench/multihost.py run it.

Usage: ``python tests/multihost_worker.py SCENARIO PROCESS_ID PROCESS_COUNT PORT WORKDIR``.
Each process has 2 CPU devices and joins ``jax.distributed`` on 127.0.0.1:PORT; what it
measures goes to ``WORKDIR/report-SCENARIO-PROCESS_ID.json``.

Scenarios (WORKDIR holds ``source``, a checkpoint written by stock Orbax):

- ``save``: every process saves a streamed surgery of ``source`` (drop, stack, bfloat16) to
  ``lazy_out`` (and to ``out.safetensors``, which the primary writes) and a tree of globally sharded jax.Arrays to ``global_out``; then restores both
  with stock Orbax onto a global sharding, loads ``source`` with suture onto one, and loads
  the in-memory global arrays onto other shardings.
- ``kill``: as ``save``'s first step, but process 1 kills itself halfway through its blocks.
- ``surgery``: only the streamed surgery to ``lazy_out`` (for the benchmark).
- ``errors``: saves and loads that fail; the messages each process got.
- ``orbax``: the peer route of the benchmark: stock Orbax restore, the same surgery in jax,
  stock Orbax multi-process save to ``orbax_out``.
- ``remote``: for each URL of ``SUTURE_TEST_BASES``, the streamed surgery of ``BASE/source``
  and the globally sharded tree saved to ``BASE/lazy_out`` and ``BASE/global_out``; gs:// results restored by
  stock Orbax onto a global sharding, every result read back by suture.
- ``remote_kill``: ``kill`` to ``SUTURE_TEST_BASES``' first URL ``/killed_out``.
- ``lone``: only process 0 calls save (to ``alone_out``); how soon it hears why.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
from pathlib import Path


def main() -> None:
    scenario, index, count, port, workdir = sys.argv[1:6]
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=int(count),
        process_id=int(index),
        heartbeat_timeout_seconds=HEARTBEATS.get(scenario, 60),
        initialization_timeout=60,
    )
    report: dict = {"process": int(index), "count": int(count)}
    started = time.perf_counter()
    SCENARIOS[scenario](Path(workdir), report)
    report["seconds"] = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report["cpu_seconds"] = usage.ru_utime + usage.ru_stime
    report["peak_rss_bytes"] = peak_rss_bytes()
    name = f"report-{scenario}-{index}.json"
    (Path(workdir) / name).write_text(json.dumps(report))


def peak_rss_bytes() -> int:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited from the parent)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def io_bytes(driver: str = "file") -> tuple[int, int]:
    """(bytes read, bytes written) by TensorStore's `driver` kvstore in this process so far."""
    import tensorstore as ts

    totals = []
    for metric in ("bytes_read", "bytes_written"):
        name = f"/tensorstore/kvstore/{driver}/{metric}"
        found = ts.experimental_collect_matching_metrics(name)
        totals.append(
            sum(v.get("value", 0) for m in found if m["name"] == name for v in m.get("values", []))
        )
    return totals[0], totals[1]


def surgery(source: Path):
    import suture
    from suture import rules

    return suture.transform(
        [
            rules.drop("opt_state"),
            rules.stack(r"params/layer(?P<i>\d+)", into="params/layers"),
            rules.cast("params", "bfloat16"),
        ],
        source,
    )


def expected_surgery(source: Path) -> dict:
    import numpy as np

    import suture

    ckpt = suture.open(source)
    count = sum(1 for path in suture.flatten(ckpt.tree) if path.startswith("params/layer"))
    layers = np.stack([ckpt[f"params/layer{i}"].read() for i in range(count)])
    head = ckpt["params/head"].read()
    return {"layers": layers.astype("bfloat16"), "head": head.astype("bfloat16")}


def global_tree():
    """Arrays sharded over every device of every process (one replicated)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    values = global_values()

    def place(array, spec):
        sharding = NamedSharding(mesh, spec)
        return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

    return {
        "rows": place(values["rows"], PartitionSpec("x")),
        "columns": place(values["columns"], PartitionSpec(None, "x")),
        "replicated": place(values["replicated"], PartitionSpec()),
        "step": np.int64(7),
    }


def global_values() -> dict:
    import numpy as np

    rng = np.random.default_rng(1)
    return {
        "rows": rng.standard_normal((256, 256), dtype=np.float32),
        "columns": rng.integers(-(2**31), 2**31 - 1, size=(64, 256), dtype=np.int32),
        "replicated": rng.standard_normal((8, 8), dtype=np.float32),
    }


def save_scenario(workdir: Path, report: dict) -> None:
    import suture

    before = io_bytes()
    result = suture.save(surgery(workdir / "source"), workdir / "lazy_out", chunk_bytes=16 << 10)
    after = io_bytes()
    report["lazy"] = {
        "read": after[0] - before[0],
        "written": after[1] - before[1],
        "result_bytes": result.bytes_written,
    }
    before = after
    suture.save(global_tree(), workdir / "global_out")
    after = io_bytes()
    report["global"] = {"read": after[0] - before[0], "written": after[1] - before[1]}
    suture.save(surgery(workdir / "source"), workdir / "out.safetensors", format="safetensors")
    report["restored"] = restore_with_orbax(workdir)
    report["load"] = load_sharded(workdir / "source")
    report["reshard"] = reshard_in_memory()


def restore_with_orbax(workdir: Path) -> dict:
    """Stock Orbax restores both outputs onto global shardings; shards compared with the expected."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    rows = NamedSharding(mesh, PartitionSpec("x"))

    def same(array, expected) -> bool:
        return all(
            np.array_equal(np.asarray(shard.data), expected[shard.index])
            for shard in array.addressable_shards
        )

    checks = {}
    expected = expected_surgery(workdir / "source")
    values = global_values()
    with ocp.StandardCheckpointer() as checkpointer:
        target = {
            "params": {
                name: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=rows)
                for name, value in expected.items()
            }
        }
        restored = checkpointer.restore(workdir / "lazy_out", target)
        for name, value in expected.items():
            checks[f"lazy/{name}"] = same(restored["params"][name], value)
        target = {
            name: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=rows)
            for name, value in values.items()
        }
        target["step"] = 0
        restored = checkpointer.restore(workdir / "global_out", target)
    for name, value in values.items():
        checks[f"global/{name}"] = same(restored[name], value)
    checks["global/step"] = int(restored["step"]) == 7
    return checks


def load_sharded(source: Path) -> dict:
    """suture.load and stock Orbax restore of the source onto global shardings, one leaf at a time.

    Reports, per leaf, whether suture's shards are right and the bytes each route read here.
    ``layer0`` is split by rows in shards smaller than a stored chunk (so several local
    devices need the same chunk); ``head`` by columns.
    """
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import NamedSharding, PartitionSpec

    import suture

    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    ckpt = suture.open(source)
    specs = {"layer0": PartitionSpec("x"), "head": PartitionSpec(None, "x")}
    found = {}
    for name, spec in specs.items():
        leaf = ckpt[f"params/{name}"]
        wanted = jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=NamedSharding(mesh, spec))
        before = io_bytes()[0]
        loaded = suture.load(ckpt, {"params": {name: wanted}}, partial=True)["params"][name]
        middle = io_bytes()[0]
        with ocp.PyTreeCheckpointer() as checkpointer:
            args = ocp.ArrayRestoreArgs(sharding=wanted.sharding, global_shape=leaf.shape)
            checkpointer.restore(
                source,
                args=ocp.args.PyTreeRestore(
                    item={"params": {name: wanted}},
                    restore_args={"params": {name: args}},
                    partial_restore=True,
                ),
            )
        found[name] = {
            "read": middle - before,
            "orbax_read": io_bytes()[0] - middle,
            "correct": all(
                np.array_equal(np.asarray(shard.data), leaf[shard.index].read())
                for shard in loaded.addressable_shards
            ),
        }
    return found


def reshard_in_memory() -> dict:
    """In-memory global arrays loaded onto other shardings (and dtypes) with suture.load."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    import suture

    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    tree = global_tree()
    values = global_values()
    columns = NamedSharding(mesh, PartitionSpec(None, "x"))
    target = {
        "rows": jax.ShapeDtypeStruct((256, 256), np.float32, sharding=columns),
        "columns": jax.ShapeDtypeStruct(
            (64, 256), np.float32, sharding=NamedSharding(mesh, PartitionSpec())
        ),
        "replicated": jax.ShapeDtypeStruct(
            (8, 8), np.float32, sharding=NamedSharding(mesh, PartitionSpec("x"))
        ),
        "step": 0,
    }
    loaded = suture.load(tree, target)
    checks = {}
    for name in ("rows", "columns", "replicated"):
        array = loaded[name]
        checks[name] = array.sharding == target[name].sharding and all(
            np.array_equal(np.asarray(shard.data), values[name].astype(np.float32)[shard.index])
            for shard in array.addressable_shards
        )
    checks["step"] = loaded["step"] == 7
    return checks


def remote_scenario(workdir: Path, report: dict) -> None:
    """Both trees saved to each bucket by every process; read back by Orbax and suture."""
    import numpy as np

    import suture

    expected = expected_surgery(workdir / "source")
    values = global_values()
    for base in os.environ["SUTURE_TEST_BASES"].split():
        driver = base.split("://")[0].replace("gs", "gcs")
        before = io_bytes(driver)  # the source too is in the bucket (uploaded by the test)
        result = suture.save(surgery(f"{base}/source"), f"{base}/lazy_out", chunk_bytes=16 << 10)
        middle = io_bytes(driver)
        suture.save(global_tree(), f"{base}/global_out")
        after = io_bytes(driver)
        checks = {}
        if base.startswith("gs://"):
            checks.update(restore_remote_with_orbax(base, expected, values))
        lazy = suture.open(f"{base}/lazy_out")
        for name, value in expected.items():
            checks[f"suture/lazy/{name}"] = bool(
                np.array_equal(lazy[f"params/{name}"].read(), value)
            )
        held = suture.open(f"{base}/global_out")
        for name, value in values.items():
            checks[f"suture/global/{name}"] = bool(np.array_equal(held[name].read(), value))
        report[base] = {
            "lazy": {
                "read": middle[0] - before[0],
                "written": middle[1] - before[1],
                "result_bytes": result.bytes_written,
            },
            "global": {"written": after[1] - middle[1]},
            "checks": checks,
        }


def restore_remote_with_orbax(base: str, expected: dict, values: dict) -> dict:
    """Stock Orbax restores both gs:// outputs onto a global sharding in this process group."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp
    from etils import epath
    from jax.sharding import NamedSharding, PartitionSpec

    rows = NamedSharding(jax.make_mesh((jax.device_count(),), ("x",)), PartitionSpec("x"))

    def same(array, value) -> bool:
        return all(
            np.array_equal(np.asarray(shard.data), value[shard.index])
            for shard in array.addressable_shards
        )

    checks = {}
    with ocp.StandardCheckpointer() as checkpointer:
        target = {
            "params": {
                name: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=rows)
                for name, value in expected.items()
            }
        }
        restored = checkpointer.restore(epath.Path(f"{base}/lazy_out"), target)
        for name, value in expected.items():
            checks[f"orbax/lazy/{name}"] = same(restored["params"][name], value)
        target = {
            name: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=rows)
            for name, value in values.items()
        }
        target["step"] = 0
        restored = checkpointer.restore(epath.Path(f"{base}/global_out"), target)
    for name, value in values.items():
        checks[f"orbax/global/{name}"] = same(restored[name], value)
    return checks


def safetensors_scenario(workdir: Path, report: dict) -> None:
    """A sharded safetensors folder saved by every process: each writes its share of shards."""
    import suture
    from suture import rules

    tree = suture.transform(
        [rules.drop("opt_state"), rules.cast("params", "bfloat16")], workdir / "source"
    )
    for destination in [str(workdir / "sharded_st"), *os.environ["SUTURE_TEST_BASES"].split()]:
        if "://" in destination:
            destination = f"{destination}/sharded_st"
        result = suture.save(tree, destination, format="safetensors", max_shard_size="160KiB")
        report[destination] = result.bytes_written


def lone_scenario(workdir: Path, report: dict) -> None:
    """Process 0 alone calls the collective save: it must hear why within the grace period."""
    import suture

    if jax_process_index() == 0:
        started = time.monotonic()
        try:
            suture.save(surgery(workdir / "source"), workdir / "alone_out")
            report["error"] = "no error"
        except suture.SurgeryError as error:
            report["error"] = str(error)
        report["waited"] = time.monotonic() - started
    else:
        time.sleep(float(os.environ["SUTURE_COLLECTIVE_GRACE"]) + 3)


def kill_scenario(workdir: Path, report: dict, destination: str | None = None) -> None:
    """Process 1 dies (SIGKILL) while computing its first block of layers; nothing may be committed."""
    import suture

    tree = surgery(workdir / "source")
    if jax_process_index() == 1:

        def die(values):
            time.sleep(0.2)  # while process 0 writes its blocks
            os.kill(os.getpid(), signal.SIGKILL)
            return values

        layers = tree["params"]["layers"]
        tree["params"]["layers"] = suture.map(
            die, layers, shape=layers.shape, dtype=layers.dtype, elementwise=True
        )
    suture.save(tree, destination or workdir / "killed_out", chunk_bytes=16 << 10)
    report["returned"] = True


def kill_cleanup_scenario(workdir: Path, report: dict) -> None:
    """Process 1 dies; process 0 must raise and clean up within one barrier timeout, long
    before JAX's heartbeat check (30 s here) would abort it."""
    started = time.monotonic()
    try:
        kill_scenario(workdir, report)
    except Exception as error:  # the survivor's error, and what it left behind
        report["error"] = str(error)
        report["waited"] = time.monotonic() - started
        report["left"] = sorted(p.name for p in workdir.iterdir() if "killed_out" in p.name)
        name = f"report-kill_cleanup-{jax_process_index()}.json"
        (workdir / name).write_text(json.dumps(report))
        os._exit(0)  # jax.distributed's shutdown would wait for the dead process


def remote_kill_scenario(workdir: Path, report: dict) -> None:
    base = os.environ["SUTURE_TEST_BASES"].split()[0]
    kill_scenario(workdir, report, f"{base}/killed_out")


def surgery_scenario(workdir: Path, report: dict) -> None:
    """Only the streamed surgery of ``source`` to ``lazy_out``, with default options (bench)."""
    import suture

    before = io_bytes()
    suture.save(surgery(workdir / "source"), workdir / "lazy_out", progress=False)
    after = io_bytes()
    report["io"] = {"read": after[0] - before[0], "written": after[1] - before[1]}


def errors_scenario(workdir: Path, report: dict) -> None:
    """Saves and loads that fail: the message each process gets, and what is left behind."""
    import jax
    import numpy as np

    import suture

    def message(call) -> str:
        try:
            call()
        except suture.SurgeryError as error:
            return str(error)
        return "no error"

    tree = surgery(workdir / "source")
    if jax.process_index() == 1:
        tree["params"]["bad"] = {1, 2}  # a set: no checkpoint can hold it
    report["one_fails"] = message(lambda: suture.save(tree, workdir / "bad_out"))
    sharded = global_tree()
    report["safetensors"] = message(
        lambda: suture.save(sharded, workdir / "out.safetensors", format="safetensors")
    )
    report["verify"] = message(lambda: suture.save(sharded, workdir / "verify_out", verify=True))
    report["numpy_target"] = message(
        lambda: suture.load({"rows": sharded["rows"]}, {"rows": np.ndarray})
    )
    os.environ["SUTURE_BARRIER_TIMEOUT"] = "2"
    if jax.process_index() == 0:  # process 1 never joins this save
        report["alone"] = message(
            lambda: suture.save(surgery(workdir / "source"), workdir / "alone")
        )
    else:
        time.sleep(3)


def jax_process_index() -> int:
    import jax

    return jax.process_index()


def orbax_scenario(workdir: Path, report: dict) -> None:
    """The peer of the streamed surgery: stock Orbax restore, the edit in jax, stock save."""
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from jax.sharding import NamedSharding, PartitionSpec

    import suture

    mesh = jax.make_mesh((jax.device_count(),), ("x",))
    ckpt = suture.open(workdir / "source")
    shapes = {path: (leaf.shape, leaf.dtype) for path, leaf in suture.flatten(ckpt.tree).items()}
    layer_count = sum(1 for path in shapes if path.startswith("params/layer"))

    def spec(shape):
        return (
            PartitionSpec("x") if shape and shape[0] % jax.device_count() == 0 else PartitionSpec()
        )

    target = {
        "params": {
            path.split("/")[1]: jax.ShapeDtypeStruct(
                shape, dtype, sharding=NamedSharding(mesh, spec(shape))
            )
            for path, (shape, dtype) in shapes.items()
            if path.startswith("params/")
        }
    }
    before = io_bytes()
    with ocp.PyTreeCheckpointer() as checkpointer:
        restore_args = jax.tree.map(
            lambda s: ocp.ArrayRestoreArgs(
                sharding=s.sharding, global_shape=s.shape, dtype=s.dtype
            ),
            target,
        )
        params = checkpointer.restore(
            workdir / "source",
            args=ocp.args.PyTreeRestore(
                item=target, restore_args=restore_args, partial_restore=True
            ),
        )["params"]
    layers = jnp.stack([params[f"layer{i}"].astype(jnp.bfloat16) for i in range(layer_count)])
    result = {"params": {"layers": layers, "head": params["head"].astype(jnp.bfloat16)}}
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(workdir / "orbax_out", result)
    after = io_bytes()
    report["io"] = {"read": after[0] - before[0], "written": after[1] - before[1]}


SCENARIOS = {
    "save": save_scenario,
    "kill": kill_scenario,
    "surgery": surgery_scenario,
    "errors": errors_scenario,
    "orbax": orbax_scenario,
    "remote": remote_scenario,
    "remote_kill": remote_kill_scenario,
    "lone": lone_scenario,
    "safetensors": safetensors_scenario,
    "kill_cleanup": kill_cleanup_scenario,
}
# Short only where a test waits for JAX to notice a killed process.
HEARTBEATS = {"kill": 5, "remote_kill": 5, "kill_cleanup": 30}

if __name__ == "__main__":
    main()
