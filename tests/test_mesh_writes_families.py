"""A family conversion written for a mesh: `suture.convert(..., recipe=..., target_sharding=)`
with MaxText's logical axis rules, restored by stock Orbax onto that mesh."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import suture
from tests.test_mesh_writes import written_chunk

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

RULES = """
logical_axis_rules:
  - [embed, [fsdp, sequence]]
  - [mlp, [tensor, expert]]
  - [layers, stage]
leaves:
  ".*/mlp/wo/kernel": [mlp, layers, embed]
  ".*/mlp/wi_0/kernel": [embed, layers, mlp]
"""


def test_a_maxtext_conversion_for_a_mesh_restores_onto_it(tmp_path: Path):
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    (tmp_path / "rules.yaml").write_text(RULES)
    target = suture.TargetSharding("fsdp=4,tensor=2", tmp_path / "rules.yaml")
    suture.convert(
        tmp_path / "hf", tmp_path / "mt", recipe="llama3.1:maxtext", progress=False,
        target_sharding=target,
    )  # fmt: skip
    # (mlp, layers, embed) = (96, 2, 64): shards of (48, 2, 16), one layer per chunk
    assert written_chunk(tmp_path / "mt", "params.params.decoder.layers.mlp.wo.kernel") == (
        48,
        1,
        16,
    )
    assert written_chunk(tmp_path / "mt", "params.params.decoder.layers.mlp.wi_0.kernel") == (
        16,
        1,
        48,
    )
    mesh = jax.make_mesh((4, 2), ("fsdp", "tensor"))
    kernel = jax.ShapeDtypeStruct(
        (96, 2, 64), np.float32, sharding=NamedSharding(mesh, P("tensor", None, "fsdp"))
    )
    restored = ocp.PyTreeCheckpointer().restore(
        tmp_path / "mt",
        args=ocp.args.PyTreeRestore(
            item={
                "params": {"params": {"decoder": {"layers": {"mlp": {"wo": {"kernel": kernel}}}}}}
            },
            restore_args={
                "params": {
                    "params": {
                        "decoder": {
                            "layers": {
                                "mlp": {
                                    "wo": {"kernel": ocp.ArrayRestoreArgs(sharding=kernel.sharding)}
                                }
                            }
                        }
                    }
                }
            },
            partial_restore=True,
        ),
    )
    wo = restored["params"]["params"]["decoder"]["layers"]["mlp"]["wo"]["kernel"]
    assert wo.sharding.spec == P("tensor", None, "fsdp")
    expected = suture.open(tmp_path / "mt")["params/params/decoder/layers/mlp/wo/kernel"].read()
    np.testing.assert_array_equal(np.asarray(wo), expected)
