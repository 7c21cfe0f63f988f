"""One process of a 2-process stock Orbax restore onto a mesh, for tests/test_mesh_restore.py.

Usage: ``python tests/mesh_restore_worker.py PROCESS_ID PROCESS_COUNT PORT LAYOUT_JSON``.
Each process has 4 CPU devices and joins ``jax.distributed`` on 127.0.0.1:PORT, restores the
arrays of each checkpoint (``LAYOUT_JSON``: ``{"checkpoints": [path], "mesh": {axis: size},
"leaves": {name: [shape, spec]}}``) with stock Orbax onto that mesh, checks its shards
against ``values.npz`` beside them, and prints JSON: per checkpoint, the bytes TensorStore
read from files in this process, and the bytes of its shards.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    index, count, port, layout_json = sys.argv[1:5]
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax

    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=int(count),
        process_id=int(index),
        initialization_timeout=60,
    )
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    layout = json.loads(layout_json)
    mesh = jax.make_mesh(tuple(layout["mesh"].values()), tuple(layout["mesh"]))
    target = {
        name: jax.ShapeDtypeStruct(
            tuple(shape),
            np.float32,
            sharding=NamedSharding(
                mesh, P(*(tuple(e) if isinstance(e, list) else e for e in spec))
            ),
        )
        for name, (shape, spec) in layout["leaves"].items()
    }
    found = []
    for checkpoint in layout["checkpoints"]:
        expected = np.load(Path(checkpoint).parent / "values.npz")
        read_before = bytes_read()
        restored = ocp.StandardCheckpointer().restore(Path(checkpoint), target)
        read = bytes_read() - read_before
        needed = 0
        for name, array in restored.items():
            indices = set()
            for shard in array.addressable_shards:
                np.testing.assert_array_equal(np.asarray(shard.data), expected[name][shard.index])
                indices.add(tuple((s.start, s.stop) for s in shard.index))
            # a shard on two local devices: its bytes are needed once
            needed += sum(expected[name][tuple(slice(*i) for i in key)].nbytes for key in indices)
        found.append({"read": read, "needed": needed})
    print(json.dumps({"process": int(index), "checkpoints": found}))


def bytes_read() -> int:
    import tensorstore as ts

    name = "/tensorstore/kvstore/file/bytes_read"
    found = ts.experimental_collect_matching_metrics(name)
    return sum(v.get("value", 0) for m in found if m["name"] == name for v in m.get("values", []))


if __name__ == "__main__":
    main()
