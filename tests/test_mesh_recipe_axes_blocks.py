"""The built-in logical axes of tables whose scanned layers MaxText nests in blocks (Gemma 4's
local_layers on (blocks, local), its global_layer on the scan axis): a conversion for a mesh
alone gives each array the shard MaxText's sharding gives it (bench/maxtext_sharding.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import suture
from suture._sharding import shard_lengths
from tests.test_families_deepseek4 import folder  # noqa: F401  (DeepSeek-V4's tiny model)
from tests.test_mesh_writes import written_chunk

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

MESH = {"fsdp": 4, "tensor": 2}
BLOCKS = "decoder/scanned_blocks"
# MaxText 0.2.5's specs on fsdp=4,tensor=2 (bench/maxtext_sharding.py's gemma4 rows)
GEMMA4 = {
    f"{BLOCKS}/local_layers/self_attention/query/kernel": ("fsdp", None, None, "tensor", None),
    f"{BLOCKS}/local_layers/mlp/moe_block/MoeBlock_0/wi_0": (None, None, None, "fsdp", "tensor"),
    f"{BLOCKS}/local_layers/mlp/moe_block/shared_experts/wo/kernel": ("tensor", None, None, "fsdp"),
    f"{BLOCKS}/local_layers/post_ffw_norm/scale": ("tensor", None, None),
    f"{BLOCKS}/global_layer/self_attention/key/kernel": ("fsdp", None, "tensor", None),
    f"{BLOCKS}/global_layer/mlp/moe_block/MoeBlock_0/wo": (None, None, "tensor", "fsdp"),
    "token_embedder/embedding": ("tensor", "fsdp"),
}


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory) -> Path:
    hf = tmp_path_factory.mktemp("gemma4") / "hf"
    config = transformers.Gemma4TextConfig(
        vocab_size=64, hidden_size=64, intermediate_size=32, num_hidden_layers=12,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
        num_global_key_value_heads=2, attention_k_eq_v=True, hidden_size_per_layer_input=0,
        sliding_window=8, enable_moe_block=True, num_experts=4, top_k_experts=2,
        moe_intermediate_size=16,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Gemma4ForCausalLM(config).save_pretrained(hf)
    return hf


def _assert_tiles(out: Path, specs: dict, root: str = "params/params/") -> None:
    ckpt = suture.open(out)
    for path, spec in specs.items():
        shape = ckpt[root + path].shape
        assert len(shape) == len(spec), (path, shape)
        shard = shard_lengths(shape, spec, MESH)
        chunk = written_chunk(out, (root + path).replace("/", "."))
        for axis, entry in enumerate(spec):
            if entry is not None and shard[axis] < shape[axis]:  # one chunk per shard, exactly
                assert chunk[axis] == shard[axis], (path, chunk, shard)
            else:
                assert shard[axis] % chunk[axis] == 0, (path, chunk, shard)


def test_gemma4s_nested_blocks_take_maxtexts_shards(gemma4: Path, tmp_path: Path):
    out = tmp_path / "mt"
    suture.convert(
        gemma4, out, recipe="gemma4:maxtext", progress=False,
        target_sharding=suture.TargetSharding("fsdp=4,tensor=2"),
    )  # fmt: skip
    _assert_tiles(out, GEMMA4)
    # [embed_attn, layers, local_layers, q_heads, kv] = (64, 2, 5, 4, 16): shards (16, ..., 2, 16)
    query = written_chunk(out, f"params.params.{BLOCKS.replace('/', '.')}.local_layers."
                          "self_attention.query.kernel")  # fmt: skip
    assert (query[0], query[3]) == (16, 2)


def test_gemma4_unscanned_drops_the_layer_axis(gemma4: Path, tmp_path: Path):
    out = tmp_path / "mt"
    suture.convert(
        gemma4, out, recipe="gemma4:maxtext-unscanned", progress=False,
        target_sharding=suture.TargetSharding("fsdp=4,tensor=2"),
    )  # fmt: skip
    # [exp, embed_moe, mlp_moe] = (4, 64, 16) -> (-, fsdp, tensor): shards of (4, 16, 8)
    assert written_chunk(out, "params.params.decoder.layers_5.mlp.moe_block.MoeBlock_0.wi_0")[
        1:
    ] == (16, 8)


# DeepSeek-V4 on fsdp=4,expert=2 (its one KV head: MaxText builds it on no tensor axis); the
# blocks scan on MaxText's own axis name, scanned_blocks, which no rule shards
DEEPSEEK4 = {
    "params/params/decoder/scanned_blocks/layers_0/mlp/MoeBlock_0/wi_0": (
        "expert",
        None,
        "fsdp",
        None,
    ),
    # [embed_attn, scanned_blocks, q_lora]: q_lora's rule comes first and takes fsdp
    "params/params/decoder/scanned_blocks/layers_1/self_attention/wq_a/kernel": (
        None,
        None,
        "fsdp",
    ),
    "params/params/decoder/layers_0/mlp/MoeBlock_0/wo": ("expert", None, "fsdp"),
    "params/MoEBiasVar/decoder/scanned_blocks/layers_0/mlp/MoeBlock_0/gate/bias": (None, None),
    "params/Tid2EidVar/decoder/layers_1/mlp/MoeBlock_0/tid2eid": (None, None),
}


def test_deepseek4s_blocks_first_layers_and_collections_take_maxtexts_shards(
    folder: Path,  # noqa: F811
    tmp_path: Path,
):
    out = tmp_path / "mt"
    suture.convert(
        folder, out, recipe="deepseek4:maxtext", progress=False,
        target_sharding=suture.TargetSharding("fsdp=4,expert=2"),
    )  # fmt: skip
    ckpt = suture.open(out)
    mesh = {"fsdp": 4, "expert": 2}
    for path, spec in DEEPSEEK4.items():
        shape = ckpt[path].shape
        assert len(shape) == len(spec), (path, shape)
        shard = shard_lengths(shape, spec, mesh)
        chunk = written_chunk(out, path.replace("/", "."))
        for axis, entry in enumerate(spec):  # the chunks tile MaxText's shards
            assert shard[axis] % chunk[axis] == 0, (path, chunk, shard)
            assert (entry is None) == (shard[axis] == shape[axis]), (path, shard)


@pytest.fixture(scope="module")
def gemma3_whole(tmp_path_factory) -> Path:
    from tests.test_families_gemma3_multimodal import _model

    hf = tmp_path_factory.mktemp("gemma3mm") / "hf"
    _model(hf)
    return hf


def test_a_whole_multimodal_recipe_shards_its_tower_as_maxtext(gemma3_whole: Path, tmp_path):
    from tests.test_families_gemma3_multimodal import TOWER

    out = tmp_path / "mt"
    suture.convert(
        gemma3_whole, out, recipe="gemma3:maxtext-multimodal", progress=False,
        target_sharding=suture.TargetSharding("fsdp=4,tensor=2"),
    )  # fmt: skip
    block = f"{TOWER}/Transformer/encoderblock_1"
    _assert_tiles(
        out,
        {  # MaxText 0.2.5's tower (bench/maxtext_sharding.py's gemma3-multimodal rows)
            f"{block}/MultiHeadDotProductAttention_0/query/kernel": ("fsdp", "tensor", None),
            f"{block}/MultiHeadDotProductAttention_0/out/kernel": ("tensor", None, "fsdp"),
            f"{block}/MlpBlockViT_0/Dense_0/kernel": (None, None),
            "params/params/vision_encoder/VisionEmbedder_0/mm_soft_embedding_norm/scale": (
                "tensor",
            ),
        },
        root="",
    )


def test_every_builtin_tower_table_with_logical_axes_names_every_leaf():
    from suture.families._index import read_table, table_heads
    from suture.families._logical_axes import missing_leaves

    carrying = 0
    for file in table_heads():
        table = read_table(file)
        if table.get("target") != "maxtext-multimodal" or "logical_axes" not in table:
            continue
        carrying += 1
        paths = {leaf["maxtext-multimodal"] for leaf in table["leaves"]}
        assert missing_leaves(table["logical_axes"], paths) == [], file
    assert carrying >= 2


def test_a_whole_recipe_refuses_a_mesh_where_its_tower_has_no_axes(gemma3_whole: Path):
    import dataclasses
    import json

    from suture.families import get_recipe
    from suture.families._logical_axes import recipe_rules

    recipe = get_recipe("gemma3:maxtext-multimodal")
    bare = dataclasses.replace(  # a tower table as a user's copy without logical_axes
        recipe, tower_recipe=dataclasses.replace(recipe.tower_recipe, logical_axes=())
    )
    config = json.loads((gemma3_whole / "config.json").read_text())
    tree = bare.to_maxtext(suture.open(gemma3_whole).tree, config)
    with pytest.raises(suture.SurgeryError, match=r"tower table.*no logical_axes.*--sharding"):
        recipe_rules(bare, config, tree)
    from suture._paths import flatten

    rules = recipe_rules(recipe, config, tree)  # with them, a rule for every tower array
    towers = [path for path in flatten(tree) if "vision_encoder" in path]
    assert len(towers) > 20
    assert sum("vision_encoder" in pattern for pattern, _ in rules.leaves) == len(towers)
