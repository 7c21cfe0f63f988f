"""MaxText's own logical axes of a model's parameters, and their shards on a mesh (run in
MaxText's venv by bench/maxtext_sharding.py).

Usage: ``python bench/_maxtext_axes.py model_name=... [MaxText config overrides]``; prints
one line ``AXES {json}``: ``leaves`` ({'/' path: logical axes}, as the model annotates its
parameters), ``logical_axis_rules`` and ``mesh`` (the config's), and ``shards`` ({path:
shard shape on the config's mesh}, from ``nn.logical_to_mesh_sharding``, as MaxText's
training state is sharded).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main() -> None:
    import jax
    from flax import linen as nn
    from maxtext import models
    from maxtext.common.common_types import MODEL_MODE_TRAIN
    from maxtext.configs import pyconfig
    from maxtext.layers import quantizations
    from maxtext.utils import maxtext_utils

    config = pyconfig.initialize(["axes", *sys.argv[1:]])
    mesh = jax.sharding.Mesh(maxtext_utils.create_device_mesh(config), config.mesh_axes)
    quant = quantizations.configure_quantization(config)
    model = models.transformer_as_linen(config, mesh, quant=quant, model_mode=MODEL_MODE_TRAIN)
    abstract = maxtext_utils.get_abstract_param(model, config)
    logical = nn.get_partition_spec(abstract)
    shardings = nn.logical_to_mesh_sharding(logical, mesh, config.logical_axis_rules)
    is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)  # noqa: E731

    def path_of(keys) -> str:
        return "/".join(str(getattr(key, "key", key)) for key in keys)

    leaves = {
        path_of(keys): list(spec)
        for keys, spec in jax.tree_util.tree_flatten_with_path(logical, is_leaf=is_spec)[0]
    }
    shapes = {
        path_of(keys): value.shape
        for keys, value in jax.tree_util.tree_flatten_with_path(nn.unbox(abstract))[0]
    }
    shards = {
        path_of(keys): list(sharding.shard_shape(shapes[path_of(keys)]))
        for keys, sharding in jax.tree_util.tree_flatten_with_path(shardings)[0]
    }
    rules = [[name, axes] for name, axes in config.logical_axis_rules]
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
    found = {"leaves": leaves, "logical_axis_rules": rules, "mesh": sizes, "shards": shards,
             "shapes": {path: list(shape) for path, shape in shapes.items()}}  # fmt: skip
    print("AXES", json.dumps(found))


if __name__ == "__main__":
    main()
